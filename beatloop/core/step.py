"""The training and validation steps, and the loop that runs K of them per call.

A step is a plain function of one batch (as in Ignite's ``Engine``); :class:`CompiledLoop`
is the ``make_train_function`` half: it pulls up to K batches from an iterator inside one
``tf.function`` and reports how many it ran, so the end of a data set is a count, not an
exception crossing the compiled boundary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import keras
import tensorflow as tf

from beatloop.core.batches import leading_dimension
from beatloop.core.binding import BoundBeat, BoundSchedule
from beatloop.core.errors import NumericsError, ScheduleError
from beatloop.core.replicas import ReplicaRandom, batch_share
from beatloop.core.state import EngineState, StepMetrics

Batch = Mapping[str, tf.Tensor]


def make_train_step(
    bound: BoundSchedule,
    state: EngineState,
    metrics: StepMetrics,
    update_metrics: Callable,
    *,
    check_numerics: bool = False,
    strategy: tf.distribute.Strategy | None = None,
) -> Callable[[Batch], tf.Tensor]:
    """Return ``train_step(batch) -> checks``: every beat in order, then metrics and
    counters.

    ``checks`` is a float32 ``[beats, 2]`` tensor: per beat, its loss and the sum of
    squares of its gradients (summed over a beat's repeats; zero for a beat that did not
    run). All finite means all is well; the compiled loop tests that with one reduction
    per step and stops at the first step that fails, and the engine reads which beat
    and which value (see :func:`describe_checks`), instead of branching around every
    update inside the graph. ``check_numerics`` (eager debug mode) raises before the bad
    update is applied. With a ``strategy`` the beats run on every replica (see
    :mod:`beatloop.core.replicas`), their checks are summed over replicas, and the
    counters advance once per step, outside them.
    """

    def run_beat(beat: BoundBeat, batch: Batch, size, share, random):
        variables = list(beat.variables)
        outputs: dict[str, tf.Tensor] = {}
        scale = loss_scale(beat.optimizer)
        losses, squares = [], []
        for _ in range(beat.beat.repeat):
            with tf.GradientTape() as tape:
                loss, outputs = beat.forward(bound.models, batch, random=random)
                weighted = loss if share is None else loss * share.weight
                scaled = beat.optimizer.scale_loss(weighted)
            grads = tape.gradient(scaled, variables)
            _refuse_missing_gradients(beat, variables, grads)
            if check_numerics:
                _check_finite(beat, loss, grads, state, scale)
            losses.append(loss)
            # Under loss scaling an overflowing gradient is expected now and then: the
            # optimizer skips that update and lowers the scale, so only the loss counts.
            if scale is None:
                squares.extend(tf.reduce_sum(tf.square(g)) for g in grads if g is not None)
            if beat.beat.transform is not None:
                grads = _transformed(beat.beat.transform, grads, scale)
            beat.optimizer.apply(grads, variables)
            if beat.beat.constraint is not None:
                for variable in variables:
                    variable.assign(beat.beat.constraint(variable))
            metrics.losses[beat.beat.name].update_state(loss, sample_weight=size)
        checks = tf.stack([tf.add_n(losses), tf.add_n(squares) if squares else 0.0])
        return outputs, checks

    def replica_step(batch: Batch):
        size = leading_dimension(batch)
        share = None if strategy is None else batch_share(size)
        random = bound.random if share is None else ReplicaRandom(bound.random, share)
        outputs, checks = {}, []
        for beat in bound.beats:
            if beat.beat.every == 1:
                outputs[beat.beat.name], beat_checks = run_beat(beat, batch, size, share, random)
            else:
                beat_checks = tf.cond(
                    tf.equal(state.step % beat.beat.every, 0),
                    lambda beat=beat: run_beat(beat, batch, size, share, random)[1],
                    lambda: tf.zeros([2]),
                )
            checks.append(beat_checks)
        update_metrics(metrics.metrics, batch, outputs)
        return tf.stack(checks), size

    def train_step(batch: Batch) -> tf.Tensor:
        checks, size = _on_replicas(strategy, replica_step, batch)
        state.step.assign_add(1)
        state.examples.assign_add(size)
        return checks

    return train_step


def _on_replicas(strategy, replica_step: Callable, batch) -> tuple:
    """Run ``replica_step`` on one device, or on every replica and sum what it returns
    (the sizes; the checks, where a NaN or inf on any replica stays)."""
    if strategy is None:
        return replica_step(batch)
    per_replica = strategy.run(replica_step, args=(batch,))
    return tuple(
        strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) for value in per_replica
    )


def describe_checks(bound: BoundSchedule, checks) -> str:
    """Words for the first non-finite entry of a step's checks (see make_train_step)."""
    for row, bound_beat in zip(checks, bound.beats, strict=True):
        beat, repeats = bound_beat.beat, bound_beat.beat.repeat
        summed = f" (summed over its {repeats} repeats)" if repeats > 1 else ""
        if not math.isfinite(float(row[0])):
            return f"beat {beat.name!r} produced a non-finite loss ({float(row[0])}){summed}"
    for row, bound_beat in zip(checks, bound.beats, strict=True):
        if not math.isfinite(float(row[1])):
            norm = math.sqrt(float(row[1])) if float(row[1]) >= 0 else float("nan")
            return (
                f"beat {bound_beat.beat.name!r} produced a non-finite gradient global norm ({norm})"
            )
    return "no non-finite value"


