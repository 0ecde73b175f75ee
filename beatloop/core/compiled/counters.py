"""The run's counters: steps, epochs, examples and the position in the training data.

The engine, not the optimizers, owns the step count: ``optimizer.iterations`` counts
applies, which differ from steps as soon as a beat repeats. Every change to a counter
goes through a method of ``Counters``, so there is one place that says how they move.
"""

from __future__ import annotations

import tensorflow as tf

# The names the counters have in a checkpoint (kept from the first checkpoint format:
# a "stream" there is what the code now calls a pass).
_CHECKPOINT_NAMES = {
    "step": "step",
    "epoch": "epoch",
    "examples": "examples",
    "passes": "streams",
    "pass_batches": "stream_batches",
    "epoch_batches": "epoch_batches",
}


def _counter(name: str) -> tf.Variable:
    return tf.Variable(0, dtype=tf.int64, trainable=False, name=name)


class Counters:
    """The run's counters, as variables so compiled code can advance them and a
    checkpoint holds them with the weights they describe.

    ``step``, ``epoch`` and ``examples`` count training. The data position is
    ``passes`` (passes over the training data opened so far), ``pass_batches`` (batches
    taken from the current pass; -1 between passes) and ``epoch_batches`` (batches taken
    this epoch, skipped ones included): enough to rebuild the iterator at the same batch
    after a restart.
    """

    NAMES = tuple(_CHECKPOINT_NAMES)

    def __init__(self):
        for name in self.NAMES:
            setattr(self, name, _counter(name))

    def advance(self, steps: tf.Tensor, examples: tf.Tensor) -> None:
        """Count ``steps`` training steps over ``examples`` examples (in compiled code,
        once per compiled call)."""
        steps = tf.cast(steps, tf.int64)
        self.step.assign_add(steps)
        self.examples.assign_add(tf.cast(examples, tf.int64))
        self.pass_batches.assign_add(steps)
        self.epoch_batches.assign_add(steps)

    def open_pass(self) -> None:
        """A new pass over the training data starts."""
        self.passes.assign_add(1)
        self.pass_batches.assign(0)

    def close_pass(self) -> None:
        """The current pass is over (its iterator is let go)."""
        self.pass_batches.assign(-1)

    def end_epoch(self) -> None:
        self.epoch.assign_add(1)
        self.epoch_batches.assign(0)

    def move_data_to(self, position: dict[str, int]) -> None:
        """Put the data position (passes, pass and epoch batches) back where ``position``
        (from ``position``) says, keeping the other counters."""
        for name in ("passes", "pass_batches", "epoch_batches"):
            getattr(self, name).assign(position[name])

    def position(self) -> dict[str, int]:
        """All counters as Python ints (reads variables: call between compiled calls)."""
        return {name: int(getattr(self, name)) for name in self.NAMES}

    def where(self) -> str:
        """Where the run is, in the words every message uses (epochs counted from 1, as
        the progress lines and ``history.jsonl`` count them): ``step 30, in epoch 2``
        within an epoch, ``step 23, end of epoch 1`` between epochs (reads variables)."""
        step, epoch = int(self.step), int(self.epoch)
        if int(self.epoch_batches) > 0:
            return f"step {step}, in epoch {epoch + 1}"
        if epoch == 0:
            return f"step {step}, before epoch 1"
        return f"step {step}, end of epoch {epoch}"

    def checkpointed(self) -> dict[str, tf.Variable]:
        """The counter variables under the names checkpoints store them by."""
        return {stored: getattr(self, name) for name, stored in _CHECKPOINT_NAMES.items()}
