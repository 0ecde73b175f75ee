"""Data source kinds by name: the class the ``KIND`` of ``--data KIND:PATH`` names.

The plugins' registry sits above this wing (its built-in plugin imports the recipes,
which import the built-in data), so this module never imports it. The registry hands
it its lookup instead (``use_lookup``) as soon as its module is imported, which every
way in does first (``beatloop.load_data``, ``beatloop.fit``, the command line); with no
lookup handed, the built-in kinds are what a name can find.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from beatloop.core.errors import ConfigError, did_you_mean
from beatloop.sources.base import DataSource


@attrs.frozen
class Lookup:
    """How the registry finds kinds: ``kind(name)`` the class (or a ``ConfigError``
    naming the known ones), ``names()`` the known names, sorted."""

    kind: Callable[[str], type[DataSource]]
    names: Callable[[], list[str]]


_lookup: Lookup | None = None


def use_lookup(lookup: Lookup | None) -> None:
    """Find kinds by ``lookup`` (the registry's, plugins' included) from now on;
    ``None``: the built-in kinds only again."""
    global _lookup
    _lookup = lookup


def built_in() -> dict[str, type[DataSource]]:
    """The kinds beatloop ships, by name (their modules imported on this call: two of
    them import TensorFlow)."""
    from beatloop.sources.csv import CsvSource
    from beatloop.sources.folder import FolderSource
    from beatloop.sources.npz import NpzSource
    from beatloop.sources.tfrecord import TfrecordSource

    return {cls.name: cls for cls in (FolderSource, CsvSource, NpzSource, TfrecordSource)}


def source_class(name: str) -> type[DataSource]:
    """The data source kind registered as ``name``; a ``ConfigError`` naming the known
    ones (and the closest) when there is none."""
    if _lookup is not None:
        return _lookup.kind(name)
    kinds = built_in()
    if name in kinds:
        return kinds[name]
    raise ConfigError(
        f"no data source kind {name!r}{did_you_mean(name, kinds)}; known kinds: "
        f"{', '.join(sorted(kinds))} (plugins' kinds are found once beatloop.plugins.registry "
        "is imported, as beatloop.load_data, beatloop.fit and the command line do)"
    )


def source_names() -> list[str]:
    """The known kinds' names, sorted."""
    return _lookup.names() if _lookup is not None else sorted(built_in())