def loss_scale(optimizer) -> tf.Variable | None:
    """The current loss scale of a loss-scaling optimizer, ``None`` for any other."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.dynamic_scale
    return None


def _transformed(transform: Callable, grads, scale) -> list:
    """Apply a gradient transform (clipping) to true gradients: under loss scaling,
    unscale first and scale back after (the scale is a power of two: both exact), so
    the optimizer's own unscaling and overflow check still hold."""
    if scale is None:
        return transform(grads)
    true = [g / tf.cast(scale, g.dtype) for g in grads]
    return [g * tf.cast(scale, g.dtype) for g in transform(true)]


def make_validation_step(
    bound: BoundSchedule,
    metrics: StepMetrics,
    update_metrics: Callable,
    *,
    strategy: tf.distribute.Strategy | None = None,
) -> Callable[[Batch], None]:
    """Return ``validation_step(batch)``: every beat's loss with all models in inference
    mode; no gradient, no update, no counter moves."""

    def replica_step(batch: Batch):
        size = leading_dimension(batch)
        random = bound.random
        if strategy is not None:
            random = ReplicaRandom(bound.random, batch_share(size))
        outputs = {}
        for beat in bound.beats:
            loss, outputs[beat.beat.name] = beat.forward(
                bound.models, batch, training=False, random=random
            )
            metrics.losses[beat.beat.name].update_state(loss, sample_weight=size)
        update_metrics(metrics.metrics, batch, outputs)
        return (size,)

    def validation_step(batch: Batch) -> None:
        _on_replicas(strategy, replica_step, batch)

    return validation_step


_FAULT_SHIFT = 1 << 20  # steps per call stay below this; the fault flag rides above it


@attrs.frozen
class LoopResult:
    """What one compiled call did: ``ran`` steps (fewer than asked means the data ended
    or a step faulted); for a faulted step, its ``checks`` (see make_train_step)."""

    ran: int
    faulted: bool = False
    checks: Any = None


