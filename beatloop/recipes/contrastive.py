"""The contrastive recipe: self-supervised pretraining of an encoder on two augmented
views of each image, then a linear probe on the frozen encoder.

``target="none"`` is SimCLR (Chen et al., 2020): an encoder and a projection head
trained with NT-Xent, each view's positive the other view of its image and its
negatives every other view of the *global* batch (``models.all_gather``, so a run under
a distribution strategy trains the loss one device would). ``target="ema"`` is BYOL
(Grill et al., 2020): a predictor on the online projection learns the other view's
projection by a target encoder and projector that follow the online ones by ``EMA``;
its loss is the symmetric normalised mean squared error, no negatives. As in the BYOL
paper, the projector's and predictor's hidden layers are batch-normalised (synchronized
across replicas, so a strategy normalises the global batch) and the target runs in
training mode (batch statistics); the predictor has its own, larger learning rate, as
DirectPred (Tian et al., 2021) and SimSiam found a fast predictor keeps the features
from collapsing.

The schedule, in two phases: ``pretrain`` is one ``Group`` (one forward for all its
beats): the contrastive beat (BYOL: one for the encoder and projector, one for the
predictor, on the same loss) and an online probe, a ``Dense(classes)`` on the
stop-gradient features of the clean image with its own optimizer, watching what the
features are worth as they learn; then the ``EMA`` entries (BYOL). ``probe`` trains a
fresh linear probe on the frozen encoder for the rest of the run. ``probe_accuracy``
(and ``val_probe_accuracy``) is the accuracy of the probe the current phase trains.
With ``pretrain_epochs=0`` only the probe phase runs: a linear probe on the randomly
initialised encoder, the baseline the pretraining is measured against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import attrs
import keras
import tensorflow as tf

from beatloop import (
    EMA,
    Beat,
    DataSplit,
    Group,
    ModelCalls,
    Phase,
    Phases,
    Recipe,
    Schedule,
    choice,
    setting,
)
from beatloop import datasets as data
from beatloop.recipes.views import Views, square_side

_positive = attrs.validators.gt(0)
_fraction = [attrs.validators.gt(0), attrs.validators.lt(1)]


@attrs.frozen
class ContrastiveConfig:
    """Settings of the contrastive recipe."""

    target: Literal["none", "ema"] = choice(
        "none",
        ("none", "ema"),
        "none: SimCLR (NT-Xent, negatives from the global batch); ema: BYOL (a predictor, "
        "an EMA target encoder and projector)",
    )
    temperature: float = setting(0.5, "NT-Xent's temperature (target=none)", _positive)
    ema_decay: float = setting(0.99, "the EMA target's decay per step (target=ema)", _fraction)
    max_shift: int = setting(
        1, "a view is shifted by up to this many pixels each way", attrs.validators.ge(0)
    )
    noise: float = setting(0.1, "std of the Gaussian noise added to a view", attrs.validators.ge(0))
    flip: bool = setting(False, "flip views left to right at random (photos, not digits)")
    hidden: int = setting(128, "width of the encoder's and projector's hidden layers", _positive)
    features: int = setting(16, "the encoder's output: the features a probe reads", _positive)
    projection: int = setting(32, "the projection head's output", _positive)
    classes: int = setting(10, "classes the probes predict; labels in [0, classes)", _positive)
    learning_rate: float = setting(1e-3, "Adam's learning rate for the pretraining", _positive)
    predictor_learning_rate: float = setting(
        1e-2, "Adam's learning rate for BYOL's predictor (target=ema)", _positive
    )
    probe_learning_rate: float = setting(5e-2, "Adam's learning rate for each probe", _positive)
    pretrain_epochs: int = setting(
        20, "epochs of pretraining before the linear probe (0: probe a random encoder)",
        attrs.validators.ge(0),
    )  # fmt: skip
    batch_size: int = setting(128, "batch size of the built-in data", _positive)
    validation_fraction: float = setting(
        0.2, "share of the built-in data held out for validation", _fraction
    )


def dense_stack(
    inputs: tuple, hidden: int, out: int, name: str, out_bias: bool = True
) -> keras.Sequential:
    """Flatten, Dense(hidden, relu), Dense(out): the encoder, and SimCLR's projector."""
    flat = [keras.layers.Flatten()] if len(inputs) > 1 else []
    dense = [
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(out, use_bias=out_bias),
    ]
    return keras.Sequential([keras.Input(inputs), *flat, *dense], name=name)


