"""Data named by kind and path (--data KIND:PATH): loaded, fingerprinted, read again."""