class CompiledLoop:
    """Runs up to ``steps_per_execution`` steps per call on a data set iterator.

    Compiled once, on construction, for the data set's element spec (batch dimension
    unknown), so a short last batch reuses the same trace. The loop stops early at the
    end of the data or at a step whose ``checks`` (a ``[checks, 2]`` tensor the step
    returns; none for a step that returns nothing) are not all finite; ``counters``
    (variables) advance by the number of steps run, inside the same call.
    ``trace_count`` counts traces (two, at construction, when compiled: the K-step
    loop and the one-step call). ``compiled=False`` runs the same code eagerly, for
    debugging; ``jit_compile=True``
    compiles the step with XLA; ``distributed=True`` takes iterators of a distributed
    data set.
    """

    def __init__(
        self,
        step_fn: Callable[[Batch], tf.Tensor | None],
        steps_per_execution: int,
        element_spec: Mapping[str, tf.TensorSpec],
        *,
        checks: int = 0,
        counters: Sequence[tf.Variable] = (),
        compiled: bool = True,
        jit_compile: bool = False,
        distributed: bool = False,
    ):
        if jit_compile and compiled:
            # XLA compiles the step; the loop around it pulls from the iterator, which
            # XLA cannot compile. A new batch shape (a short last batch) compiles anew.
            step_fn = tf.function(step_fn, jit_compile=True)
        self.step_fn = step_fn
        self.steps_per_execution = steps_per_execution
        self.checks = checks
        self.counters = tuple(counters)
        self.trace_count = 0
        self._limits: dict[int, tf.Tensor] = {}
        if compiled and distributed:
            # A distributed iterator's spec is known once it exists: traced on first call.
            self._call = tf.function(self._loop)
        elif compiled:
            # Traced once, here, for the data set's spec. Calling the concrete function
            # skips tf.function's per-call argument matching (~0.3 ms a call on a CPU,
            # a quarter of a small step), and it cannot retrace by construction.
            signature = (
                tf.data.IteratorSpec(dict(element_spec)),
                tf.TensorSpec([], tf.int32, name="limit"),
            )
            self._call = tf.function(self._loop).get_concrete_function(*signature)
        else:
            self._call = self._loop
        # One step per call needs no while loop: a conditional on the next batch is
        # cheaper (a loop runs its condition and body as functions), about a tenth of
        # a small GAN step on a CPU.
        self._call_one = self._call
        if compiled and not distributed:
            self._call_one = tf.function(self._one).get_concrete_function(signature[0])

    def _step(self, batch) -> tf.Tensor:
        checks = self.step_fn(batch)
        return tf.zeros([self.checks, 2]) if checks is None else checks

    def _loop(self, iterator, limit: tf.Tensor):
        self.trace_count += 1

        def more(count, next_batch, ok, _checks):
            return tf.logical_and(tf.logical_and(count < limit, next_batch.has_value()), ok)

        def body(count, next_batch, _ok, _checks):
            checks = self._step(next_batch.get_value())
            ok = tf.reduce_all(tf.math.is_finite(checks))
            # Fetch only if another step follows, so no batch is pulled and dropped.
            following = tf.cond(
                tf.logical_and(count + 1 < limit, ok),
                iterator.get_next_as_optional,
                lambda: next_batch,
            )
            return count + 1, following, ok, checks

        start = (
            tf.constant(0),
            iterator.get_next_as_optional(),
            tf.constant(True),
            tf.zeros([self.checks, 2]),
        )
        count, _, ok, checks = tf.while_loop(more, body, start)
        for counter in self.counters:
            counter.assign_add(tf.cast(count, counter.dtype))
        # One integer for the caller to read (each tensor read costs microseconds).
        return count + (1 - tf.cast(ok, tf.int32)) * _FAULT_SHIFT, checks

    def _one(self, iterator):
        self.trace_count += 1
        next_batch = iterator.get_next_as_optional()

        def run():
            checks = self._step(next_batch.get_value())
            ok = tf.reduce_all(tf.math.is_finite(checks))
            return 1 + (1 - tf.cast(ok, tf.int32)) * _FAULT_SHIFT, checks

        def nothing():
            return tf.constant(0), tf.zeros([self.checks, 2])

        status, checks = tf.cond(next_batch.has_value(), run, nothing)
        ran = tf.cast(next_batch.has_value(), tf.int64)
        for counter in self.counters:
            counter.assign_add(tf.cast(ran, counter.dtype))
        return status, checks

    def __call__(self, iterator, limit: int | None = None) -> LoopResult:
        """Run up to ``limit`` (at most K) steps and say how many ran and why it stopped."""
        limit = self.steps_per_execution if limit is None else min(limit, self.steps_per_execution)
        if limit == 1 and self._call_one is not self._call:
            status, checks = self._call_one(iterator)
        else:
            if limit not in self._limits:
                self._limits[limit] = tf.constant(limit, tf.int32)
            status, checks = self._call(iterator, self._limits[limit])
        faulted, count = divmod(int(status), _FAULT_SHIFT)
        return LoopResult(count, bool(faulted), checks.numpy() if faulted else None)


def _refuse_missing_gradients(beat: BoundBeat, variables, grads) -> None:
    missing = [v.path for v, g in zip(variables, grads, strict=True) if g is None]
    if missing:  # the bind-time probe normally finds these first
        raise ScheduleError(
            [f"beat {beat.beat.name!r}: loss gives no gradient to {path!r}" for path in missing]
        )


def _check_finite(beat: BoundBeat, loss, grads, state: EngineState, scale=None) -> None:
    """Eager-only check (debug mode): stop at the first non-finite loss or gradient norm
    (under loss scaling the gradients may overflow: the optimizer skips those)."""
    step = int(state.step)
    value = float(loss)
    if not math.isfinite(value):
        raise NumericsError(
            f"beat {beat.beat.name!r} produced a non-finite loss {value} at step {step}"
        )
    if scale is not None:
        return
    norm = float(tf.linalg.global_norm(grads))
    if not math.isfinite(norm):
        raise NumericsError(
            f"beat {beat.beat.name!r} produced a non-finite gradient norm {norm} at step {step} "
            f"(loss {value})"
        )
