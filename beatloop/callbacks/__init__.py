"""The built-in callbacks, written as a plugin's: they import only beatloop's public surface."""
