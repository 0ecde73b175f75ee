"""A callback a run can name: ``beatloop run RECIPE --callback epoch_timer``."""

import sys
import time

import beatloop


class EpochTimer(beatloop.Callback):
    """Records each epoch's wall time and steps/second, and prints them."""

    callback_name = "epoch_timer"

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.seconds: list[float] = []
        self.steps_per_second: list[float] = []

    def on_epoch_start(self, run, epoch):
        self._started, self._step = time.perf_counter(), run.step

    def on_epoch_end(self, run, epoch, logs):
        seconds = time.perf_counter() - self._started
        rate = (run.step - self._step) / seconds
        self.seconds.append(seconds)
        self.steps_per_second.append(rate)
        print(f"epoch {epoch + 1}: {seconds:.2f} s, {rate:,.0f} steps/s", file=self.stream)
