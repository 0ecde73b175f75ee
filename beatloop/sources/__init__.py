"""The data sources wing: where ``--data KIND:PATH`` and ``beatloop.load_data`` find
data. ``base.py`` says what a kind is (``DataSource``, ``SourceConfig``); each built-in
kind is a module (``folder``, ``npz``, ``csv``, ``tfrecord``), the in-memory ones handing
their arrays to ``arrays.split_arrays``, the streamed ones sharing ``stream.py``;
``registry.py`` finds a kind by name, ``named.py`` makes the named data into batches,
``recorded.py`` and ``identity.py`` read again and fingerprint a run's data, and
``digits.py`` holds the built-in data sets. To add a kind, subclass
``beatloop.DataSource`` (a ``name``, an attrs ``Config``, ``load(seed, batch_size)``) and
return the class from a plugin's ``register_data_sources`` hook (or call
``beatloop.register_data_source``); a built-in kind is a new module here, listed in
``registry.built_in``. Nothing is imported with this package: each module is imported
by name.
"""
