"""beatloop's pluggy hooks. One project name, ``beatloop``, marks hooks, names the
plugin manager and is the entry-point group third-party packages declare."""

from __future__ import annotations

import pluggy

PROJECT = "beatloop"
ENTRY_POINT_GROUP = PROJECT
#: Set to 1 (true, yes, on) to load the built-in plugin only, no entry point.
DISABLE_AUTOLOAD = "BEATLOOP_DISABLE_PLUGIN_AUTOLOAD"

hookspec = pluggy.HookspecMarker(PROJECT)
"""Marks the hook specifications below (beatloop's own; plugins do not use it)."""

hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marks a plugin's hook implementations: decorate a module-level function named as one of
the hooks below (``@beatloop.hookimpl`` over ``def register_recipes(): ...``) in the module
the plugin's ``beatloop`` entry point names. A marked function whose name or arguments
match no hook is refused when the plugin loads."""


@hookspec
def register_recipes() -> list[type]:
    """Return the Recipe classes this plugin adds (subclasses of ``beatloop.Recipe``)."""


@hookspec
def register_callbacks() -> list[type]:
    """Return Callback classes a run can name (each sets ``callback_name``)."""


@hookspec
def register_data_sources() -> list[type]:
    """Return DataSource classes (subclasses of ``beatloop.DataSource``, each with a
    ``name``) that ``--data NAME:PATH`` can name."""


@hookspec
def register_environments() -> list[type]:
    """Return Environment classes (subclasses of ``beatloop.Environment``, each with a
    ``name``) that a recipe's ``env`` setting can name (the ``dqn`` recipe's)."""
