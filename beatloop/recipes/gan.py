"""The GAN recipe: a discriminator beat (``n_critic`` times) then a generator beat, each
with its own optimizer, in one compiled step — the case ``fit`` cannot express. With
``update="simultaneous"`` both beats take their gradients from one forward pass (one
generated batch, one discriminator pass), as the TensorFlow DCGAN tutorial's step does."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import attrs
import keras
import numpy as np
import tensorflow as tf

from beatloop import (
    Beat,
    Callback,
    DataSplit,
    Group,
    ModelCalls,
    Order,
    Recipe,
    Run,
    Schedule,
    choice,
    images,
    setting,
)
from beatloop import datasets as data
from beatloop.recipes import gan_quality as quality

_positive = attrs.validators.gt(0)
BOTH = ("generator", "discriminator")


@attrs.frozen
class GanConfig:
    """Settings of the GAN recipe."""

    latent_dim: int = setting(16, "size of the generator's noise input", _positive)
    hidden: int = setting(128, "width of the dense layers (dense architecture)", _positive)
    architecture: Literal["dense", "conv"] = choice(
        "dense",
        ("dense", "conv"),
        "dense, or conv: DCGAN-style strided convolutions for images whose sides divide by 4",
    )
    loss: Literal["non_saturating", "hinge"] = choice(
        "non_saturating", ("non_saturating", "hinge"), "non_saturating, or hinge"
    )
    n_critic: int = setting(
        1, "discriminator updates per generator update (the discriminator beat's repeat)", _positive
    )
    update: Literal["alternating", "simultaneous"] = choice(
        "alternating",
        ("alternating", "simultaneous"),
        "alternating: the beats in turn, the generator's against the updated "
        "discriminator with fresh noise; simultaneous: one group, both gradients from one"
        " forward pass (needs n_critic=1)",
    )
    label_smoothing: float = setting(
        0.0,
        "one-sided label smoothing: real targets become 1 - s",
        [attrs.validators.ge(0), attrs.validators.lt(1)],
    )
    g_learning_rate: float = setting(1e-3, "the generator's Adam learning rate", _positive)
    d_learning_rate: float = setting(1e-3, "the discriminator's Adam learning rate", _positive)
    beta_1: float = setting(
        0.5, "Adam's beta_1, both optimizers", [attrs.validators.ge(0), attrs.validators.lt(1)]
    )
    batch_size: int = setting(32, "batch size of the built-in data", _positive)
    quality_samples: int = setting(
        500, "generated samples judged for the sample-quality figures each epoch", _positive
    )
    grid_size: int = setting(
        8, "side of the saved sample grid (grid_size x grid_size samples)", _positive
    )

    def __attrs_post_init__(self) -> None:
        if self.update == "simultaneous" and self.n_critic != 1:
            raise ValueError(
                f"n_critic={self.n_critic} repeats the discriminator beat, which needs "
                "update='alternating'; a simultaneous update takes both gradients from one "
                "forward pass (use n_critic=1)"
            )


def image_shape(sample_shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(height, width, channels) of one sample: flat squares (64,) read as 8x8x1."""
    if len(sample_shape) == 1:
        side = math.isqrt(sample_shape[0])
        return (side, side, 1) if side * side == sample_shape[0] else None
    if len(sample_shape) == 2:
        return (*sample_shape, 1)
    if len(sample_shape) == 3:
        return tuple(sample_shape)
    return None


