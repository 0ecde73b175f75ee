"""What goes wrong, in words: beatloop's exceptions, warnings and exit codes."""
