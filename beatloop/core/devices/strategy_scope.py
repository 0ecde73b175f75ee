"""What a run under a distribution strategy refuses before its first step.

Models and optimizers the user passes must have been made inside ``strategy.scope()``
(their variables are then the strategy's), else a ``ConfigError`` says where to build
them; TensorFlow's own error comes only at the first update, as a ``ValueError``
printing the variable's values, or a ``RuntimeError`` about mixed strategies. A beat or
group with ``every`` above 1 is a ``ScheduleError`` on several replicas: its update
would sit in a conditional inside each replica, and TensorFlow refuses the optimizer's
cross-replica sum there (a ``RuntimeError`` about ``merge_call``).
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import tensorflow as tf

from beatloop.core.failures.errors import ConfigError, ScheduleError


def check_made_in_scope(
    strategy: tf.distribute.Strategy | None,
    built: Mapping[str, keras.Layer],
    models: Mapping | None,
    optimizers: Mapping | None,
    label: str,
) -> None:
    """Refuse, in one ``ConfigError``, every model or optimizer the user passed
    (``models``, ``optimizers``) whose variables were made outside ``strategy``'s scope;
    ``built`` are the run's models (a passed path is loaded in the scope). Nothing to
    check without a strategy; a model not built yet is built in the scope by the run."""
    if strategy is None:
        return
    models = {name: built[name] for name, given in (models or {}).items()
              if name in built and isinstance(given, keras.Layer)}  # fmt: skip
    optimizers = optimizers or {}
    problems = [
        f"{kind} {name!r} (its variable {path!r})"
        for kind, parts in (("model", models), ("optimizer", optimizers))
        for name, part in parts.items()
        if (path := _outside(strategy, part)) is not None
    ]
    if problems:
        raise ConfigError(
            f"{label}: {'; '.join(problems)} "
            f"{'was' if len(problems) == 1 else 'were'} made outside the distribution "
            "strategy's scope, so its variables are not the strategy's; make the models "
            "and optimizers you pass inside `with strategy.scope():` (or pass a model as "
            "a .keras path, which the run loads inside the scope)"
        )


def _outside(strategy: tf.distribute.Strategy, part) -> str | None:
    """The path of ``part``'s first variable made outside ``strategy``'s scope, if any."""
    if isinstance(part, keras.Layer):
        variables = part.weights
    elif isinstance(part, keras.optimizers.Optimizer):
        variables = part.variables
    else:  # not a part at all: refused by name and type where parts are replaced
        return None
    for variable in variables:
        handle = getattr(variable, "value", variable)  # a Keras variable's tf.Variable
        if isinstance(handle, tf.Variable) and not strategy.extended.variable_created_in_scope(
            handle
        ):
            return getattr(variable, "path", None) or handle.name
    return None


def check_every(strategy: tf.distribute.Strategy | None, bounds, label: str) -> None:
    """Refuse, in one ``ScheduleError``, every entry with ``every`` above 1 in the bound
    schedules (``bounds``: one per phase) when ``strategy`` has several replicas."""
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return
    entries = {group.name: group.every for bound in bounds for group in bound.groups}
    problems = [
        f"entry {name!r} runs every {every} steps, which a distribution strategy of "
        f"{strategy.num_replicas_in_sync} replicas cannot run (TensorFlow refuses the "
        "optimizer's sum over replicas inside the step's conditional); give it every=1, "
        "or train on one device"
        for name, every in entries.items()
        if every > 1
    ]
    if problems:
        raise ScheduleError(problems, f"{label}: the schedule")
