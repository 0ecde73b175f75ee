"""One training step and one validation step on one batch (Keras's ``one_step_on_data``).

A step is a plain callable of ``(batch, step number)`` that returns its checks (see
:mod:`beatloop.core.numerics`) and the number of examples in the batch; it touches no
counter. :class:`~beatloop.core.loop.CompiledLoop` runs K of them per compiled call.
The pieces are small on purpose: one beat's gradients, their transform, their update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import keras
import tensorflow as tf

from beatloop.core.batches import leading_dimension
from beatloop.core.binding import BoundBeat, BoundSchedule
from beatloop.core.errors import ScheduleError
from beatloop.core.metrics import StepMetrics
from beatloop.core.numerics import beat_checks, check_finite, no_checks
from beatloop.core.replicas import on_replicas, replica_view
from beatloop.core.user_code import call_user

Batch = Mapping[str, tf.Tensor]


class TrainStep:
    """Every beat of a bound schedule in order on one batch, then the metrics.

    With a ``strategy`` the beats run on every replica (see :mod:`beatloop.core.replicas`)
    and their checks and batch sizes are summed over replicas. ``debug`` (eager mode)
    stops before a non-finite update is applied.
    """

    def __init__(
        self,
        bound: BoundSchedule,
        metrics: StepMetrics,
        update_metrics: Callable,
        *,
        debug: bool = False,
        strategy: tf.distribute.Strategy | None = None,
    ):
        self.bound = bound
        self.metrics = metrics
        self.update_metrics = update_metrics
        self.debug = debug
        self.strategy = strategy

    def __call__(self, batch: Batch, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(checks, examples)`` of one step; ``step`` is its number (for ``every``)."""
        return on_replicas(self.strategy, self.on_replica, batch, step)

    def on_replica(self, batch: Batch, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        size = leading_dimension(batch)
        share, random = replica_view(self.strategy, self.bound.random, size)
        outputs, checks = {}, []
        for beat in self.bound.beats:
            if beat.every == 1:
                outputs[beat.name], row = self.run_beat(beat, batch, size, share, random, step)
            else:
                row = tf.cond(
                    tf.equal(step % beat.every, 0),
                    lambda beat=beat: self.run_beat(beat, batch, size, share, random, step)[1],
                    lambda: tf.zeros([2]),
                )
            checks.append(row)
        call_user(self.update_metrics, "metric update", None, self.metrics.metrics, batch, outputs)
        return tf.stack(checks), size

    def run_beat(self, beat: BoundBeat, batch, size, share, random, step):
        """One beat, ``repeat`` times: gradients, transform, update, constraint, loss
        metric. Returns the last repeat's outputs and the beat's row of checks."""
        losses, squares, outputs = [], [], {}
        scaled = loss_scale(beat.optimizer) is not None
        for _ in range(beat.repeat):
            loss, outputs, grads = beat_gradients(beat, self.bound.models, batch, share, random)
            if self.debug:
                check_finite(beat.name, loss, grads, step, scaled)
            losses.append(loss)
            # Under loss scaling an overflowing gradient is expected now and then: the
            # optimizer skips that update and lowers the scale, so only the loss counts.
            if not scaled:
                squares.extend(tf.reduce_sum(tf.square(g)) for g in grads)
            apply_update(beat, grads)
            self.metrics.losses[beat.name].update_state(loss, sample_weight=size)
        return outputs, beat_checks(losses, squares)


def beat_gradients(beat: BoundBeat, models, batch, share, random):
    """One beat's loss, outputs and (loss-scaled) gradients of the variables it updates.
    On a replica the loss is weighted by the replica's share of the global batch."""
    variables = list(beat.variables)
    with tf.GradientTape() as tape:
        loss, outputs = beat.forward(models, batch, random=random)
        weighted = loss if share is None else loss * share.weight
        scaled = beat.optimizer.scale_loss(weighted)
    grads = tape.gradient(scaled, variables)
    missing = [v.path for v, g in zip(variables, grads, strict=True) if g is None]
    if missing:  # the bind-time probe normally finds these first
        raise ScheduleError(
            [f"beat {beat.name!r}: loss gives no gradient to {path!r}" for path in missing]
        )
    return loss, outputs, grads


def apply_update(beat: BoundBeat, grads) -> None:
    """Transform the gradients, apply them with the beat's optimizer, then map the
    updated variables through the beat's constraint."""
    variables = list(beat.variables)
    if beat.transform is not None:
        grads = transformed(beat.transform, grads, loss_scale(beat.optimizer))
    beat.optimizer.apply(grads, variables)
    if beat.constraint is not None:
        for variable in variables:
            variable.assign(beat.constraint(variable))


def loss_scale(optimizer) -> tf.Variable | None:
    """The current loss scale of a loss-scaling optimizer, ``None`` for any other."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.dynamic_scale
    return None


def transformed(transform: Callable, grads, scale) -> list:
    """Apply a gradient transform (clipping) to true gradients: under loss scaling,
    unscale first and scale back after (the scale is a power of two: both exact), so
    the optimizer's own unscaling and overflow check still hold."""
    if scale is None:
        return transform(grads)
    true = [g / tf.cast(scale, g.dtype) for g in grads]
    return [g * tf.cast(scale, g.dtype) for g in transform(true)]


class ValidationStep:
    """Every beat's loss on one batch with all models in inference mode, then the
    metrics; no gradient, no update."""

    def __init__(
        self,
        bound: BoundSchedule,
        metrics: StepMetrics,
        update_metrics: Callable,
        *,
        strategy: tf.distribute.Strategy | None = None,
    ):
        self.bound = bound
        self.metrics = metrics
        self.update_metrics = update_metrics
        self.strategy = strategy

    def __call__(self, batch: Batch, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return on_replicas(self.strategy, self.on_replica, batch, step)

    def on_replica(self, batch: Batch, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        size = leading_dimension(batch)
        _, random = replica_view(self.strategy, self.bound.random, size)
        outputs = {}
        for beat in self.bound.beats:
            loss, outputs[beat.name] = beat.forward(
                self.bound.models, batch, training=False, random=random
            )
            self.metrics.losses[beat.name].update_state(loss, sample_weight=size)
        call_user(self.update_metrics, "metric update", None, self.metrics.metrics, batch, outputs)
        return no_checks(0), size
