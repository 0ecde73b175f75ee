"""The risk-weighted recipe: every sample's loss weighted by its risk, gradients clipped.

The bank case of the design brief: a few high-risk samples can blow the gradient up; each
batch weights its per-sample losses by a risk weight and the beat clips the gradients
(per tensor by default) before the optimizer applies them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import attrs
import keras
import tensorflow as tf

from beatloop import (
    Beat,
    ClipByGlobalNorm,
    ClipByNorm,
    DataSplit,
    ModelCalls,
    Recipe,
    Schedule,
    choice,
    setting,
)
from beatloop import datasets as data
from beatloop.layers import inputs_like, joined_features
from beatloop.metrics import KSStatistic

_positive = attrs.validators.gt(0)
OPTIMIZERS = {"sgd": keras.optimizers.SGD, "adam": keras.optimizers.Adam}


@attrs.frozen
class RiskWeightedConfig:
    """Settings of the risk-weighted recipe. ``risk``: a function of the batch (a dict of
    tensors) giving one weight per sample; ``None`` reads the batch's ``risk`` entry."""

    hidden: int = setting(32, "width of the hidden Dense layer", _positive)
    classes: int = setting(
        2, "2: binary (sigmoid); more: multi-class (softmax)", attrs.validators.ge(2)
    )
    clip: Literal["norm", "global_norm", "none"] = choice(
        "norm", ("norm", "global_norm", "none"), "norm (per tensor), global_norm, or none"
    )
    clip_norm: float = setting(1.0, "the clipping threshold", _positive)
    optimizer: Literal["sgd", "adam"] = choice("sgd", tuple(OPTIMIZERS), "sgd or adam")
    learning_rate: float = setting(0.05, "the optimizer's learning rate", _positive)
    batch_size: int = setting(32, "batch size of the built-in data", _positive)
    validation_fraction: float = setting(
        0.25,
        "share of the built-in data held out for validation (stratified)",
        [attrs.validators.gt(0), attrs.validators.lt(1)],
    )
    risk: Callable[..., tf.Tensor] | None = setting(
        None,
        "a function of the batch (a dict of tensors) giving one weight per sample, Python"
        " only; None reads the batch's risk key",
    )


def weighted_mean(losses: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    """``sum(w * loss) / (number of samples with w > 0)``: a weight-0 sample changes
    nothing (as if it were not in the batch), and scaling every weight scales the loss."""
    weights = tf.cast(weights, losses.dtype)
    carrying = tf.reduce_sum(tf.cast(weights > 0, losses.dtype))
    return tf.reduce_sum(weights * losses) / tf.maximum(carrying, 1.0)


class RiskWeighted(Recipe):
    """Classification with per-sample risk weights and clipped gradients (breast cancer)."""

    name = "risk_weighted"
    autograph = False  # no Python control flow on tensors: traced as written
    primary_model = "model"
    quality_figure = ("val_auc", "max")
    Config = RiskWeightedConfig

    @property
    def batch_keys(self) -> dict[str, int]:  # the risk comes from the data unless a function
        keys = {"x": 2, "y": 1}
        return keys if self.config.risk is not None else {**keys, "risk": 1}

    @property
    def binary(self) -> bool:
        return self.config.classes == 2

    def default_data(self, seed: int) -> DataSplit:
        train, validation = data.breast_cancer_arrays(seed, self.config.validation_fraction)
        return DataSplit(
            data.batches(train, self.config.batch_size, shuffle_seed=seed),
            data.batches(validation, self.config.batch_size),
        )

    def label_classes(self) -> dict[str, str]:
        return {"y": "classes"}  # out of range only matters with more than two classes

    def build_models(self, batch_spec: Mapping[str, tf.TensorSpec]) -> dict[str, keras.Layer]:
        outputs = 1 if self.binary else self.config.classes
        x = batch_spec["x"]
        if isinstance(x, Mapping | tuple | list):  # named inputs: one dense row of them all
            inputs = inputs_like(x)
            hidden = keras.layers.Dense(self.config.hidden, activation="relu")
            logits = keras.layers.Dense(outputs)(hidden(joined_features(inputs)))
            return {"model": keras.Model(inputs, logits, name="classifier")}
        model = keras.Sequential(
            [
                keras.Input(tuple(batch_spec["x"].shape[1:])),
                keras.layers.Dense(self.config.hidden, activation="relu"),
                keras.layers.Dense(outputs),
            ],
            name="classifier",
        )
        return {"model": model}

    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        return {"optimizer": OPTIMIZERS[self.config.optimizer](self.config.learning_rate)}

    def schedule(self) -> Schedule:
        transform = {
            "norm": ClipByNorm(self.config.clip_norm),
            "global_norm": ClipByGlobalNorm(self.config.clip_norm),
            "none": None,
        }[self.config.clip]
        return Schedule(
            Beat(loss="loss", optimizer="optimizer", updates="model", transform=transform)
        )

    def losses(self):
        return {"loss": self.weighted_loss}

    def risk_weights(self, batch) -> tf.Tensor:
        risk = batch["risk"] if self.config.risk is None else self.config.risk(batch)
        return tf.reshape(tf.cast(risk, tf.float32), [-1])

    def per_sample_loss(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        labels = tf.reshape(labels, [-1])
        if self.binary:
            return tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.cast(labels, tf.float32), logits=logits[:, 0]
            )
        return tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.cast(labels, tf.int32), logits=logits
        )

    def weighted_loss(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        logits = models["model"](batch["x"])
        losses = self.per_sample_loss(logits, batch["y"])
        return {"loss": weighted_mean(losses, self.risk_weights(batch)), "logits": logits}

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        if self.binary:
            return {"auc": keras.metrics.AUC(name="auc"), "ks": KSStatistic(name="ks")}
        return {
            "auc": keras.metrics.AUC(name="auc", multi_label=True, num_labels=self.config.classes)
        }

    def update_metrics(self, metrics, batch, outputs) -> None:
        logits = outputs["loss"]["logits"]
        labels = tf.reshape(batch["y"], [-1])
        if self.binary:
            scores = tf.sigmoid(logits[:, 0])
            metrics["auc"].update_state(labels, scores)
            metrics["ks"].update_state(labels, scores)
        else:
            one_hot = tf.one_hot(tf.cast(labels, tf.int32), self.config.classes)
            metrics["auc"].update_state(one_hot, tf.nn.softmax(logits))

    def inference_models(self, models):
        return {"model": models["model"]}
