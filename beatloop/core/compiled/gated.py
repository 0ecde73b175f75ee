"""A gated entry's turn in the training step: its condition asked (``only_if``), then
its update applied now, only where the condition holds, or summed until its N-th turn
(``accumulate``); and, at an epoch's end, the sums left applied.

Whether each turn updated is counted in the metrics (``<beat>_updates``).
"""

from __future__ import annotations

import tensorflow as tf

from beatloop.core.compiled.applying import apply_gradients, loss_scale
from beatloop.core.compiled.conditional import (
    apply_when,
    counted,
    global_gradients,
    global_loss,
    guarded_variables,
    holds,
)


def asked(group, models, batch, random, state, turn, gathering) -> tf.Tensor:
    """Whether ``group``'s condition holds at this turn (``turn``: the beats' losses,
    gradients and weight on this replica): its function given the models, the batch
    and, if it takes them, the turn's loss and gradients, the global batch's (a group's:
    dicts by beat name)."""
    losses, gradients, weight = turn
    beats = group.beats
    loss = {b.name: global_loss(x, weight) for b, x in zip(beats, losses, strict=True)}
    grads = {}
    if group.condition.arity == 4:
        grads = {
            b.name: global_gradients(g, loss_scale(b.optimizer))
            for b, g in zip(beats, gradients, strict=True)
        }
    if group.forward_fn is None:  # a lone beat: its own loss and gradients
        loss, grads = loss[beats[0].name], grads.get(beats[0].name)
    return holds(
        group.condition, models, batch, random=random, state=state, loss=loss, gradients=grads,
        gathering=gathering,
    )  # fmt: skip


def unless(holds_now: tf.Tensor | None, value: tf.Tensor) -> tf.Tensor:
    """``value`` where the condition holds, zero where not (a turn that updates nothing
    has nothing to check); as it is without a condition."""
    if holds_now is None:
        return value
    return tf.where(holds_now, value, tf.zeros_like(value))


def gated_update(group, gradients, holds_now, rows, metrics) -> tf.Tensor:
    """An entry's update at one turn as its ``only_if`` (``holds_now``) and
    ``accumulate`` say (``rows``: the global batch's rows); whether it updated."""
    guarded = guarded_variables(group.beats)
    sums = group.accumulators
    if sums is None:
        applied = apply_when(holds_now, lambda: apply_gradients(group, gradients), guarded)
    else:
        sums.add(gradients, rows, holds_now)
        due = tf.greater_equal(sums.turns, group.accumulate)
        apply = sums.applying(lambda grads: apply_gradients(group, grads, summed=True))
        applied = apply_when(due, apply, [*guarded, *sums.variables])
    metrics.count_updates(group.beats, counted(applied))
    return applied


def flush_sums(groups, metrics) -> tuple[tf.Tensor]:
    """Apply what each accumulating entry of ``groups`` has summed (on one replica)."""
    for group in groups:
        sums = group.accumulators
        if sums is None:
            continue
        apply = sums.applying(lambda grads, g=group: apply_gradients(g, grads, summed=True))
        guarded = [*guarded_variables(group.beats), *sums.variables]
        applied = apply_when(tf.greater(sums.turns, 0), apply, guarded)
        metrics.count_updates(group.beats, counted(applied))
    return (tf.constant(0),)
