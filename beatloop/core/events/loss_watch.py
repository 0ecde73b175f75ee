"""A run whose loss runs away with the divergence guard off says so once: a one-line
``RunawayLossWarning`` naming the beat, the epoch and the loss.

Decided on the host from figures the run reads anyway (each beat's loss at the end of
the run's first compiled call, then its epoch losses): the compiled step does nothing
for it. With the guard on (``divergence=``) the guard stops such a run instead, and no
watch is added.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

from beatloop.core.compiled.metrics import LAST
from beatloop.core.compiled.numerics import runaway_words
from beatloop.core.events.callbacks import Callback, Order
from beatloop.core.events.run import Run
from beatloop.core.failures.errors import RunawayLossWarning


class LossWatch(Callback):
    """Warns once per run when a beat's epoch loss ran away (``numerics.runaway_words``):
    compared with the beat's loss at the end of the run's first compiled call (for a
    resumed run, with its first epoch's loss in this process)."""

    #: After the writers: the epoch's progress line comes first, then the warning.
    order = Order.WRITER + 1

    def __init__(self, beats: Sequence[str]):
        self.beats = tuple(beats)
        self.first: dict[str, float] = {}
        self.warned = False
        self._started = False

    def on_execution_end(self, run: Run, steps: int, logs: Mapping[str, float]) -> None:
        # Runs after every call: one flag, not a filter (``when`` reads the step counter,
        # a variable, at each call, which a run of one step per call would feel).
        if self._started:
            return
        self._started = True
        if run.step != steps:  # resumed: compared with its first epoch's loss instead
            return
        for beat in self.beats:
            value = logs.get(LAST + beat)
            if value is not None and math.isfinite(value):
                self.first[beat] = value

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        if self.warned:
            return
        for beat in self.beats:
            loss = logs.get(beat)
            if loss is None:
                continue
            self.first.setdefault(beat, loss)
            words = runaway_words(beat, epoch, float(loss), self.first[beat])
            if words is not None:
                self.warned = True
                warnings.warn(words, RunawayLossWarning, stacklevel=2)
                return


def loss_watches(beats: Sequence, divergence: float | None) -> list[Callback]:
    """The run's loss watch over the bound ``beats``; none with the divergence guard on."""
    return [] if divergence is not None else [LossWatch([beat.name for beat in beats])]
