"""The engine's own counters and the metrics a run accumulates.

The engine, not the optimizers, owns the step count: ``optimizer.iterations`` counts
applies, which differ from steps as soon as a beat repeats.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import keras
import tensorflow as tf


class EngineState(tf.Module):
    """The run's counters, as variables so compiled code can advance them and a
    checkpoint holds them with the weights they describe.

    ``step``, ``epoch`` and ``examples`` count training. The data position is
    ``streams`` (training iterators opened so far), ``stream_batches`` (batches taken
    from the current one) and ``epoch_batches`` (batches taken this epoch, skipped ones
    included): enough to rebuild the iterator at the same batch after a restart.
    """

    def __init__(self):
        super().__init__(name="engine_state")
        counter = lambda name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name)  # noqa: E731
        self.step = counter("step")
        self.epoch = counter("epoch")
        self.examples = counter("examples")
        self.streams = counter("streams")
        self.stream_batches = counter("stream_batches")
        self.epoch_batches = counter("epoch_batches")

    def position(self) -> dict[str, int]:
        """All counters as Python ints (reads variables: call between compiled calls)."""
        names = ("step", "epoch", "examples", "streams", "stream_batches", "epoch_batches")
        return {name: int(getattr(self, name)) for name in names}


class StepMetrics:
    """One mean per beat loss plus the recipe's metrics, logged under ``prefix`` + name."""

    def __init__(
        self,
        beat_names: Iterable[str],
        metrics: Mapping[str, keras.metrics.Metric],
        prefix: str = "",
    ):
        self.prefix = prefix
        self.losses = {name: keras.metrics.Mean(name=prefix + name) for name in beat_names}
        self.metrics = dict(metrics)
        self._named: dict[str, keras.metrics.Metric] | None = None

    def reset(self) -> None:
        for metric in (*self.losses.values(), *self.metrics.values()):
            metric.reset_state()

    def named(self) -> dict[str, keras.metrics.Metric]:
        """Every metric under its logged name (``prefix`` + name); built once, as the
        engine asks for it after every compiled call."""
        if self._named is None:
            pairs = (*self.losses.items(), *self.metrics.items())
            self._named = {self.prefix + name: metric for name, metric in pairs}
        return self._named

    def variables(self) -> list:
        """Every metric's state variables, for checkpoints (Keras 3 metrics are not
        TensorFlow trackables themselves; their variables are)."""
        return [v for metric in self.named().values() for v in metric.variables]

    def results(self) -> dict[str, float]:
        """Current values as Python floats (reads variables: call between compiled calls)."""
        return {name: float(metric.result()) for name, metric in self.named().items()}
