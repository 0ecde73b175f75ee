"""The training and validation steps, and the loop that runs K of them per call.

A step is a plain function of one batch (as in Ignite's ``Engine``); :class:`CompiledLoop`
is the ``make_train_function`` half: it pulls up to K batches from an iterator inside one
``tf.function`` and reports how many it ran, so the end of a data set is a count, not an
exception crossing the compiled boundary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import tensorflow as tf

from beatloop.core.batches import leading_dimension
from beatloop.core.binding import BoundBeat, BoundSchedule
from beatloop.core.errors import NumericsError, ScheduleError
from beatloop.core.state import EngineState, StepMetrics

Batch = Mapping[str, tf.Tensor]


def make_train_step(
    bound: BoundSchedule,
    state: EngineState,
    metrics: StepMetrics,
    update_metrics: Callable,
    *,
    check_numerics: bool = False,
) -> Callable[[Batch], None]:
    """Return ``train_step(batch)``: every beat in order, then metrics and counters."""

    def run_beat(beat: BoundBeat, batch: Batch, size: tf.Tensor) -> dict[str, tf.Tensor]:
        variables = list(beat.variables)
        outputs: dict[str, tf.Tensor] = {}
        for _ in range(beat.beat.repeat):
            with tf.GradientTape() as tape:
                loss, outputs = beat.forward(bound.models, batch)
                scaled = beat.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, variables)
            _refuse_missing_gradients(beat, variables, grads)
            if beat.beat.transform is not None:
                grads = beat.beat.transform(grads)
            if check_numerics:
                _check_finite(beat, loss, grads, state)
            beat.optimizer.apply(grads, variables)
            if beat.beat.constraint is not None:
                for variable in variables:
                    variable.assign(beat.beat.constraint(variable))
            metrics.losses[beat.beat.name].update_state(loss, sample_weight=size)
        return outputs

    def train_step(batch: Batch) -> None:
        size = leading_dimension(batch)
        outputs = {}
        for beat in bound.beats:
            if beat.beat.every == 1:
                outputs[beat.beat.name] = run_beat(beat, batch, size)
            else:
                tf.cond(
                    tf.equal(state.step % beat.beat.every, 0),
                    lambda beat=beat: _ran(run_beat(beat, batch, size)),
                    lambda: tf.constant(False),
                )
        update_metrics(metrics.metrics, batch, outputs)
        state.step.assign_add(1)
        state.examples.assign_add(size)

    return train_step


def make_validation_step(
    bound: BoundSchedule, metrics: StepMetrics, update_metrics: Callable
) -> Callable[[Batch], None]:
    """Return ``validation_step(batch)``: every beat's loss with all models in inference
    mode; no gradient, no update, no counter moves."""

    def validation_step(batch: Batch) -> None:
        size = leading_dimension(batch)
        outputs = {}
        for beat in bound.beats:
            loss, outputs[beat.beat.name] = beat.forward(bound.models, batch, training=False)
            metrics.losses[beat.beat.name].update_state(loss, sample_weight=size)
        update_metrics(metrics.metrics, batch, outputs)

    return validation_step


class CompiledLoop:
    """Runs up to ``steps_per_execution`` steps per call on a data set iterator.

    Compiled once, on construction, for the data set's element spec (batch dimension
    unknown), so a short last batch reuses the same trace.
    ``compiled=False`` runs the same code eagerly, for debugging.
    """

    def __init__(
        self,
        step_fn: Callable[[Batch], None],
        steps_per_execution: int,
        element_spec: Mapping[str, tf.TensorSpec],
        *,
        compiled: bool = True,
    ):
        self.step_fn = step_fn
        self.steps_per_execution = steps_per_execution
        self.trace_count = 0
        self._limits: dict[int, tf.Tensor] = {}
        if compiled:
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

    def _loop(self, iterator, limit: tf.Tensor) -> tf.Tensor:
        self.trace_count += 1

        def more(count, next_batch):
            return tf.logical_and(count < limit, next_batch.has_value())

        def body(count, next_batch):
            self.step_fn(next_batch.get_value())
            # Fetch only if another step follows, so no batch is pulled and dropped.
            following = tf.cond(
                count + 1 < limit, iterator.get_next_as_optional, lambda: next_batch
            )
            return count + 1, following

        count, _ = tf.while_loop(more, body, (tf.constant(0), iterator.get_next_as_optional()))
        return count

    def __call__(self, iterator, limit: int | None = None) -> int:
        """Run up to ``limit`` (at most K) steps; return how many ran (fewer means the
        data set ended)."""
        limit = self.steps_per_execution if limit is None else min(limit, self.steps_per_execution)
        if limit not in self._limits:
            self._limits[limit] = tf.constant(limit, tf.int32)
        return int(self._call(iterator, self._limits[limit]))


def _ran(_outputs) -> tf.Tensor:
    return tf.constant(True)


def _refuse_missing_gradients(beat: BoundBeat, variables, grads) -> None:
    missing = [v.path for v, g in zip(variables, grads, strict=True) if g is None]
    if missing:  # the bind-time probe normally finds these first
        raise ScheduleError(
            [f"beat {beat.beat.name!r}: loss gives no gradient to {path!r}" for path in missing]
        )


def _check_finite(beat: BoundBeat, loss, grads, state: EngineState) -> None:
    """Eager-only check (debug mode): stop at the first non-finite loss or gradient norm."""
    step = int(state.step)
    value = float(loss)
    if not math.isfinite(value):
        raise NumericsError(
            f"beat {beat.beat.name!r} produced a non-finite loss {value} at step {step}"
        )
    norm = float(tf.linalg.global_norm(grads))
    if not math.isfinite(norm):
        raise NumericsError(
            f"beat {beat.beat.name!r} produced a non-finite gradient norm {norm} at step {step} "
            f"(loss {value})"
        )
