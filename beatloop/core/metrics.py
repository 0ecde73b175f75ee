"""The metrics a run accumulates, and the logs read from them.

Per beat a mean of its loss, plus the recipe's own metrics; logged under a prefix
(``val_`` for validation) and the name. Reading a metric costs a tensor read, so logs
between compiled calls are read only when a callback looks (:class:`LazyLogs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import keras


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
        pairs = (*self.losses.items(), *self.metrics.items())
        self._named = {prefix + name: metric for name, metric in pairs}

    def reset(self) -> None:
        for metric in self._named.values():
            metric.reset_state()

    def named(self) -> dict[str, keras.metrics.Metric]:
        """Every metric under its logged name (``prefix`` + name)."""
        return self._named

    def variables(self) -> list:
        """Every metric's state variables, for checkpoints (Keras 3 metrics are not
        TensorFlow trackables themselves; their variables are)."""
        return [v for metric in self._named.values() for v in metric.variables]

    def results(self) -> dict[str, float]:
        """Current values as Python floats (reads variables: call between compiled calls)."""
        return {name: float(metric.result()) for name, metric in self._named.items()}


class LazyLogs(Mapping[str, float]):
    """Logs read from their metrics only when, and only as far as, a callback looks: a
    callback that ignores them costs nothing, one that reads ``loss`` pays for ``loss``."""

    def __init__(self, metrics: Mapping[str, keras.metrics.Metric]):
        self._metrics = metrics
        self._values: dict[str, float] = {}

    def __getitem__(self, key: str) -> float:
        if key not in self._values:
            self._values[key] = float(self._metrics[key].result())
        return self._values[key]

    def __iter__(self):
        return iter(self._metrics)

    def __len__(self) -> int:
        return len(self._metrics)
