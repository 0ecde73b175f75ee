"""``accumulate=N``: an entry's gradients summed over N turns and applied as one update.

Each turn adds its gradients times the rows of its batch, and its rows; the update
applies the sum divided by the rows: for losses that are means over the batch, the
gradient of the mean over all N batches together, whatever their sizes (a short last
batch included). Under a strategy each turn's gradients are summed over replicas
first, so every replica holds the same sums (the global batch's), which the update then
hands to the optimizer once. Loss-scaled gradients are summed as they are: the scale
only changes when the optimizer applies, so the sum is unscaled once, by that apply.
The sums are variables, checkpointed with the run: a run killed part-way through an
accumulation resumes it. A partial sum left at an epoch's end is applied then
(``TrainStep.flush``): an epoch of 13 turns with N=4 makes updates of 4, 4, 4 and 1
turn, as a loop over batches N times as large makes with its short last batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import tensorflow as tf

from beatloop.core.compiled.applying import replicated


@attrs.frozen(eq=False)
class Accumulators:
    """The sums of one accumulating entry: per beat, one variable per variable it
    updates; the ``rows`` and ``turns`` taken since its last update."""

    sums: tuple[tuple[tf.Variable, ...], ...]
    rows: tf.Variable
    turns: tf.Variable

    @classmethod
    def of(cls, name: str, beats) -> Accumulators:
        """Zeroed sums for ``beats`` (made in the strategy's scope when there is one)."""
        sums = tuple(
            tuple(
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"{name}_sum_{i}")
                for i, v in enumerate(beat.variables)
            )
            for beat in beats
        )
        rows = tf.Variable(0.0, trainable=False, name=f"{name}_rows")
        turns = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_turns")
        return cls(sums, rows, turns)

    @property
    def variables(self) -> list[tf.Variable]:
        """Every variable of the sums, for checkpoints."""
        return [*(v for sums in self.sums for v in sums), self.rows, self.turns]

    def add(self, gradients: Sequence[Sequence], rows, take: tf.Tensor | None) -> None:
        """Add one turn: each beat's ``gradients`` weighted by ``rows`` (the global
        batch's); with ``take`` false, nothing (a condition that did not hold)."""
        context = replicated()
        rows = tf.cast(rows, tf.float32)
        for sums, grads in zip(self.sums, gradients, strict=True):
            grads = [tf.convert_to_tensor(g) for g in grads]  # an embedding's: made dense
            if context is not None:
                grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            for total, grad in zip(sums, grads, strict=True):
                added = grad * tf.cast(rows, grad.dtype)
                if take is not None:
                    added = tf.where(take, added, tf.zeros_like(added))
                total.assign_add(added)
        counted = tf.ones([], tf.int64) if take is None else tf.cast(take, tf.int64)
        self.rows.assign_add(rows * tf.cast(counted, tf.float32))
        self.turns.assign_add(counted)

    def mean_gradients(self) -> list[list[tf.Tensor]]:
        """Each beat's summed gradients over the rows summed: the update's gradients."""
        rows = self.rows.read_value()
        return [[s.read_value() / tf.cast(rows, s.dtype) for s in sums] for sums in self.sums]

    def reset(self) -> None:
        """Empty the sums (in the update that applies them)."""
        for sums in self.sums:
            for total in sums:
                total.assign(tf.zeros_like(total))
        self.rows.assign(0.0)
        self.turns.assign(tf.zeros([], tf.int64))

    def applying(self, apply: Callable[[list], None]) -> Callable[[], None]:
        """The update of the sums: ``apply(gradients)`` on their mean, then empty them."""

        def run() -> None:
            apply(self.mean_gradients())
            self.reset()

        return run
