"""The built-in environments (``chain``, ``cartpole``), written as a plugin's would be:
they import only beatloop's public surface (``docs/api.md``). Each is a
``beatloop.Environment`` subclass in ``kinds.py`` (a ``name``, an attrs ``Config``, its
``reset``/``observe``/``step`` methods), registered by the built-in plugin through the
``register_environments`` hook. Nothing is imported with this package.
"""
