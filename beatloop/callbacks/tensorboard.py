"""TensorBoard logging: every logged figure per epoch (and the training figures every N
steps), each optimizer's learning rate, and the pictures a recipe saves."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import tensorflow as tf

from beatloop import Callback, ConfigError, EventFilter, Order, Run


class TensorBoard(Callback):
    """Writes event files to ``log_dir`` (default ``RUN_DIR/tensorboard``).

    Per epoch (step = epochs completed): every log as ``epoch/NAME``, each optimizer's
    learning rate as ``learning_rate/NAME``, and each PNG artifact (a sample grid, a
    stylised image) as ``images/NAME``. With ``update_every=N``, the training figures
    also as ``step/NAME`` every N steps (read between compiled calls, so at the first
    execution end at or past each multiple of N: an event filter).
    """

    callback_name = "tensorboard"
    order = Order.WRITER

    def __init__(self, log_dir: str | Path | None = None, update_every: int | None = None):
        if update_every is not None and update_every < 1:
            raise ConfigError(f"TensorBoard update_every must be >= 1, got {update_every}")
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.update_every = update_every
        self._writer = None
        if update_every is not None:
            self.filters = {"execution_end": EventFilter(every=update_every)}

    def on_fit_start(self, run: Run) -> None:
        if self.log_dir is None:
            if run.run_dir is None:
                raise ConfigError("TensorBoard needs a log_dir or a run with a run_dir")
            self.log_dir = Path(run.run_dir) / "tensorboard"
        self._writer = tf.summary.create_file_writer(str(self.log_dir))

    def on_execution_end(self, run: Run, steps: int, logs: Mapping[str, float]) -> None:
        if self.update_every is None:
            return
        with self._writer.as_default(step=run.step):
            for name in logs:
                tf.summary.scalar(f"step/{name}", logs[name])

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        with self._writer.as_default(step=epoch + 1):
            for name, value in logs.items():
                tf.summary.scalar(f"epoch/{name}", value)
            for name, optimizer in run.optimizers.items():
                tf.summary.scalar(f"learning_rate/{name}", float(optimizer.learning_rate))
            for name, path in run.artifacts.items():
                if Path(path).suffix.lower() == ".png":
                    picture = tf.io.decode_png(tf.io.read_file(str(path)))
                    tf.summary.image(f"images/{name}", picture[None])
        self._writer.flush()

    def on_fit_end(self, run: Run, logs: Mapping[str, float]) -> None:
        self._close()

    def on_exception(self, run: Run, error: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``log_dir``: tag -> [(step, value)]."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "scalars":
                    number = float(np.asarray(tf.make_ndarray(value.tensor)))
                    scalars.setdefault(value.tag, []).append((event.step, number))
    return scalars
