"""One training step and one validation step on one batch (Keras's ``one_step_on_data``).

A step is a plain callable of ``(batch, step number)`` that returns its checks (see
``beatloop.core.compiled.numerics``) and the number of examples in the batch; it touches no
counter. ``CompiledLoop`` runs K of them per compiled call.
The pieces are small on purpose: an entry's gradients (one beat's, or a group's from
one forward) here, their transform or combination and their update in
``beatloop.core.compiled.applying``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import tensorflow as tf

from beatloop.core.compiled.applying import apply_combined, apply_update, loss_scale
from beatloop.core.compiled.bound import (
    BoundBeat,
    BoundGroup,
    BoundSchedule,
    BoundUpdate,
    on_rows,
    weighted,
)
from beatloop.core.compiled.conditional import apply_when, holds
from beatloop.core.compiled.gated import asked, flush_sums, gated_update, unless
from beatloop.core.compiled.gradient_probe import GradientProbe
from beatloop.core.compiled.metrics import StepMetrics
from beatloop.core.compiled.numerics import (
    DivergenceGuard,
    beat_checks,
    check_finite,
    gradient_squares,
    no_checks,
)
from beatloop.core.compiled.randomness import new_operations
from beatloop.core.compiled.sparse_rows import summed_rows
from beatloop.core.compiled.user_code import call_user
from beatloop.core.data.batches import leading_dimension
from beatloop.core.devices.collectives import Gathering, all_gather
from beatloop.core.devices.replicas import (
    declared,
    entry_weight,
    figure_size,
    on_replicas,
    once_per_step,
    replica_view,
)
from beatloop.core.failures.errors import ScheduleError

Batch = Mapping[str, tf.Tensor]


class TrainStep:
    """Every entry of a bound schedule in order on one batch (a lone beat, a group of
    beats updated simultaneously, an update or an act), then the metrics.

    With a ``strategy`` the beats run on every replica (see ``beatloop.core.devices.replicas``)
    and their checks and batch sizes are summed over replicas. ``debug`` (eager mode)
    stops before a non-finite update is applied. With a ``divergence`` guard, each
    replica's loss enters the checks weighted by its share of the global batch, so their
    sum is the global batch's loss, and ``debug`` also stops before the update of a
    diverged loss (the guard's window itself is updated by the loop, after the step).
    A replica's batch is its share of the global batch, of static shape ``(None, ...)``:
    a loss reads its size with ``tf.shape``, and sees the global batch through
    ``models.all_gather`` (docs/schedules.md, "Losses under a strategy"), padded as
    ``gathering`` says (``beatloop.core.devices.collectives.Gathering``). An entry
    whose losses declare a batch of their own (``models.own_batch``) is weighted by the
    replica's share of that batch instead. An act runs once per step for all replicas,
    in cross-replica context, on the global batch (``replicas.once_per_step``): acting
    and recipe state are one agent's whatever the replica count. With a ``probe``, the
    trace records the gradients a beat's loss does not give and the global random ops
    it draws from (``beatloop.core.compiled.gradient_probe``), instead of refusing the first.
    ``check_gradients=False``: the checks hold the losses only (a zero gradient column).
    """

    def __init__(
        self,
        bound: BoundSchedule,
        metrics: StepMetrics,
        update_metrics: Callable,
        *,
        debug: bool = False,
        strategy: tf.distribute.Strategy | None = None,
        divergence: DivergenceGuard | None = None,
        gathering: Gathering | None = None,
        probe: GradientProbe | None = None,
        check_gradients: bool = True,
    ):
        self.bound = bound
        self.metrics = metrics
        self.update_metrics = update_metrics
        self.debug = debug
        self.check_gradients = check_gradients
        self.strategy = strategy
        self.divergence = divergence
        self.gathering = gathering
        self.probe = probe

    def __call__(self, batch: Batch, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(checks, examples)`` of one step; ``step`` is its number (for ``every``)."""
        result = on_replicas(self.strategy, self.on_replica, batch, step)
        if self.probe is not None:
            self.probe.traced()
        return result

    def on_replica(self, batch: Batch, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        size = leading_dimension(batch)
        share, random = replica_view(self.strategy, self.bound.random, size)
        outputs, checks, updated = {}, [], {}
        for group in self.bound.entries:
            if isinstance(group, BoundUpdate):  # no loss: no row of checks
                self.run_update(group, batch, random, step, updated)
                continue
            if group.every == 1:
                group_outputs, rows, applied = self.run_group(
                    group, batch, size, share, random, step
                )
                outputs.update(group_outputs)
            elif group.condition is None and group.accumulators is None:
                rows = tf.cond(
                    tf.equal(step % group.every, 0),
                    lambda g=group: self.run_group(g, batch, size, share, random, step)[1],
                    lambda g=group: no_checks(len(g.beats)),
                )
                applied = lambda g=group: tf.equal(step % g.every, 0)  # noqa: E731
            else:
                rows, applied = tf.cond(
                    tf.equal(step % group.every, 0),
                    lambda g=group: self.run_group(g, batch, size, share, random, step)[1:],
                    lambda g=group: (no_checks(len(g.beats)), tf.constant(False)),
                )
            updated[group.name] = applied
            checks.append(rows)
        call_user(self.update_metrics, "metric update", None, self.metrics.metrics, batch, outputs)
        return (checks[0] if len(checks) == 1 else tf.concat(checks, axis=0)), size

    def run_update(self, update: BoundUpdate, batch, random, step, updated=None) -> None:
        """An update, on this replica (a mirrored target assigned from mirrored sources
        gets the same value on every replica), or an act, once for all replicas; on
        steps its ``every`` selects, while its condition holds (``updated``: whether
        each beat or group updated in this step, for a condition naming one)."""
        if update.kind == "act" and self.strategy is not None:
            self.run_act_once(update, batch, step)
            return

        def assign():
            update.run(self.bound.models, batch, random=random, state=self.bound.state)

        def run():
            condition = update.condition
            if condition is None:
                assign()
            elif condition.after is not None:
                applied = (updated or {})[condition.after]
                applied = applied() if callable(applied) else tf.convert_to_tensor(applied)
                apply_when(applied, assign, update.writes)
            else:
                calls = (self.bound.models, batch)
                now = holds(
                    condition, *calls, random=random, state=self.bound.state, loss=None,
                    gathering=self.gathering,
                )  # fmt: skip
                apply_when(now, assign, update.writes)
            return tf.constant(0)

        if update.every == 1:
            run()
        else:
            tf.cond(tf.equal(step % update.every, 0), run, lambda: tf.constant(0))

    def run_act_once(self, act: BoundUpdate, batch, step) -> None:
        """An act under a strategy: once per step for all replicas, in cross-replica
        context, on the global batch, drawing from the run's generator and writing the
        recipe state as on one device; the state it writes is then mirrored
        (``replicas.once_per_step``)."""

        def run(whole, state) -> None:
            act.run(self.bound.models, whole, random=self.bound.random, state=state)

        if len(self.strategy.extended.worker_devices) < self.strategy.num_replicas_in_sync:
            # replicas on other workers: each worker acts alike on the gathered batch
            batch = all_gather(batch, batch, self.gathering)
        once_per_step(self.bound.state, run, batch, step, act.every)

    def run_group(self, group: BoundGroup, batch, size, share, random, step):
        """One entry of the step, ``repeat`` times: every beat's gradients from the same
        state, then each beat's transform, update, constraint and loss metrics. Returns
        the last repeat's outputs, the entry's rows of checks and whether it updated
        (``True`` when it always does). On a replica the losses are weighted by its
        ``share`` of the batch, or of their own batch."""
        losses = {beat.name: [] for beat in group.beats}
        squares = {beat.name: [] for beat in group.beats}
        outputs, applied = {}, False
        batch_weight = None if share is None else share.weight
        for repeat in range(group.repeat):
            since = declared(random)
            with new_operations() as created:
                values, outputs, gradients = group.gradients(
                    self.bound.models,
                    batch,
                    weight=batch_weight,
                    random=random,
                    state=self.bound.state,
                    gathering=self.gathering,
                )
            if self.probe is not None:
                gradients = self.probe.seen(group, gradients, created)
            gradients = [summed_rows(grads, size, self.gathering) for grads in gradients]
            weight = entry_weight(random, since, batch_weight, f"entry {group.name!r}")
            figure = figure_size(size, share, batch_weight, weight)
            holds_now = self.asked(group, batch, random, (values, gradients, weight))
            for beat, loss, grads in zip(group.beats, values, gradients, strict=True):
                check_gradients(beat, grads)
                scaled = loss_scale(beat.optimizer) is not None
                if self.debug and (holds_now is None or bool(holds_now)):
                    check_finite(beat.name, loss, grads, step, scaled)
                # A turn whose condition is false updates nothing: nothing of it to check.
                losses[beat.name].append(unless(holds_now, self._checked_loss(loss, weight)))
                # Under loss scaling an overflowing gradient is expected now and then: the
                # optimizer skips that update and lowers the scale, so only the loss counts.
                if self.check_gradients and not scaled:
                    squares[beat.name].extend(unless(holds_now, g) for g in gradient_squares(grads))
            if self.debug and self.divergence is not None and repeat == group.repeat - 1:
                for beat in group.beats:  # the step's loss is whole: before its last update
                    self.divergence.check_eager(beat, tf.add_n(losses[beat.name]), step)
            if group.condition is not None or group.accumulators is not None:
                rows = size if share is None else share.total
                now = gated_update(group, gradients, holds_now, rows, self.metrics)
                applied = tf.logical_or(applied, now)
                for beat, loss in zip(group.beats, values, strict=True):
                    self.metrics.update_loss(beat.name, on_rows(loss, weight), figure)
                continue
            if group.combine is not None:
                apply_combined(group, gradients)
            for beat, loss, grads in zip(group.beats, values, gradients, strict=True):
                if group.combine is None:
                    apply_update(beat, grads)
                self.metrics.update_loss(beat.name, on_rows(loss, weight), figure)
            applied = True
        rows = [beat_checks(losses[b.name], squares[b.name]) for b in group.beats]
        return outputs, tf.stack(rows), applied

    def flush(self) -> tuple[tf.Tensor, ...]:
        """Apply the sums accumulating entries hold (an epoch's end: see
        ``beatloop.core.compiled.accumulation``)."""
        return on_replicas(self.strategy, flush_sums, self.bound.groups, self.metrics)

    @property
    def accumulates(self) -> bool:
        """Whether an entry of the step accumulates (an epoch's end then flushes it)."""
        return any(group.accumulators is not None for group in self.bound.groups)

    def asked(self, group: BoundGroup, batch, random, turn) -> tf.Tensor | None:
        """Whether ``group``'s condition holds at this turn (``None``: it has none)."""
        if group.condition is None:
            return None
        state, gathering = self.bound.state, self.gathering
        return asked(group, self.bound.models, batch, random, state, turn, gathering)

    def _checked_loss(self, loss: tf.Tensor, weight) -> tf.Tensor:
        """A loss as the checks take it: as it is (zero on a replica with no rows), or on
        a replica with the divergence guard on, weighted by the replica's share (the
        checks' sum over replicas is then the global batch's loss, which the guard
        compares)."""
        if weight is None or self.divergence is None:
            return on_rows(loss, weight)
        return weighted(loss, weight)


def check_gradients(beat: BoundBeat, grads) -> None:
    """Refuse a variable the beat's loss gives no gradient (the bind-time probe
    normally finds these first)."""
    missing = [v.path for v, g in zip(beat.variables, grads, strict=True) if g is None]
    if missing:
        raise ScheduleError(
            [f"beat {beat.name!r}: loss gives no gradient to {path!r}" for path in missing]
        )


class ValidationStep:
    """Every beat's loss on one batch with all models in inference mode, then the
    metrics; no gradient, no update. Noise is drawn from ``random`` (validation's own
    generator; the run's when none is given); gathers pad as ``gathering`` says."""

    def __init__(
        self,
        bound: BoundSchedule,
        metrics: StepMetrics,
        update_metrics: Callable,
        *,
        strategy: tf.distribute.Strategy | None = None,
        random: tf.random.Generator | None = None,
        gathering: Gathering | None = None,
    ):
        self.bound = bound
        self.metrics = metrics
        self.update_metrics = update_metrics
        self.strategy = strategy
        self.random = bound.random if random is None else random
        self.gathering = gathering

    def __call__(self, batch: Batch, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return on_replicas(self.strategy, self.on_replica, batch, step)

    def on_replica(self, batch: Batch, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        size = leading_dimension(batch)
        share, random = replica_view(self.strategy, self.random, size)
        weight = None if share is None else share.weight
        outputs = {}
        for group in self.bound.groups:
            since = declared(random)
            losses, group_outputs = group.losses(
                self.bound.models, batch, training=False, random=random, state=self.bound.state,
                gathering=self.gathering,
            )  # fmt: skip
            own = entry_weight(random, since, weight, f"entry {group.name!r}")
            figure = figure_size(size, share, weight, own)
            outputs.update(group_outputs)
            for beat, loss in zip(group.beats, losses, strict=True):
                self.metrics.update_loss(beat.name, on_rows(loss, own), figure)
        call_user(self.update_metrics, "metric update", None, self.metrics.metrics, batch, outputs)
        return no_checks(0), size