class Gan(Recipe):
    """Generative adversarial network: discriminator and generator beats (digits)."""

    name = "gan"
    autograph = False  # no Python control flow on tensors: traced as written
    #: Keras callbacks see the generator and its optimizer unless told otherwise.
    primary_model = "generator"
    quality_figure = ("sample_score", "max")
    Config = GanConfig
    batch_keys = {"x": 2}
    nested_keys = frozenset()  # it computes on its batches, not only hands them to models
    # The generator's tanh makes samples in [-1, 1]: real images from --data must match.
    source_defaults = {"value_range": "signed"}

    def __init__(self, config=None):
        super().__init__(config)
        self._fixed_latent: np.ndarray | None = None

    # --- data and models ---------------------------------------------------------------

    def default_data(self, seed: int) -> DataSplit:
        return data.digits(seed, self.config.batch_size, signed=True)

    def check_batch_spec(self, spec) -> list[str]:
        shape = tuple(spec["x"].shape[1:])
        if None in shape:
            return [f"'x' must have a fixed sample shape, found {spec['x'].shape}"]
        if self.config.architecture == "conv":
            geometry = image_shape(shape)
            if geometry is None or geometry[0] % 4 or geometry[1] % 4:
                return [
                    f"architecture 'conv' needs images whose height and width divide by 4 "
                    f"(e.g. (8, 8) or 64 pixels), found samples of shape {shape}"
                ]
        return []

    def build_models(self, batch_spec: Mapping[str, tf.TensorSpec]) -> dict[str, keras.Layer]:
        shape = tuple(batch_spec["x"].shape[1:])
        build = self._conv_models if self.config.architecture == "conv" else self._dense_models
        generator, discriminator = build(shape)
        return {"generator": generator, "discriminator": discriminator}

    def _dense_models(self, shape):
        size, hidden = int(np.prod(shape)), self.config.hidden
        generator = keras.Sequential(
            [
                keras.Input((self.config.latent_dim,)),
                keras.layers.Dense(hidden, activation="relu"),
                keras.layers.Dense(hidden, activation="relu"),
                keras.layers.Dense(size, activation="tanh"),
                keras.layers.Reshape(shape),
            ],
            name="generator",
        )
        discriminator = keras.Sequential(
            [
                keras.Input(shape),
                keras.layers.Flatten(),
                keras.layers.Dense(hidden, activation="leaky_relu"),
                keras.layers.Dense(hidden, activation="leaky_relu"),
                keras.layers.Dense(1),
            ],
            name="discriminator",
        )
        return generator, discriminator

    def _conv_models(self, shape):
        """DCGAN-style: strided transposed convolutions up, strided convolutions down."""
        height, width, channels = image_shape(shape)
        filters = max(self.config.hidden // 2, 8)
        generator = keras.Sequential(
            [
                keras.Input((self.config.latent_dim,)),
                keras.layers.Dense((height // 4) * (width // 4) * filters * 2, use_bias=False),
                keras.layers.BatchNormalization(),
                keras.layers.ReLU(),
                keras.layers.Reshape((height // 4, width // 4, filters * 2)),
                keras.layers.Conv2DTranspose(filters, 4, strides=2, padding="same", use_bias=False),
                keras.layers.BatchNormalization(),
                keras.layers.ReLU(),
                keras.layers.Conv2DTranspose(channels, 4, strides=2, padding="same"),
                keras.layers.Activation("tanh"),
                keras.layers.Reshape(shape),
            ],
            name="generator",
        )
        discriminator = keras.Sequential(
            [
                keras.Input(shape),
                keras.layers.Reshape((height, width, channels)),
                keras.layers.Conv2D(filters, 3, strides=2, padding="same"),
                keras.layers.LeakyReLU(0.2),
                keras.layers.Conv2D(filters * 2, 3, strides=2, padding="same"),
                keras.layers.LeakyReLU(0.2),
                keras.layers.Flatten(),
                keras.layers.Dense(1),
            ],
            name="discriminator",
        )
        return generator, discriminator

    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        config = self.config
        return {
            "d_optimizer": keras.optimizers.Adam(config.d_learning_rate, beta_1=config.beta_1),
            "g_optimizer": keras.optimizers.Adam(config.g_learning_rate, beta_1=config.beta_1),
        }

    # --- the step ----------------------------------------------------------------------

    def schedule(self) -> Schedule:
        if self.config.update == "simultaneous":
            # Generator first, as the TensorFlow tutorial takes and applies its gradients.
            beats = (
                Beat(loss="g_loss", optimizer="g_optimizer", updates="generator"),
                Beat(loss="d_loss", optimizer="d_optimizer", updates="discriminator"),
            )
            return Schedule(Group(forward="gan_forward", beats=beats, training=BOTH))
        return Schedule(
            (
                Beat(
                    loss="d_loss",
                    optimizer="d_optimizer",
                    updates="discriminator",
                    repeat=self.config.n_critic,
                    training=BOTH,
                ),
                Beat(loss="g_loss", optimizer="g_optimizer", updates="generator", training=BOTH),
            )
        )

    def losses(self):
        if self.config.update == "simultaneous":
            return {"d_loss": self.discriminator_loss_of, "g_loss": self.generator_loss_of}
        return {"d_loss": self.discriminator_loss, "g_loss": self.generator_loss}

    def forwards(self):
        return {"gan_forward": self.forward}

    def forward(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        """One generated batch and one discriminator pass over real and fake: the logits
        both simultaneous beats' losses take."""
        real = batch["x"]
        fake = self._fake(models, real)
        return {
            "real_logits": models["discriminator"](real),
            "fake_logits": models["discriminator"](fake),
        }

    def _fake(self, models: ModelCalls, real: tf.Tensor) -> tf.Tensor:
        noise = models.random.normal([tf.shape(real)[0], self.config.latent_dim])
        return models["generator"](noise)

    def discriminator_loss(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        real = batch["x"]
        real_logits = models["discriminator"](real)
        fake_logits = models["discriminator"](self._fake(models, real))
        return self._discriminator_loss(real_logits, fake_logits)

    def discriminator_loss_of(self, outputs, batch) -> dict[str, tf.Tensor]:
        return self._discriminator_loss(outputs["real_logits"], outputs["fake_logits"])

    def _discriminator_loss(self, real_logits, fake_logits) -> dict[str, tf.Tensor]:
        if self.config.loss == "hinge":
            loss = tf.reduce_mean(tf.nn.relu(1.0 - real_logits)) + tf.reduce_mean(
                tf.nn.relu(1.0 + fake_logits)
            )
        else:
            real_target = tf.fill(tf.shape(real_logits), 1.0 - self.config.label_smoothing)
            loss = _cross_entropy(real_target, real_logits) + _cross_entropy(
                tf.zeros_like(fake_logits), fake_logits
            )
        return {
            "loss": loss,
            "d_real": tf.reduce_mean(tf.sigmoid(real_logits)),
            "d_fake": tf.reduce_mean(tf.sigmoid(fake_logits)),
        }

    def generator_loss(self, models: ModelCalls, batch) -> tf.Tensor:
        return self._generator_loss(models["discriminator"](self._fake(models, batch["x"])))

    def generator_loss_of(self, outputs, batch) -> tf.Tensor:
        return self._generator_loss(outputs["fake_logits"])

    def _generator_loss(self, fake_logits) -> tf.Tensor:
        if self.config.loss == "hinge":
            return -tf.reduce_mean(fake_logits)
        return _cross_entropy(tf.ones_like(fake_logits), fake_logits)

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        return {
            "d_real": keras.metrics.Mean(name="d_real"),
            "d_fake": keras.metrics.Mean(name="d_fake"),
        }

    def update_metrics(self, metrics, batch, outputs) -> None:
        metrics["d_real"].update_state(outputs["d_loss"]["d_real"])
        metrics["d_fake"].update_state(outputs["d_loss"]["d_fake"])

    # --- what people look at -------------------------------------------------------------

    def fixed_latent(self, seed: int) -> np.ndarray:
        """One latent batch per run, reused every epoch so the samples are comparable."""
        if self._fixed_latent is None:
            count = max(self.config.quality_samples, self.config.grid_size**2)
            rng = np.random.default_rng(seed)
            self._fixed_latent = rng.standard_normal((count, self.config.latent_dim)).astype(
                np.float32
            )
        return self._fixed_latent

    def samples(self, run: Run, count: int) -> np.ndarray:
        """Generated samples (inference mode) from the first ``count`` fixed latents."""
        latent = self.fixed_latent(run.seed)[:count]
        return run.models["generator"](latent, training=False).numpy()

    def epoch_figures(self, run: Run) -> dict[str, float]:
        """Sample quality from the digits classifier (see ``beatloop.recipes.gan_quality``), when
        the samples are 64-pixel digits; nothing for other image data."""
        samples = self.samples(run, self.config.quality_samples)
        if int(np.prod(samples.shape[1:])) != 64:
            return {}
        classifier = quality.digits_classifier(run.run_dir)
        return quality.sample_quality(samples, classifier).as_logs()

    def callbacks(self) -> list[Callback]:
        return [SampleGrid(self)]

    def inference_models(self, models):
        return {"generator": models["generator"]}


class SampleGrid(Callback):
    """Saves a PNG grid of samples from the fixed latent batch after every epoch, as
    ``samples/epoch_NNN.png`` and ``samples.png`` (the latest) in the run dir."""

    order = Order.PRODUCER

    def __init__(self, recipe: Gan):
        self.recipe = recipe

    def on_epoch_end(self, run: Run, epoch: int, logs) -> None:
        if run.run_dir is None:
            return
        recipe = self.recipe
        samples = recipe.samples(run, recipe.config.grid_size**2)
        shape = image_shape(samples.shape[1:])
        pictures = images.to_uint8(samples.reshape((len(samples), *shape)))
        tiled = images.grid(pictures, columns=recipe.config.grid_size)
        scale = max(1, 256 // tiled.shape[1])
        images.save_png(tiled, Path(run.run_dir) / "samples" / f"epoch_{epoch + 1:03d}.png", scale)
        run.artifacts["samples"] = images.save_png(tiled, Path(run.run_dir) / "samples.png", scale)


def _cross_entropy(targets: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=targets, logits=logits))
