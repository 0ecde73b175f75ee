"""Recipe state: the variables a recipe owns that are not models (``Recipe.build_state``),
built once and checked, and described for the run record and ``beatloop show``."""

from __future__ import annotations

from collections.abc import Mapping

import keras
import tensorflow as tf

from beatloop.core.failures.errors import ConfigError

_VARIABLES = (tf.Variable, keras.Variable)


def built_state(recipe, label: str) -> dict[str, tf.Variable]:
    """The recipe's state from its ``build_state()`` (called once, in the caller's
    strategy scope), each entry checked: a name and a non-trainable variable. ``None``
    means none, as ``{}`` does."""
    state = recipe.build_state()
    if state is None:
        return {}
    if not isinstance(state, Mapping):
        raise ConfigError(
            f"the build_state() of {label} must return a dict of name -> tf.Variable, got "
            f"{type(state).__name__}; for a recipe without state return {{}} or None"
        )
    for name, variable in state.items():
        _check_entry(label, name, variable)
    return dict(state)


def _check_entry(label: str, name, variable) -> None:
    """Refuse a state entry that is not a named, non-trainable variable."""
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"the build_state() of {label} names an entry {name!r}: names are strings"
        )
    if not isinstance(variable, _VARIABLES):
        raise ConfigError(
            f"the build_state() of {label} gives {name!r} a {type(variable).__name__}; each entry "
            f"must be a tf.Variable (e.g. tf.Variable(tf.zeros([100, 4]), trainable=False)), "
            "so that compiled steps can assign it and checkpoints hold it"
        )
    if variable.trainable:
        raise ConfigError(
            f"the build_state() of {label} gives {name!r} a trainable variable; recipe state is "
            "not trained by any beat: make it with trainable=False (a variable to train "
            "belongs in a model)"
        )


def state_record(state: Mapping[str, tf.Variable]) -> dict[str, dict]:
    """Each state variable's shape and dtype, by name (what the run record holds)."""
    return {
        name: {"shape": list(variable.shape), "dtype": tf.as_dtype(variable.dtype).name}
        for name, variable in state.items()
    }


def describe_state(state: Mapping[str, tf.Variable]) -> list[str]:
    """One line per state variable: ``name: shape dtype``."""
    return [
        f"{name}: {tuple(entry['shape'])} {entry['dtype']}"
        for name, entry in state_record(state).items()
    ]