def normalised_head(
    inputs: int, hidden: int, out: int, name: str, out_bias: bool = True
) -> keras.Sequential:
    """Dense(hidden), BatchNormalization, ReLU, Dense(out): BYOL's projector and
    predictor. The batch statistics are synchronized across replicas (the global
    batch's, so a strategy trains what one device does)."""
    layers = keras.layers
    norm = layers.BatchNormalization(synchronized=True)
    dense = [
        layers.Dense(hidden, use_bias=False),
        norm,
        layers.ReLU(),
        layers.Dense(out, use_bias=out_bias),
    ]
    return keras.Sequential([keras.Input((inputs,)), *dense], name=name)


def linear(inputs: int, classes: int, name: str) -> keras.Sequential:
    """A probe: one Dense layer from the features to the class logits."""
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(classes)], name=name)


def nt_xent(first: tf.Tensor, second: tf.Tensor, models: ModelCalls, temperature: float):
    """SimCLR's NT-Xent of this replica's pairs of views (rows of ``first`` and
    ``second``) against every view of the global batch: the mean over this replica's
    views of the cross-entropy of finding its pair among the others."""
    first, second = (tf.math.l2_normalize(z, axis=1) for z in (first, second))
    everyone = tf.concat([models.all_gather(first), models.all_gather(second)], axis=0)
    total = tf.shape(everyone)[0] // 2  # the global batch's images
    own = models.batch_offset + tf.range(tf.shape(first)[0])  # this replica's rows

    def against_everyone(anchors, rows, positives):
        logits = tf.matmul(anchors, everyone, transpose_b=True) / temperature
        logits -= 1e9 * tf.one_hot(rows, 2 * total)  # a view is not its own negative
        return tf.nn.sparse_softmax_cross_entropy_with_logits(positives, logits)

    terms = [against_everyone(first, own, own + total), against_everyone(second, own + total, own)]
    return tf.reduce_mean(tf.concat(terms, axis=0))


