"""The NaN/Inf guard's words and its eager check.

Every training step hands back its *checks*: a float32 ``[beats, 2]`` tensor holding, per
beat, its loss and the sum of squares of its gradients (summed over the beat's repeats
and over replicas; zero for a beat that did not run). All finite means all is well: the
compiled loop tests that with one reduction per step and stops at the first step that
fails, and :func:`describe_checks` names the beat and the value, instead of the step
branching around every update.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tensorflow as tf

from beatloop.core.errors import NumericsError


def beat_checks(losses: Sequence[tf.Tensor], squares: Sequence[tf.Tensor]) -> tf.Tensor:
    """One beat's row of the checks: its summed loss and summed gradient squares."""
    return tf.stack([tf.add_n(list(losses)), tf.add_n(list(squares)) if squares else 0.0])


def no_checks(beats: int) -> tf.Tensor:
    """The checks of a step that checked nothing (all finite)."""
    return tf.zeros([beats, 2])


def describe_checks(beats: Sequence, checks) -> str:
    """Words for the first non-finite entry of a step's checks (losses first, then
    gradient norms); ``beats`` are the bound beats, in schedule order."""
    rows = list(zip(beats, checks, strict=True))
    for beat, row in rows:
        if not math.isfinite(float(row[0])):
            summed = f" (summed over its {beat.repeat} repeats)" if beat.repeat > 1 else ""
            return f"beat {beat.name!r} produced a non-finite loss ({float(row[0])}){summed}"
    for beat, row in rows:
        if not math.isfinite(float(row[1])):
            norm = math.sqrt(float(row[1])) if float(row[1]) >= 0 else float("nan")
            return f"beat {beat.name!r} produced a non-finite gradient global norm ({norm})"
    return "no non-finite value"


def check_finite(beat_name: str, loss, grads, step, loss_scaled: bool) -> None:
    """Eager-only check (debug mode): stop at the first non-finite loss or gradient norm,
    before the update is applied (under loss scaling the gradients may overflow: the
    optimizer skips those updates, so only the loss is checked)."""
    value = float(loss)
    if not math.isfinite(value):
        raise NumericsError(
            f"beat {beat_name!r} produced a non-finite loss {value} at step {int(step)}"
        )
    if loss_scaled:
        return
    norm = float(tf.linalg.global_norm(grads))
    if not math.isfinite(norm):
        raise NumericsError(
            f"beat {beat_name!r} produced a non-finite gradient norm {norm} at step "
            f"{int(step)} (loss {value})"
        )
