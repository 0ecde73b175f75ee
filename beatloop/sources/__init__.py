"""The built-in data source kinds (``folder``, ``npz``, ``csv``, ``parquet``,
``tfds``, ``tfrecord``), written as a plugin's would be: they import only beatloop's public
surface (``docs/api.md``).

Each kind is a module: a ``beatloop.DataSource`` subclass with a ``name``, an attrs
``Config`` of its parameters and ``load(seed, batch_size)``; the in-memory ones hand
their arrays to ``beatloop.datasets.split_arrays``, the streamed ones share
``stream.py``. The built-in plugin (``beatloop/plugins/builtin.py``) registers them
through the ``register_data_sources`` hook, as a plugin registers its own. Nothing is
imported with this package: each module is imported by name. Names this package had
when it was a module (``load_data``, ``split_arrays``, ...) are answered, deprecated.
"""

from beatloop.moved import moved_names

__getattr__ = moved_names(__name__)
