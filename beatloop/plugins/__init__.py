"""Plugins: pluggy hooks, the recipe registry, and the built-in callbacks."""
