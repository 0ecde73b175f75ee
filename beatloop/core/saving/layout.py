"""Whether a checkpoint's optimizers fit the optimizers a run was rebuilt with, said
before anything is read: another optimizer class, a learning-rate schedule where the
run trained with a number (Keras keeps a number as a variable, a schedule as none), or
an optimizer built for other variables is named, never reported as an unreadable
checkpoint. Models are compared by the run record (``record.py``)."""

from __future__ import annotations

from collections.abc import Mapping

import keras
import tensorflow as tf

from beatloop.core.failures.errors import CheckpointError

#: The end of a variable's key in a checkpoint.
_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def refuse_other_optimizers(path: str, optimizers: Mapping) -> None:
    """A CheckpointError naming each optimizer whose variables the checkpoint ``path``
    holds otherwise: refused, not read as damaged."""
    found = optimizer_differences(dict(tf.train.list_variables(path)), optimizers)
    if found:
        raise CheckpointError(
            f"checkpoint {path} does not fit this run's optimizers: {'; '.join(found)}. "
            "Rebuild the run with the optimizers it trained with (restore and evaluate "
            "take optimizers= as fit does)"
        )


def optimizer_differences(
    stored: Mapping[str, list], optimizers: Mapping[str, keras.optimizers.Optimizer]
) -> list[str]:
    """What differs between each optimizer's variables in a checkpoint (``stored``: its
    variables' keys and shapes, ``tf.train.list_variables``) and in ``optimizers``, the
    run's (built): one line per optimizer that does not fit."""
    found = []
    for name, optimizer in optimizers.items():
        prefix = f"optimizers/{name}/"
        theirs = {
            key[len(prefix) : -len(_VALUE)]: shape
            for key, shape in stored.items()
            if key.startswith(prefix) and key.endswith(_VALUE)
        }
        if not theirs:
            continue  # a part the checkpoint lacks is the record's to name
        problem = _difference(theirs, optimizer)
        if problem:
            found.append(f"optimizer {name!r} {problem}")
    return found


def _difference(theirs: Mapping[str, list], optimizer) -> str | None:
    stored_rate = any(key.split("/")[-1] == "_learning_rate" for key in theirs)
    schedule = _schedule(optimizer)
    if stored_rate and schedule is not None:
        return (
            "trained with a learning rate that is a number; it is a schedule "
            f"({type(schedule).__name__}) now"
        )
    if not stored_rate and schedule is None and _has_rate_variable(optimizer):
        return "trained with a learning-rate schedule; its learning rate is a number now"
    ours = sorted(tuple(variable.shape) for variable in optimizer.variables)
    stored = sorted(tuple(shape) for shape in theirs.values())
    if ours != stored:
        return (
            f"has {len(stored)} variable(s) in the checkpoint but {len(ours)} now "
            f"({type(optimizer).__name__}): another kind of optimizer, or one of another "
            "configuration, than the run trained with"
        )
    return None


def _inner(optimizer):
    """A loss-scaling optimizer's own optimizer; any other as it is."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def _schedule(optimizer) -> keras.optimizers.schedules.LearningRateSchedule | None:
    rate = getattr(_inner(optimizer), "_learning_rate", None)
    return rate if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) else None


def _has_rate_variable(optimizer) -> bool:
    rate = getattr(_inner(optimizer), "_learning_rate", None)
    return rate is not None and hasattr(rate, "assign")
