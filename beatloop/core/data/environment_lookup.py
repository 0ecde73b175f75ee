"""Environments named by a recipe's config: the class registered under a name, made
with its parameters given as ``NAME=VALUE`` text (the ``dqn`` recipe's ``env`` and
``env_settings``).

The plugins' registry sits above this wing and is not imported here: its built-in
plugin registers the ``dqn`` recipe, whose module imports this one. Instead the
registry's module hands this one its lookup (``use_lookup``) when it is imported; until
the registry is filled, the built-in environments are what a name can find.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from beatloop.core.config import make_config, parse_settings
from beatloop.core.errors import ConfigError, did_you_mean
from beatloop.environments.base import Environment

#: A name's class, or ``None`` when the lookup has no registry to ask (yet).
Lookup = Callable[[str], type[Environment] | None]

_lookup: Lookup | None = None


def use_lookup(lookup: Lookup | None) -> None:
    """Find environments by ``lookup`` (the registry's, plugins' included) from now on;
    ``None``: the built-in ones only again."""
    global _lookup
    _lookup = lookup


def environment_class(name: str) -> type[Environment]:
    """The environment class registered as ``name``; a ConfigError naming the known
    ones (and the closest) when there is none."""
    found = _lookup(name) if _lookup is not None else None
    if found is not None:
        return found
    from beatloop.environments.kinds import BUILT_IN

    built_in = {cls.name: cls for cls in BUILT_IN}
    if name in built_in:
        return built_in[name]
    raise ConfigError(
        f"no environment {name!r}{did_you_mean(name, built_in)}; known environments: "
        f"{', '.join(sorted(built_in))} (those plugins add are found once beatloop's "
        "registry is loaded, as beatloop.fit('dqn', ...) and the command line do)"
    )


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
