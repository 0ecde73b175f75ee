"""Built-in recipes, one module each; registered through beatloop's own plugin hook."""
