"""The built-in recipes, one module each (helpers beside them), written as a plugin's
would be: they import only beatloop's public surface (``docs/api.md``) and each other.
The built-in plugin (``beatloop/plugins/builtin.py``) registers them through the
``register_recipes`` hook. ``beatloop.recipes`` is the public function listing every
registered recipe: importing this package does not rebind it (``beatloop._Beatloop``).
"""
