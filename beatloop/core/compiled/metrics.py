"""The metrics a run accumulates, and the logs read from them.

Per beat a mean of its loss (and, in training, its last step's value), plus the
recipe's own metrics; logged under a prefix (``val_`` for validation) and the name.
Reading a metric costs a tensor read, so logs between compiled calls are read only when
a callback looks (``LazyLogs``).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Mapping

import keras
import tensorflow as tf

#: Prefix of the last step's value of a beat's loss in ``on_execution_end``'s logs.
LAST = "last_"
#: Suffix of the figure that counts a gated beat's updates in an epoch (``only_if``,
#: ``accumulate``).
UPDATES = "_updates"


class LastValue(keras.metrics.Metric):
    """The batch-size-weighted value of the last update only: what a custom
    ``train_step`` returning its raw loss shows. Summed over replicas like a mean (each
    replica's value times its rows, over all rows), so it is the global batch's value."""

    def __init__(self, name: str):
        super().__init__(name=name)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, value, sample_weight=1.0):
        weight = keras.ops.cast(sample_weight, self.dtype)
        self.take(keras.ops.cast(value, self.dtype), weight)

    def take(self, value, weight) -> None:
        """``update_state`` for a value and weight already in the metric's dtype."""
        self.total.assign(value * weight)
        self.count.assign(weight)

    def result(self):
        return keras.ops.divide_no_nan(self.total, self.count)


class StepMetrics:
    """One mean per beat loss plus the recipe's metrics, logged under ``prefix`` + name.

    With ``last`` (training), each beat's last step's value too: logged instead of the
    mean for the beats named in ``last_logged`` (``Beat(log="last")``), and offered to
    ``on_execution_end`` as ``last_`` + name for every beat. The beats named in
    ``counted`` (those with ``only_if`` or ``accumulate``) also log how many updates they
    made, as name + ``_updates``."""

    def __init__(
        self,
        beat_names: Iterable[str],
        metrics: Mapping[str, keras.metrics.Metric],
        prefix: str = "",
        *,
        last: bool = False,
        last_logged: Iterable[str] = (),
        counted: Iterable[str] = (),
    ):
        beat_names = list(beat_names)
        self.prefix = prefix
        self._beats = beat_names
        self.losses = {name: keras.metrics.Mean(name=prefix + name) for name in beat_names}
        self.last = {name: LastValue(name=LAST + name) for name in beat_names} if last else {}
        self.updates = {name: keras.metrics.Sum(name=name + UPDATES) for name in counted}
        self.metrics = dict(metrics)
        last_logged = set(last_logged)
        logged = {
            name: self.last[name] if name in last_logged else mean
            for name, mean in self.losses.items()
        }
        logged |= {name + UPDATES: count for name, count in self.updates.items()}
        pairs = (*logged.items(), *self.metrics.items())
        self._named = {prefix + name: metric for name, metric in pairs}
        self._with_last = self._named | {LAST + name: m for name, m in self.last.items()}

    def only(self, beat_names: Iterable[str]) -> StepMetrics:
        """The same metrics, logging only ``beat_names``' figures and the recipe's (what
        one phase of a run logs: its own beats')."""
        beat_names = list(beat_names)
        keep = {self.prefix + name for name in beat_names} | {
            self.prefix + name for name in self.metrics
        }
        keep |= {self.prefix + name + UPDATES for name in beat_names}
        kept = {LAST + name for name in beat_names}
        view = copy.copy(self)
        view._beats = [name for name in self._beats if name in beat_names]
        view._named = {name: m for name, m in self._named.items() if name in keep}
        view._with_last = view._named | {
            name: m for name, m in self._with_last.items() if name in kept
        }
        return view

    def update_loss(self, beat_name: str, loss, size) -> None:
        """Take one beat's loss on a batch of ``size`` rows (in compiled code).

        A scalar loss goes straight into the mean's two variables, as
        ``Mean.update_state`` would put it (``loss * size``, ``size``: the same values,
        bit for bit) without its broadcasts and reductions of a scalar; the weight is
        cast once for the mean and the last value."""
        mean = self.losses[beat_name]
        if getattr(loss, "shape", None) is None or loss.shape.rank != 0:
            mean.update_state(loss, sample_weight=size)
            if self.last:
                self.last[beat_name].update_state(loss, sample_weight=size)
            return
        value = tf.cast(loss, mean.dtype)
        weight = tf.cast(size, mean.dtype)
        mean.total.assign_add(value * weight)
        mean.count.assign_add(weight)
        if self.last:
            self.last[beat_name].take(value, weight)

    def count_updates(self, beats, count: tf.Tensor) -> None:
        """Add ``count`` (1.0 or 0.0: whether they updated) to the beats' update counts
        (in compiled code)."""
        for beat in beats:
            self.updates[beat.name].update_state(count)

    def reset(self) -> None:
        """Start the means, update counts and the recipe's metrics again (each epoch);
        the last values stay, so a beat with ``every=n`` shows the last step it ran."""
        for metric in (*self.losses.values(), *self.updates.values(), *self.metrics.values()):
            metric.reset_state()

    def named(self, last: bool = False) -> dict[str, keras.metrics.Metric]:
        """Every logged metric under its logged name (``prefix`` + name); with ``last``
        also each beat's last step's value under ``last_`` + name."""
        return self._with_last if last else self._named

    def variables(self) -> list:
        """The means' and the recipe's metrics' state variables, for checkpoints (Keras 3
        metrics are not TensorFlow trackables themselves; their variables are)."""
        metrics = (*self.losses.values(), *self.updates.values(), *self.metrics.values())
        return [v for metric in metrics for v in metric.variables]

    def last_variables(self) -> list:
        """The last values' state variables, checkpointed apart (older checkpoints lack
        them)."""
        return [v for metric in self.last.values() for v in metric.variables]

    def results(self) -> dict[str, float]:
        """Current values as Python floats (reads variables: call between compiled calls)."""
        return {name: float(metric.result()) for name, metric in self._named.items()}

    def epoch_results(self) -> tuple[dict[str, float], list[str]]:
        """An epoch's figures, and the names of those left out as missing: a mean over
        no step (a beat that did not run this epoch, a mean metric never updated) has no
        value; an epoch in which no beat ran (a rollback skipped all its batches) has
        none but its update counts, which truly are 0."""
        beats = [self.losses[name] for name in self._beats]
        trained = not beats or any(_read(mean.count) > 0 for mean in beats)
        counts = {self.prefix + name + UPDATES for name in self.updates}
        missing = [
            name
            for name, metric in self._named.items()
            if name not in counts and (not trained or _empty(metric))
        ]
        logs = {n: float(m.result()) for n, m in self._named.items() if n not in missing}
        return logs, missing


def _empty(metric: keras.metrics.Metric) -> bool:
    """Whether ``metric`` is a mean over nothing (its ``result()`` a made-up 0)."""
    return isinstance(metric, keras.metrics.Mean) and not _read(metric.count)


def _read(variable) -> float:
    """A metric variable's value (summed over replicas under a strategy)."""
    return float(tf.convert_to_tensor(variable))


def epoch_figures(metrics: StepMetrics, run, epoch: int) -> dict[str, float]:
    """Epoch ``epoch``'s training figures (``epoch_results``), the missing ones named in
    ``run.missing_figures``; an epoch that trained no step (every beat's figure missing:
    a rollback skipped all its batches) is said in a warning."""
    logs, run.missing_figures = metrics.epoch_results()
    missing = run.missing_figures
    if missing and all(beat.name in missing for beat in run.bound.beats):
        warnings.warn(
            f"epoch {epoch + 1} trained no step (a rollback skipped every batch it took): "
            f"its training figures ({', '.join(missing)}) are missing from its logs, "
            "history.jsonl and trackers, and keep_best, compare and tune pass over them; "
            "its validation, if any, ran on the models the rollback restored",
            RuntimeWarning,
            stacklevel=4,
        )
    return logs


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

    def get(self, key: str, default=None):
        """``logs[key]`` (read now), or ``default`` when no figure is named ``key``."""
        return self[key] if key in self._metrics else default
