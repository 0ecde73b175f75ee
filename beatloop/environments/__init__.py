"""The built-in environments (``chain``, ``cartpole``), written as a plugin's would be:
they import only beatloop's public surface (``docs/api.md``). Each is a
``beatloop.Environment`` subclass in ``kinds.py`` (a ``name``, an attrs ``Config``, its
``reset``/``observe``/``step`` methods), registered by the built-in plugin through the
``register_environments`` hook. Nothing is imported with this package. The name it had
when it was a module (``make_environment``) is answered, deprecated.
"""

from beatloop.moved import moved_names

__getattr__ = moved_names(__name__)
