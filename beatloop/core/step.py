"""The training and validation steps, and the loop that runs K of them per call.

A step is a plain function of one batch (as in Ignite's ``Engine``); :class:`CompiledLoop`
is the ``make_train_function`` half: it pulls up to K batches from an iterator inside one
``tf.function`` and reports how many it ran, so the end of a data set is a count, not an
exception crossing the compiled boundary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

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
) -> Callable[[Batch], tuple[tf.Tensor, tf.Tensor]]:
    """Return ``train_step(batch) -> (fault, value)``: every beat in order, then metrics
    and counters.

    ``fault`` is 0 when every beat's loss and gradient global norm were finite, else a
    code for the first that was not (see :func:`describe_fault`) with the bad ``value``.
    Computing it costs one reduction per beat; the engine reads it after the call and
    stops the loop, instead of branching around every update inside the graph.
    ``check_numerics`` (eager debug mode) raises before the bad update is applied.
    With a ``strategy`` the beats run on every replica (see :mod:`beatloop.core.replicas`)
    and the counters advance once per step, outside them.
    """

    def run_beat(index: int, beat: BoundBeat, batch: Batch, size, share, random):
        variables = list(beat.variables)
        outputs: dict[str, tf.Tensor] = {}
        fault, value = _no_fault()
        scale = loss_scale(beat.optimizer)
        for _ in range(beat.beat.repeat):
            with tf.GradientTape() as tape:
                loss, outputs = beat.forward(bound.models, batch, random=random)
                weighted = loss if share is None else loss * share.weight
                scaled = beat.optimizer.scale_loss(weighted)
            grads = tape.gradient(scaled, variables)
            _refuse_missing_gradients(beat, variables, grads)
            if check_numerics:
                _check_finite(beat, loss, grads, state, scale)
            # Under loss scaling an overflowing gradient is expected now and then: the
            # optimizer skips that update and lowers the scale, so only the loss counts.
            new_fault = _fault(index, loss, None if scale is not None else grads)
            fault, value = _first_fault((fault, value), new_fault)
            if beat.beat.transform is not None:
                grads = _transformed(beat.beat.transform, grads, scale)
            beat.optimizer.apply(grads, variables)
            if beat.beat.constraint is not None:
                for variable in variables:
                    variable.assign(beat.beat.constraint(variable))
            metrics.losses[beat.beat.name].update_state(loss, sample_weight=size)
        return outputs, fault, value

    def replica_step(batch: Batch):
        size = leading_dimension(batch)
        share = None if strategy is None else batch_share(size)
        random = bound.random if share is None else ReplicaRandom(bound.random, share)
        outputs = {}
        found = _no_fault()
        for index, beat in enumerate(bound.beats):
            if beat.beat.every == 1:
                outputs[beat.beat.name], *faults = run_beat(index, beat, batch, size, share, random)
            else:
                faults = tf.cond(
                    tf.equal(state.step % beat.beat.every, 0),
                    lambda index=index, beat=beat: run_beat(
                        index, beat, batch, size, share, random
                    )[1:],
                    _no_fault,
                )
            found = _first_fault(found, tuple(faults))
        update_metrics(metrics.metrics, batch, outputs)
        return (*found, size)

    def train_step(batch: Batch) -> tuple[tf.Tensor, tf.Tensor]:
        fault, value, size = _on_replicas(strategy, replica_step, batch, 2 * len(bound.beats) + 1)
        state.step.assign_add(1)
        state.examples.assign_add(size)
        return fault, value

    return train_step


def _on_replicas(strategy, replica_step: Callable, batch, codes: int) -> tuple:
    """Run ``replica_step`` on one device, or on every replica and reduce its
    ``(fault, value, size)``: the first fault code any replica saw (``codes`` is how
    many there are), the summed values (a NaN or inf anywhere stays) and sizes."""
    if strategy is None:
        return replica_step(batch)
    fault, value, size = strategy.run(replica_step, args=(batch,))
    total = lambda x: strategy.reduce(tf.distribute.ReduceOp.SUM, x, axis=None)  # noqa: E731
    # Reductions only sum or average: count each code over replicas, take the first seen.
    seen = total(strategy.run(lambda f: tf.one_hot(f, codes, dtype=tf.int32), args=(fault,)))
    first = tf.argmax(tf.cast(seen[1:] > 0, tf.int32), output_type=tf.int32) + 1
    return tf.where(tf.reduce_any(seen[1:] > 0), first, 0), total(value), total(size)


def _no_fault() -> tuple[tf.Tensor, tf.Tensor]:
    return tf.constant(0), tf.constant(0.0)


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


def _fault(index: int, loss: tf.Tensor, grads) -> tuple[tf.Tensor, tf.Tensor]:
    """(code, value) for one update: 0 if the loss and gradient global norm are finite
    (``grads=None``: the loss alone)."""
    if grads is None:
        norm = tf.constant(0.0)
    else:
        norm = tf.linalg.global_norm([g for g in grads if g is not None])
    loss_bad = tf.logical_not(tf.math.is_finite(loss))
    norm_bad = tf.logical_not(tf.math.is_finite(norm))
    code = tf.where(loss_bad, 2 * index + 1, tf.where(norm_bad, 2 * index + 2, 0))
    return code, tf.where(loss_bad, loss, norm)


def _first_fault(found, new) -> tuple[tf.Tensor, tf.Tensor]:
    keep = tf.not_equal(found[0], 0)
    return tf.where(keep, found[0], new[0]), tf.where(keep, found[1], new[1])


def describe_fault(bound: BoundSchedule, code: int, value: float) -> str:
    """Words for a fault code of :func:`make_train_step`."""
    beat = bound.beats[(code - 1) // 2].beat.name
    what = "loss" if code % 2 == 1 else "gradient global norm"
    return f"beat {beat!r} produced a non-finite {what} ({value})"


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
        return (*_no_fault(), size)

    def validation_step(batch: Batch) -> None:
        _on_replicas(strategy, replica_step, batch, 1)

    return validation_step


_FAULT_SHIFT = 1 << 20  # steps per call stay below this; fault codes ride above it


@attrs.frozen
class LoopResult:
    """What one compiled call did: ``ran`` steps (fewer than asked means the data ended
    or a step faulted), and the fault code and value of the step that stopped it."""

    ran: int
    fault: int = 0
    value: float = 0.0


class CompiledLoop:
    """Runs up to ``steps_per_execution`` steps per call on a data set iterator.

    Compiled once, on construction, for the data set's element spec (batch dimension
    unknown), so a short last batch reuses the same trace. The loop stops early at the
    end of the data or at a step that reports a fault; ``counters`` (variables) advance
    by the number of steps run, inside the same call. ``compiled=False`` runs the same
    code eagerly, for debugging; ``jit_compile=True`` compiles the step with XLA;
    ``distributed=True`` takes iterators of a distributed data set.
    """

    def __init__(
        self,
        step_fn: Callable[[Batch], tuple[tf.Tensor, tf.Tensor] | None],
        steps_per_execution: int,
        element_spec: Mapping[str, tf.TensorSpec],
        *,
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

    def _step(self, batch) -> tuple[tf.Tensor, tf.Tensor]:
        result = self.step_fn(batch)
        return _no_fault() if result is None else result

    def _loop(self, iterator, limit: tf.Tensor):
        self.trace_count += 1

        def more(count, next_batch, fault, _value):
            return tf.logical_and(
                tf.logical_and(count < limit, next_batch.has_value()), tf.equal(fault, 0)
            )

        def body(count, next_batch, _fault, _value):
            fault, value = self._step(next_batch.get_value())
            # Fetch only if another step follows, so no batch is pulled and dropped.
            following = tf.cond(
                tf.logical_and(count + 1 < limit, tf.equal(fault, 0)),
                iterator.get_next_as_optional,
                lambda: next_batch,
            )
            return count + 1, following, fault, value

        start = (tf.constant(0), iterator.get_next_as_optional(), *_no_fault())
        count, _, fault, value = tf.while_loop(more, body, start)
        for counter in self.counters:
            counter.assign_add(tf.cast(count, counter.dtype))
        # One integer for the caller to read (each tensor read costs microseconds).
        return count + fault * _FAULT_SHIFT, value

    def __call__(self, iterator, limit: int | None = None) -> LoopResult:
        """Run up to ``limit`` (at most K) steps and say how many ran and why it stopped."""
        limit = self.steps_per_execution if limit is None else min(limit, self.steps_per_execution)
        if limit not in self._limits:
            self._limits[limit] = tf.constant(limit, tf.int32)
        status, value = self._call(iterator, self._limits[limit])
        fault, count = divmod(int(status), _FAULT_SHIFT)
        return LoopResult(count, fault, float(value) if fault else 0.0)


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
