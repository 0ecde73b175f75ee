"""The ``bl_distill_broken`` entry point: a module that fails to import, as a plugin does
whose dependency is missing. beatloop must skip it with a warning and load the rest."""

import bl_distill_missing_dependency  # no such package: the import fails  # noqa: F401

import beatloop


@beatloop.hookimpl
def register_recipes():
    return []
