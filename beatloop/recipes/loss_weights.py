"""Loss weightings shared by the recipes that sum several task losses (``multitask``,
``recommender``): the weights as a model the compiled step reads, the weighted loss of one
task, and Dynamic Weight Average's end-of-epoch update.

Three weightings. ``fixed``: the configured weights. ``uncertainty``: Kendall, Gal &
Cipolla, "Multi-Task Learning Using Uncertainty to Weigh Losses" (CVPR 2018): each task
has a learned log-variance ``s`` and contributes ``exp(-s) * L + s``; the ``s`` are
variables like any other, updated by the beats. ``dwa``: Dynamic Weight Average, Liu,
Johns & Davison, "End-to-End Multi-Task Learning with Attention" (CVPR 2019): after each
epoch ``w_i = N * softmax_i(r_i / T)`` with ``r_i = L_i(t-1) / L_i(t-2)``, weights 1 for
the first two epochs, set at epoch end by a callback, not by an optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import keras
import tensorflow as tf

from beatloop import Callback, ModelCalls, Order, Run
from beatloop.layers import VariableLayer

WEIGHTINGS = ("fixed", "uncertainty", "dwa")
WEIGHTING_HELP = "fixed, uncertainty (Kendall et al. 2018) or dwa (Dynamic Weight Average)"


def non_negative(instance, attribute, value) -> None:
    """The ``weights`` config field's validator: finite weights of at least 0 (a
    negative weight makes the step maximise its task's loss)."""
    if any(not math.isfinite(w) or w < 0 for w in value):
        raise ValueError(
            f"{attribute.name} takes finite loss weights of at least 0, got {list(value)}: "
            "a negative weight makes each step maximise its task's loss"
        )


class LogVariances(keras.layers.Layer):
    """One learned log-variance ``s`` per task (uncertainty weighting), each its own
    variable so a task's beat can own its own."""

    def __init__(self, task_names: list[str], **kwargs):
        super().__init__(**kwargs)
        self.log_variances = {
            name: self.add_weight(shape=(), initializer="zeros", name=f"log_var_{name}")
            for name in task_names
        }
        self.built = True

    def call(self, inputs):
        return inputs


def weight_models(
    weighting: str, task_names: list[str], weights: Sequence[float]
) -> dict[str, keras.Layer]:
    """``loss_weights`` (the fixed or DWA weights, all 1 unless ``weights`` gives them)
    and, for ``uncertainty``, ``uncertainty`` (the learned log-variances)."""
    initial = list(weights) or [1.0] * len(task_names)
    # A non-trainable variable, so the compiled step reads weights DWA changes.
    models: dict[str, keras.Layer] = {
        "loss_weights": VariableLayer(
            initial, trainable=False, variable_name="values", name="loss_weights"
        )
    }
    if weighting == "uncertainty":
        models["uncertainty"] = LogVariances(task_names, name="uncertainty")
    return models


def weighted(
    models: ModelCalls, weighting: str, index: int, name: str, loss: tf.Tensor
) -> tf.Tensor:
    """Task ``name``'s (the ``index``-th) contribution to the total loss."""
    if weighting == "uncertainty":
        s = models.raw("uncertainty").log_variances[name]
        return tf.exp(-s) * loss + s
    return models.raw("loss_weights").variable[index] * loss


def current_weights(
    models: Mapping[str, keras.Layer], weighting: str, task_names: list[str]
) -> dict[str, float]:
    """The weight each task's loss has now (``exp(-s)`` for uncertainty)."""
    if weighting == "uncertainty":
        log_variances = models["uncertainty"].log_variances
        return {name: math.exp(-float(log_variances[name])) for name in task_names}
    values = models["loss_weights"].variable.numpy()
    return {name: float(v) for name, v in zip(task_names, values, strict=True)}


def dwa_weights(previous: list[float], before: list[float], temperature: float) -> list[float]:
    """Liu et al.'s DWA: ``N * softmax(r / T)`` with ``r_i = L_i(t-1) / L_i(t-2)``."""
    ratios = [p / b for p, b in zip(previous, before, strict=True)]
    exps = [math.exp(r / temperature) for r in ratios]
    return [len(exps) * e / sum(exps) for e in exps]


class DynamicWeightAverage(Callback):
    """Sets the task weights for the next epoch from the last two epochs' task losses,
    logged as ``NAME_loss`` (after the epoch's figures logged the weights it ran with)."""

    order = Order.PRODUCER

    def __init__(self, task_names: Callable[[], list[str]], temperature: Callable[[], float]):
        self.task_names, self.temperature = task_names, temperature
        self.losses: list[list[float]] = []

    def on_epoch_end(self, run: Run, epoch: int, logs) -> None:
        names = [f"{name}_loss" for name in self.task_names()]
        if any(name in run.missing_figures for name in names):  # nothing trained: kept
            return
        self.losses.append([logs[name] for name in names])
        if len(self.losses) >= 2:
            weights = dwa_weights(self.losses[-1], self.losses[-2], self.temperature())
            run.models["loss_weights"].variable.assign(weights)

    def checkpoint_state(self) -> dict:
        return {"losses": self.losses}

    def restore_state(self, state: dict) -> None:
        self.losses = [list(row) for row in state["losses"]]
