"""The supervised recipe: one model, one loss, one optimizer — ``fit``'s case, as a
one-beat schedule, and the reference the other recipes are measured against."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import attrs
import keras
import tensorflow as tf

from beatloop import (
    EMA,
    Beat,
    Callback,
    DataSplit,
    ModelCalls,
    Order,
    Recipe,
    Run,
    Schedule,
    choice,
    setting,
)
from beatloop import datasets as data
from beatloop.layers import copy_of, inputs_like, joined_features

OPTIMIZERS = {
    "adam": keras.optimizers.Adam,
    "adamw": keras.optimizers.AdamW,
    "sgd": keras.optimizers.SGD,
    "rmsprop": keras.optimizers.RMSprop,
}

_positive = attrs.validators.gt(0)


@attrs.frozen
class SupervisedConfig:
    """Settings of the supervised recipe."""

    hidden: int = setting(64, "width of the hidden Dense layer (relu)", _positive)
    dropout: float = setting(
        0.0,
        "dropout rate after the hidden layer (0: none)",
        [attrs.validators.ge(0), attrs.validators.lt(1)],
    )
    classes: int = setting(
        10, "number of classes (logits out); labels must lie in [0, classes)", _positive
    )
    optimizer: Literal["adam", "adamw", "sgd", "rmsprop"] = choice(
        "adam", tuple(OPTIMIZERS), "adam, adamw, sgd or rmsprop"
    )
    learning_rate: float = setting(1e-3, "the optimizer's learning rate", _positive)
    batch_size: int = setting(32, "batch size of the built-in data", _positive)
    accumulate: int = setting(
        1, "batches whose gradients make one update (gradient accumulation)", _positive
    )
    ema_decay: float = setting(
        0.0,
        "decay of an average of the model's weights (EMA) that validation, evaluate, "
        "export and keep_best use, val_raw_ figures the model's own (0: none)",
        [attrs.validators.ge(0), attrs.validators.lt(1)],
    )
    validation_fraction: float = setting(
        0.2,
        "share of the built-in data held out for validation",
        [attrs.validators.gt(0), attrs.validators.lt(1)],
    )


class Supervised(Recipe):
    """Classification with one model and sparse cross-entropy (digits by default).

    Batches are ``{"x", "y"}`` (or ``(x, y)`` tuples), optionally with a per-example
    ``sample_weight`` (a third tuple entry) weighting the loss and accuracy as in ``fit``.
    """

    name = "supervised"
    autograph = False  # no Python control flow on tensors: traced as written
    primary_model = "model"
    quality_figure = ("val_accuracy", "max")
    Config = SupervisedConfig
    batch_keys = {"x": 2, "y": 1}

    def default_data(self, seed: int) -> DataSplit:
        return data.digits(seed, self.config.batch_size, self.config.validation_fraction)

    def check_batch_spec(self, spec: Mapping[str, tf.TensorSpec]) -> list[str]:
        y = spec["y"]
        if y.shape.rank is not None and y.shape.rank > 2:
            return [f"'y' must hold class indices of shape (batch,) or (batch, 1), found {y.shape}"]
        if not (y.dtype.is_integer or y.dtype.is_floating):
            return [f"'y' must hold numeric class indices, found dtype {y.dtype.name}"]
        return []

    def label_classes(self) -> dict[str, str]:
        return {"y": "classes"}

    def build_models(self, batch_spec: Mapping[str, tf.TensorSpec]) -> dict[str, keras.Layer]:
        x = batch_spec["x"]
        if isinstance(x, Mapping | tuple | list):  # named inputs: one dense row of them all
            inputs = inputs_like(x)
            hidden = self._hidden_layers(joined_features(inputs))
            return {"model": keras.Model(inputs, hidden, name="classifier")}
        features = tuple(x.shape[1:])
        layers = [keras.Input(shape=features)]
        if len(features) > 1:
            layers.append(keras.layers.Flatten())
        layers.append(keras.layers.Dense(self.config.hidden, activation="relu"))
        if self.config.dropout:
            layers.append(keras.layers.Dropout(self.config.dropout))
        layers.append(keras.layers.Dense(self.config.classes))
        return {"model": keras.Sequential(layers, name="classifier")}

    def _hidden_layers(self, features):
        """The hidden layer, dropout and logits on a row of features (functional)."""
        hidden = keras.layers.Dense(self.config.hidden, activation="relu")(features)
        if self.config.dropout:
            hidden = keras.layers.Dropout(self.config.dropout)(hidden)
        return keras.layers.Dense(self.config.classes)(hidden)

    def derived_models(self, models: Mapping[str, keras.Layer]) -> dict[str, keras.Layer]:
        """With ``ema_decay``, the average: a copy of the model the run trains (the
        user's, when one is passed), its values set as the run starts (``StartAverage``)."""
        if not self.config.ema_decay:
            return {}
        return {"ema": copy_of(models["model"], "ema_decay's average")}

    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        optimizer = OPTIMIZERS[self.config.optimizer](learning_rate=self.config.learning_rate)
        return {"optimizer": optimizer}

    def losses(self):
        return {"loss": self.cross_entropy}

    def schedule(self) -> Schedule:
        accumulate, decay = self.config.accumulate, self.config.ema_decay
        beat = Beat(loss="loss", optimizer="optimizer", updates="model", accumulate=accumulate)
        if not decay:
            return Schedule(beat)
        # Accumulating, the model changes at every N-th batch only: the average follows
        # the beat's updates (a tick per optimizer update), not the batches between them.
        tied = "loss" if accumulate > 1 else None
        return Schedule([beat, EMA("model", "ema", decay, evaluated=True, only_if=tied)])

    def cross_entropy(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        logits = models["model"](batch["x"])
        # The functional loss, reduced here as Keras's "sum_over_batch_size" does: a Loss
        # object would also divide by the replica count under a distribution strategy,
        # where the engine already weights each replica's mean by its share.
        values = keras.losses.sparse_categorical_crossentropy(batch["y"], logits, from_logits=True)
        weight = batch.get("sample_weight")
        if weight is not None:
            values = values * tf.cast(tf.reshape(weight, tf.shape(values)), values.dtype)
        loss = tf.math.divide_no_nan(tf.reduce_sum(values), tf.cast(tf.size(values), values.dtype))
        return {"loss": loss, "logits": logits}

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        return {"accuracy": keras.metrics.SparseCategoricalAccuracy(name="accuracy")}

    def update_metrics(self, metrics, batch, outputs) -> None:
        metrics["accuracy"].update_state(
            batch["y"], outputs["loss"]["logits"], sample_weight=batch.get("sample_weight")
        )

    def inference_models(self, models):
        return {"model": models["model"]}

    def callbacks(self) -> list[Callback]:
        return [StartAverage()] if self.config.ema_decay else []


class StartAverage(Callback):
    """The average (``ema``) starts at the model's values, the model a user passed
    included: set as a fresh run starts, before its first checkpoint (a resumed run's
    comes from its checkpoint)."""

    order = Order.PRODUCER

    def on_fit_start(self, run: Run) -> None:
        if run.step == 0:
            models = run.models
            for average, own in zip(models["ema"].weights, models["model"].weights, strict=True):
                average.assign(own)
