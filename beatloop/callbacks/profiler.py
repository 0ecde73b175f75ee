"""A TensorFlow profiler trace of a range of training steps, for TensorBoard's profile
tab (``fit(profile=(20, 30))``, ``beatloop run --profile 20:30``)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

import tensorflow as tf

from beatloop import Callback, ConfigError, IgnoredSettingWarning, Order, Run


def profile_range(value) -> tuple[int, int]:
    """``(start, stop)`` from a pair or ``"START:STOP"``: steps ``start`` to
    ``stop - 1``, counted from 0 over the run; a clear ConfigError otherwise."""
    text = value
    if isinstance(value, str):
        start, colon, stop = value.partition(":")
        value = (start, stop) if colon else ()
    try:
        start, stop = (int(edge) for edge in value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"profile must be a range of steps, START:STOP or (start, stop), e.g. 20:30 "
            f"(steps 20 to 29); got {text!r}"
        ) from None
    if not 0 <= start < stop:
        raise ConfigError(
            f"profile needs 0 <= start < stop (steps start to stop - 1, counted from 0 over "
            f"the run); got {start}:{stop}"
        )
    return start, stop


class Profiler(Callback):
    """Records a TensorFlow profiler trace of training steps ``start`` to ``stop - 1``
    (counted from 0 over the run, across epochs and resumes) into ``log_dir`` (default
    ``RUN_DIR/tensorboard``): TensorBoard's profile tab shows it.

    A compiled call runs several steps at once, so the run ends a call at ``start`` and
    at ``stop`` (``next_boundary``): the trace holds exactly those steps at any
    ``steps_per_execution`` (calls inside the range keep their K; the weights do not
    depend on where calls end). A range a resumed run has partly passed is traced from
    the resume on; one it has wholly passed, or one past the run's last step (known at
    the end of its first epoch), records nothing and is warned of
    (``IgnoredSettingWarning``).
    """

    callback_name = "profile"
    order = Order.WRITER

    def __init__(self, steps: tuple[int, int] | str = (10, 20), log_dir: str | Path | None = None):
        self.start, self.stop = profile_range(steps)
        self.log_dir = None if log_dir is None else Path(log_dir)
        self._tracing = False
        #: The first step of the first epoch this process runs; ``None`` once judged.
        self._epoch_from: int | None = None
        #: The steps the trace holds, once recorded: ``(first, last + 1)``.
        self.traced: tuple[int, int] | None = None

    def on_fit_start(self, run: Run) -> None:
        if self.log_dir is None:
            if run.run_dir is None:
                raise ConfigError(
                    "profile needs a run with a run_dir (its trace goes to RUN_DIR/tensorboard) "
                    "or a Profiler(log_dir=...)"
                )
            self.log_dir = Path(run.run_dir) / "tensorboard"
        self._epoch_from = run.step - int(run.counters.epoch_batches)
        if run.step >= self.stop:
            self._ignored(f"this run resumed at step {run.step}, after it; give a range from "
                          f"step {run.step} on")  # fmt: skip

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        if self._epoch_from is None:
            return
        steps, self._epoch_from = run.step - self._epoch_from, None
        last = run.step + (run.epochs - run.epoch) * steps - 1
        if self.start > last:
            self._ignored(f"the run's steps are 0 to {last} ({run.epochs} epochs of {steps}); "
                          f"give a range below {last + 1}")  # fmt: skip

    def _ignored(self, why: str) -> None:
        """Warn that the range traces nothing, and forget it."""
        self._epoch_from = None
        warnings.warn(
            f"profile {self.start}:{self.stop} traces nothing: {why}",
            IgnoredSettingWarning,
            stacklevel=3,
        )

    def next_boundary(self, run: Run) -> int | None:
        step = run.step
        return next((edge for edge in (self.start, self.stop) if edge > step), None)

    def on_execution_start(self, run: Run) -> None:
        step = run.step
        if not self._tracing and self.start <= step < self.stop:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            tf.profiler.experimental.start(str(self.log_dir))
            self._tracing, self._first = True, step

    def on_execution_end(self, run: Run, steps: int, logs: Mapping[str, float]) -> None:
        if self._tracing and run.step >= self.stop:
            self._finish(run)

    def on_fit_end(self, run: Run, logs: Mapping[str, float]) -> None:
        self._finish(run)

    def on_exception(self, run: Run, error: BaseException) -> None:
        self._finish(run)

    def _finish(self, run: Run) -> None:
        """Stop the profiler and write its trace, if it is recording."""
        if self._tracing:
            self._tracing = False
            tf.profiler.experimental.stop()
            self.traced = (self._first, run.step)
