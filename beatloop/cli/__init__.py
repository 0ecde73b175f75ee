"""The ``beatloop`` command: ``list``, ``show``, ``run``, ``compare``, ``export``,
``evaluate``, ``data``.

One module per command (``cmd_*.py``: its options, ``add_command``, and what it does,
``run``), and the shared parts: ``parser`` (the parser of every command), ``app``
(``main``), ``options`` (help format, options several commands take), ``failure`` (one
``beatloop: error: ...`` line and an exit code per failure, in the command line's
``spelling``), ``version`` (``--version``). TensorFlow is imported only by the command
that runs (and ``list`` only on a cache miss), after its log level is set.

``main`` (the command line from Python: ``main(["run", "gan"])`` returns the exit code)
is public (``docs/api.md``); the rest of this package is internal.
"""

from beatloop.cli.app import main
from beatloop.cli.parser import build_parser

#: The older name of ``build_parser`` (docs/hooks.py builds the help pages with it).
_parser = build_parser

__all__ = ["main"]
