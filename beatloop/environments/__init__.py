"""The environments wing: episodic tasks in TensorFlow ops that a recipe (``dqn``,
``ppo``) steps inside its compiled training step. ``base.py`` says what an environment is
(``Environment``), ``kinds.py`` holds the built-in ``chain`` and ``cartpole``, and
``registry.py`` makes the environment a recipe's config names. To add one, subclass
``beatloop.Environment`` (a ``name``, an attrs ``Config``, its ``reset``/``observe``/
``step`` methods) and return the class from a plugin's ``register_environments`` hook (or
call ``beatloop.register_environment``); a built-in one is a class in ``kinds.py``,
listed in its ``BUILT_IN``. Nothing is imported with this package: each module is
imported by name.
"""
