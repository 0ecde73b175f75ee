"""The engine's own counters and the metrics a run accumulates.

The engine, not the optimizers, owns the step count: ``optimizer.iterations`` counts
applies, which differ from steps as soon as a beat repeats.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import keras
import tensorflow as tf


class EngineState(tf.Module):
    """Step, epoch and example counters, as variables so compiled code can advance them
    and a checkpoint can hold them."""

    def __init__(self):
        super().__init__(name="engine_state")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.examples = tf.Variable(0, dtype=tf.int64, trainable=False, name="examples")


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

    def reset(self) -> None:
        for metric in (*self.losses.values(), *self.metrics.values()):
            metric.reset_state()

    def named(self) -> dict[str, keras.metrics.Metric]:
        """Every metric under its logged name (``prefix`` + name)."""
        return {self.prefix + name: m for name, m in (*self.losses.items(), *self.metrics.items())}

    def results(self) -> dict[str, float]:
        """Current values as Python floats (reads variables: call between compiled calls)."""
        return {name: float(metric.result()) for name, metric in self.named().items()}