def normalised_mse(prediction: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
    """BYOL's ``2 - 2 cos(prediction, target)`` per row; the target is a constant."""
    prediction = tf.math.l2_normalize(prediction, axis=-1)
    target = tf.stop_gradient(tf.math.l2_normalize(target, axis=-1))
    return 2.0 - 2.0 * tf.reduce_sum(prediction * target, axis=-1)


def probe_loss(labels: tf.Tensor, logits: tf.Tensor) -> dict[str, tf.Tensor]:
    """A probe's mean cross-entropy, with its logits for the accuracy."""
    values = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    return {"loss": tf.reduce_mean(values), "logits": logits}


class Contrastive(Recipe):
    """SimCLR or BYOL pretraining on two augmented views, then a linear probe (digits)."""

    name = "contrastive"
    autograph = False  # no Python control flow on tensors: traced as written
    primary_model = "encoder"
    quality_figure = ("val_probe_accuracy", "max")
    Config = ContrastiveConfig
    batch_keys = {"x": 2, "y": 1}
    nested_keys = frozenset()  # it computes on its batches, not only hands them to models

    @property
    def views(self) -> Views:
        config = self.config
        return Views(max_shift=config.max_shift, noise=config.noise, flip=config.flip)

    @property
    def byol(self) -> bool:
        return self.config.target == "ema"

    def default_data(self, seed: int) -> DataSplit:
        return data.digits(seed, self.config.batch_size, self.config.validation_fraction)

    def check_batch_spec(self, spec: Mapping[str, tf.TensorSpec]) -> list[str]:
        x = spec["x"].shape
        if x.rank == 2 and square_side(x[-1]) is None:
            return [
                f"'x' of shape {x} is not images: give (batch, height, width[, channels]) "
                "images or flat rows of a square number of pixels (64 for 8x8)"
            ]
        return []

    def label_classes(self) -> dict[str, str]:
        return {"y": "classes"}

    def build_models(self, batch_spec: Mapping[str, tf.TensorSpec]) -> dict[str, keras.Layer]:
        c = self.config
        shape = tuple(batch_spec["x"].shape[1:])
        # BYOL: no bias just before a normalisation (it cancels there; its gradient is
        # round-off, which Adam would turn into full-size steps)
        biased = not self.byol
        models = {
            "encoder": dense_stack(shape, c.hidden, c.features, "encoder", biased),
            "projector": self.head(c.features, c.projection, "projector", biased),
            "probe": linear(c.features, c.classes, "probe"),
            "linear_probe": linear(c.features, c.classes, "linear_probe"),
        }
        if self.byol:
            models["predictor"] = self.head(c.projection, c.projection, "predictor")
            models["target_encoder"] = dense_stack(
                shape, c.hidden, c.features, "target_encoder", biased
            )
            models["target_projector"] = self.head(
                c.features, c.projection, "target_projector", biased
            )
            for online in ("encoder", "projector"):  # the target starts as the online one
                models[f"target_{online}"].set_weights(models[online].get_weights())
        return models

    def head(self, inputs: int, out: int, name: str, out_bias: bool = True) -> keras.Sequential:
        """A projector or predictor: batch-normalised for BYOL, plain for SimCLR."""
        if self.byol:
            return normalised_head(inputs, self.config.hidden, out, name, out_bias)
        return dense_stack((inputs,), self.config.hidden, out, name, out_bias)

    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        adam, config = keras.optimizers.Adam, self.config
        optimizers = {
            "pretrain": adam(config.learning_rate),
            "probe": adam(config.probe_learning_rate),
            "linear_probe": adam(config.probe_learning_rate),
        }
        if self.byol:
            optimizers["predictor"] = adam(config.predictor_learning_rate)
        return optimizers

    # --- the schedule -----------------------------------------------------------------------

    def schedule(self) -> Schedule | Phases:
        online = ("encoder", "projector", "predictor") if self.byol else ("encoder", "projector")
        targets = ("target_encoder", "target_projector") if self.byol else ()
        probing = Schedule(
            Beat("linear_probe", "linear_probe", updates="linear_probe"),
            frozen=(*online, "probe", *targets),
        )
        if not self.config.pretrain_epochs:
            return probing
        probe = Beat("probe", "probe", updates="probe")
        if not self.byol:
            beats = (Beat("nt_xent", "pretrain", updates=online), probe)
            entries: list = [Group(forward="views", beats=beats)]
        else:  # the predictor with its own optimizer; the target in training mode too
            encoder = Beat("byol", "pretrain", updates=("encoder", "projector"))
            predictor = Beat("byol", "predictor", updates="predictor", name="predictor")
            beats, training = (encoder, predictor, probe), (*online, "probe", *targets)
            entries = [Group(forward="views", beats=beats, training=training)]
            decay = self.config.ema_decay
            entries += [EMA(name, f"target_{name}", decay) for name in ("encoder", "projector")]
        pretrain = Schedule(tuple(entries), frozen="linear_probe")
        return Phases(
            Phase("pretrain", pretrain, epochs=self.config.pretrain_epochs),
            Phase("probe", probing),
        )

    def forwards(self):
        return {"views": self.byol_forward if self.byol else self.simclr_forward}

    def simclr_forward(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        """Two views of each image through the encoder and projector, and their NT-Xent
        (here, where the global batch can be gathered); the online probe's logits on the
        clean image's features (a constant to the encoder)."""
        x = batch["x"]
        first, second = (models["projector"](models["encoder"](self.views(x, models.random)))
                         for _ in range(2))  # fmt: skip
        features = tf.stop_gradient(models["encoder"](x))
        loss = nt_xent(first, second, models, self.config.temperature)
        return {"nt_xent": loss, "probe": models["probe"](features)}

    def byol_forward(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        """Two views; each one's online prediction and target projection; the probe."""
        x = batch["x"]
        outputs = {}
        for name in ("first", "second"):
            view = self.views(x, models.random)
            projection = models["projector"](models["encoder"](view))
            outputs[name] = models["predictor"](projection)
            outputs[f"target_{name}"] = models["target_projector"](models["target_encoder"](view))
        outputs["probe"] = models["probe"](tf.stop_gradient(models["encoder"](x)))
        return outputs

    # --- losses and metrics -------------------------------------------------------------------

    def losses(self):
        return {
            "nt_xent": self.simclr_loss,
            "byol": self.byol_loss,
            "probe": self.online_probe,
            "linear_probe": self.linear_probe,
        }

    def simclr_loss(self, outputs, batch) -> tf.Tensor:
        return outputs["nt_xent"]

    def byol_loss(self, outputs, batch) -> tf.Tensor:
        """Each view's prediction of the other view's target projection, both ways."""
        there = normalised_mse(outputs["first"], outputs["target_second"])
        back = normalised_mse(outputs["second"], outputs["target_first"])
        return tf.reduce_mean(there + back)

    def online_probe(self, outputs, batch) -> dict[str, tf.Tensor]:
        return probe_loss(batch["y"], outputs["probe"])

    def linear_probe(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        """The probe phase: a linear probe on the frozen encoder's features."""
        return probe_loss(batch["y"], models["linear_probe"](models["encoder"](batch["x"])))

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        return {"probe_accuracy": keras.metrics.SparseCategoricalAccuracy(name="probe_accuracy")}

    def update_metrics(self, metrics, batch, outputs) -> None:
        probe = outputs.get("probe") or outputs["linear_probe"]  # the phase's probe
        metrics["probe_accuracy"].update_state(batch["y"], probe["logits"])

    def inference_models(self, models):
        return {"encoder": models["encoder"]}
