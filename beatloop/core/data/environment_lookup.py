"""Environments named by a recipe's config: the class registered under a name, made
with its parameters given as ``NAME=VALUE`` text (the ``dqn`` recipe's ``env`` and
``env_settings``).

The plugins' registry sits above the engine and the built-ins (its built-in plugin
registers the ``dqn`` recipe, which makes its environment here), so this module never
imports it: the registry's module hands this one its lookup (``use_lookup``) when it is
imported, as ``beatloop.make_environment``, ``beatloop.fit`` and the command line do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from beatloop.core.data.environment import Environment
from beatloop.core.failures.errors import ConfigError
from beatloop.core.schedule.config import make_config, parse_settings

#: A name's class (a ConfigError naming the known ones when there is none).
Lookup = Callable[[str], type[Environment] | None]

_lookup: Lookup | None = None


def use_lookup(lookup: Lookup | None) -> None:
    """Find environments by ``lookup`` (the registry's, plugins' included) from now on;
    ``None``: none until a registry hands its lookup again."""
    global _lookup
    _lookup = lookup


def environment_class(name: str) -> type[Environment]:
    """The environment class registered as ``name``; a ConfigError naming the known
    ones (and the closest) when there is none."""
    found = _lookup(name) if _lookup is not None else None
    if found is None:
        raise ConfigError(
            f"no environment {name!r} is known yet: environments are found through "
            "beatloop's registry, which beatloop.make_environment, beatloop.fit and the "
            "command line load"
        )
    return found


def make_environment(name: str, settings: Sequence[str] = ()) -> Environment:
    """The environment ``name`` configured by ``settings`` (``["length=12"]``), each
    value converted by its config field's type; bad ones are a ConfigError naming the
    environment and the field."""
    cls = environment_class(name)
    owner = f"environment {name!r} (its parameters set by env_settings)"
    bad = [text for text in settings if "=" not in text]
    if bad:
        raise ConfigError(f"env_settings takes NAME=VALUE items, got {bad[0]!r}")
    overrides = parse_settings(settings, cls.Config, owner)
    return cls(make_config(cls.Config, overrides, owner))
