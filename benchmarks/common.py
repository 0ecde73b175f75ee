"""Pieces the benchmark scripts share (run them as ``python benchmarks/NAME.py``)."""

from __future__ import annotations

import statistics
import time

import beatloop


class EpochTimer(beatloop.Callback):
    """Wall time of each epoch of a beatloop run (validation and epoch figures included)."""

    def __init__(self):
        self.times: list[float] = []

    def on_epoch_start(self, run, epoch):
        self._start = time.perf_counter()

    def on_epoch_end(self, run, epoch, logs):
        self.times.append(time.perf_counter() - self._start)

    def rate(self, per_epoch: float) -> float:
        """``per_epoch`` (examples or steps) per second in the median epoch after the
        first (which traces)."""
        return per_epoch / statistics.median(self.times[1:])


class TrainingTimer(beatloop.TrainingTimer):
    """Training time only (see ``beatloop.TrainingTimer``), with a median rate."""

    def rate(self, per_epoch: float) -> float:
        """``per_epoch`` per second in the median epoch after the first (which traces)."""
        return per_epoch / statistics.median(self.epoch_seconds[1:])
