"""The style transfer recipe: optimise an image (or train a generator) against a content
loss and a style loss measured by a frozen feature network.

Two modes, one recipe. ``image`` is Gatys, Ecker & Bethge, "A Neural Algorithm of
Artistic Style" (2015): the trained variable is the picture itself. ``generator`` trains
a small convolutional network that maps the content image (or fixed noise) to the
picture, with the same loss.

No weights can be downloaded here, so the default feature network is a fixed, seeded,
randomly initialised VGG-style convolution stack. Style transfer and texture synthesis
with random, untrained convolutional features is a documented technique: He, Wang &
Hopcroft, "A Powerful Generative Model Using Random Weights for the Deep Image
Representation" (NeurIPS 2016), and Ustyuzhaninov et al., "Texture Synthesis Using
Shallow Convolutional Networks with Random Filters" (2016). The feature network is a
supplied model with that stack as its fallback: pass any Keras model (or ``.keras``
file) as ``models={"features": ...}`` with its layer names in the config (e.g. a VGG19
loaded from a local weights file, with ``preprocess="vgg"``).
"""

from __future__ import annotations

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
    ClipValues,
    ConfigError,
    DataSplit,
    ModelCalls,
    Order,
    Recipe,
    Run,
    Schedule,
    SuppliedModel,
    choice,
    images,
    setting,
)
from beatloop import datasets as data
from beatloop.layers import VariableLayer

_positive = attrs.validators.gt(0)
_non_negative = attrs.validators.ge(0)
#: The loss's parts, logged as figures.
_PARTS = ("content_loss", "style_loss", "total_variation")


@attrs.frozen
class StyleTransferConfig:
    """Settings of the style transfer recipe."""

    mode: Literal["image", "generator"] = choice(
        "image",
        ("image", "generator"),
        "image: the picture itself is trained; generator: a small network maps the "
        "content image (or noise) to it",
    )
    image_size: int = setting(
        64, "side the content and style images are resized to", attrs.validators.ge(16)
    )
    content_path: str | None = setting(
        None, "your own content image (default: scikit-learn's china)"
    )
    style_path: str | None = setting(None, "your own style image (default: scikit-learn's flower)")
    init: Literal["content", "noise"] = choice(
        "content", ("content", "noise"), "image mode: start from the content image, or from noise"
    )
    generator_input: Literal["content", "noise"] = choice(
        "content",
        ("content", "noise"),
        "generator mode: the network's input, the content image or fixed noise",
    )
    alpha: float = setting(1.0, "weight of the content loss", _non_negative)
    beta: float = setting(1e4, "weight of the style loss", _non_negative)
    tv_weight: float = setting(0.1, "weight of the total-variation loss", _non_negative)
    content_layer: str = setting("block3_conv2", "the feature layer the content loss compares")
    style_layers: tuple[str, ...] = setting(
        ("block1_conv1", "block2_conv1", "block3_conv1"),
        "the feature layers whose Gram matrices the style loss compares",
    )
    preprocess: Literal["none", "vgg"] = choice(
        "none",
        ("none", "vgg"),
        "none, or vgg: Keras's VGG preprocessing before the feature network",
    )
    learning_rate: float = setting(0.02, "Adam's learning rate", _positive)
    steps_per_epoch: int = setting(
        50, "steps in one epoch (one image, so an epoch is a count of steps)", _positive
    )
    feature_seed: int = setting(0, "seed of the random-feature network built when none is supplied")


def gram_matrix(features: tf.Tensor) -> tf.Tensor:
    """Channel correlations of ``(batch, height, width, channels)`` features, averaged
    over positions: ``G[b, c, d] = mean_ij F[b, i, j, c] F[b, i, j, d]``."""
    positions = tf.cast(tf.shape(features)[1] * tf.shape(features)[2], features.dtype)
    return tf.einsum("bijc,bijd->bcd", features, features) / positions


def random_vgg(seed: int, channels: tuple[int, ...] = (32, 64, 128)) -> keras.Model:
    """A VGG-style stack (two 3x3 ReLU convolutions per block, average pooling between
    blocks) with seeded random weights; layers named as Keras names VGG's."""
    layers = [keras.Input((None, None, 3))]
    for block, filters in enumerate(channels, 1):
        if block > 1:
            layers.append(keras.layers.AveragePooling2D(2, name=f"block{block - 1}_pool"))
        for conv in (1, 2):
            layers.append(
                keras.layers.Conv2D(
                    filters,
                    3,
                    padding="same",
                    activation="relu",
                    kernel_initializer=keras.initializers.HeNormal(seed=seed + 10 * block + conv),
                    name=f"block{block}_conv{conv}",
                )
            )
    return keras.Sequential(layers, name="features")


def style_image(initial: np.ndarray) -> VariableLayer:
    """The picture being optimised: a trainable ``(1, height, width, 3)`` variable."""
    return VariableLayer(initial, trainable=True, variable_name="pixels", name="style_image")


class StyleTransfer(Recipe):
    """Style transfer: optimise an image or train a generator (Gatys et al.)."""

    name = "style_transfer"
    autograph = False  # no Python control flow on tensors: traced as written
    quality_figure = ("style_loss", "min")
    Config = StyleTransferConfig
    batch_keys = {"content": 4, "style": 4}
    nested_keys = frozenset()  # it computes on its batches, not only hands them to models
    supplied_models = {
        "features": SuppliedModel(
            "an image network (RGB in [0, 1], or VGG-preprocessed with preprocess=vgg) "
            "with layers named as content_layer and style_layers, e.g. a VGG19",
            fallback="a fixed, seeded, randomly initialised VGG-style stack (random features)",
        )
    }

    def __init__(self, config=None):
        super().__init__(config)
        self._extractors: dict[int, keras.Model] = {}

    @property
    def primary_model(self) -> str:
        """What Keras callbacks see: the model the mode trains (the image, or the generator)."""
        return "image" if self.config.mode == "image" else "generator"

    # --- data and parts ----------------------------------------------------------------

    def default_data(self, seed: int) -> DataSplit:
        """One batch of (content, style) repeated ``steps_per_epoch`` times an epoch:
        content = scikit-learn's china photo, style = its flower, unless paths are given."""
        size = (self.config.image_size, self.config.image_size)
        content = self._picture(self.config.content_path, "china", size)
        style = self._picture(self.config.style_path, "flower", size)
        pair = tf.data.Dataset.from_tensors({"content": content[None], "style": style[None]})
        return DataSplit(pair.repeat(self.config.steps_per_epoch))

    @staticmethod
    def _picture(path: str | None, default: str, size) -> np.ndarray:
        if path is None:
            return data.sample_photo(default, size)
        if not Path(path).is_file():
            raise ConfigError(f"no image file at {path!r} (give content_path/style_path)")
        return data.load_image(path, size)

    def check_batch_spec(self, spec) -> list[str]:
        problems = []
        for key in ("content", "style"):
            if spec[key].shape[-1] != 3:
                problems.append(f"{key!r} must be RGB images (..., 3), found {spec[key].shape}")
        return problems

    def build_models(self, batch_spec: Mapping[str, tf.TensorSpec]) -> dict[str, keras.Layer]:
        """The picture (or generator), and the fallback feature network: a user's
        ``features`` replaces it."""
        models = {"features": random_vgg(self.config.feature_seed)}
        height, width = batch_spec["content"].shape[1:3]
        if self.config.mode == "image":
            models["image"] = style_image(self._initial_image(height, width))
        else:
            models["generator"] = self._generator()
        return models

    def _initial_image(self, height, width) -> np.ndarray:
        if self.config.init == "noise":
            rng = np.random.default_rng(self.config.feature_seed)
            return rng.uniform(0.0, 1.0, (1, height, width, 3)).astype(np.float32)
        size = (self.config.image_size, self.config.image_size)
        content = self._picture(self.config.content_path, "china", size)
        return content[None].astype(np.float32)

    def _generator(self) -> keras.Model:
        """A small image-to-image convolution stack ending in a sigmoid: pixels in (0, 1)."""
        return keras.Sequential(
            [
                keras.Input((None, None, 3)),
                keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(3, 1, activation="sigmoid"),
            ],
            name="generator",
        )

    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        return {"optimizer": keras.optimizers.Adam(self.config.learning_rate)}

    def schedule(self) -> Schedule:
        if self.config.mode == "image":
            beat = Beat(
                loss="total", optimizer="optimizer", updates="image", constraint=ClipValues(0, 1)
            )
        else:
            beat = Beat(loss="total", optimizer="optimizer", updates="generator")
        # A supplied model is frozen anyway; declaring it keeps any beat from updating
        # it, and keeps the schedule (and run records) as they were.
        return Schedule(beat, frozen="features")

    # --- the loss ------------------------------------------------------------------------

    def losses(self):
        return {"total": self.total_loss}

    def stylised(self, models: ModelCalls, batch) -> tf.Tensor:
        """The picture the step produces: the image variable, or the generator's output."""
        if self.config.mode == "image":
            return models["image"](batch["content"])
        if self.config.generator_input == "noise":
            shape = tf.shape(batch["content"])
            source = tf.random.stateless_uniform(shape, seed=[self.config.feature_seed, 1])
        else:
            source = batch["content"]
        return models["generator"](source)

    def features(self, models: ModelCalls, pictures: tf.Tensor) -> dict[str, tf.Tensor]:
        """The named layers' activations of the frozen feature network (inference mode),
        in float32 (a mixed-precision network's are float16), so the losses are."""
        if self.config.preprocess == "vgg":
            pictures = keras.applications.vgg19.preprocess_input(pictures * 255.0)
        outputs = self._extractor(models.raw("features"))(pictures, training=False)
        return {
            name: tf.cast(output, tf.float32)
            for name, output in zip(self._layer_names(), outputs, strict=True)
        }

    def _layer_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.config.content_layer, *self.config.style_layers)))

    def _extractor(self, network: keras.Model) -> keras.Model:
        """A model giving the configured layers' outputs; built once per network."""
        key = id(network)
        if key not in self._extractors:
            known = [layer.name for layer in network.layers]
            missing = [name for name in self._layer_names() if name not in known]
            if missing:
                raise ConfigError(
                    f"the feature network has no layer(s) {missing}; its layers: {known}"
                )
            outputs = [network.get_layer(name).output for name in self._layer_names()]
            self._extractors[key] = keras.Model(network.inputs, outputs)
        return self._extractors[key]

    def total_loss(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        """The weighted sum of the content, style and total-variation losses, each a
        mean over the batch's (content, style) pairs, and the parts for the figures.

        A replica with no pair computes nothing and returns zeros (the engine weights
        its loss by its share, 0): the built-in batch is one pair, so on two replicas one
        of them always has none, and a convolution of an empty batch fails with oneDNN
        (TensorFlow 2.21 returns the input's shape, ``(0, h, w, 3)``, for every
        ``Conv2D``), where the picture itself, one row whatever the batch, would still be
        compared with no rows. No collective op runs inside, so replicas may take
        different branches. On one device there is no conditional (XLA's dynamic padder
        fails on the Gram matrices' gradients inside one)."""
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return self._total_loss(models, batch)
        return self.total_loss_of_any_rows(models, batch)

    def total_loss_of_any_rows(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        """``total_loss`` as a replica computes it: zeros when its batch has no pair."""
        rows = tf.shape(batch["content"])[0]
        return tf.cond(
            rows > 0,
            lambda: self._total_loss(models, batch),
            lambda: dict.fromkeys(("loss", *_PARTS), tf.constant(0.0)),
        )

    def _total_loss(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        config = self.config
        picture = self.stylised(models, batch)
        mine = self.features(models, picture)
        content = self.features(models, batch["content"])
        style = self.features(models, batch["style"])
        content_loss = tf.reduce_mean(
            tf.square(mine[config.content_layer] - content[config.content_layer])
        )
        style_loss = tf.add_n(
            [
                tf.reduce_mean(tf.square(gram_matrix(mine[name]) - gram_matrix(style[name])))
                for name in config.style_layers
            ]
        ) / len(config.style_layers)
        pixels = tf.cast(tf.reduce_prod(tf.shape(picture)[1:3]), tf.float32)
        variation = tf.reduce_mean(tf.image.total_variation(picture)) / pixels
        total = (
            config.alpha * content_loss + config.beta * style_loss + config.tv_weight * variation
        )
        return {
            "loss": total,
            "content_loss": content_loss,
            "style_loss": style_loss,
            "total_variation": variation,
        }

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        return {name: keras.metrics.Mean(name=name) for name in _PARTS}

    def update_metrics(self, metrics, batch, outputs) -> None:
        # Weighted by pairs: a replica with none adds nothing to the figures.
        pairs = tf.cast(tf.shape(batch["content"])[0], tf.float32)
        for name, metric in metrics.items():
            metric.update_state(outputs["total"][name], sample_weight=pairs)

    # --- output ------------------------------------------------------------------------------

    def picture(self, run: Run) -> np.ndarray:
        """The current stylised picture as (height, width, 3) floats in [0, 1]."""
        models = ModelCalls(run.models, frozenset())
        batch = next(iter(self.default_data(run.seed).train.take(1)))
        return np.clip(self.stylised(models, batch).numpy()[0], 0.0, 1.0)

    def callbacks(self) -> list[Callback]:
        return [SaveStylised(self)]

    def inference_models(self, models):
        """The trained generator; image mode's result is the picture (the PNG)."""
        return {"generator": models["generator"]} if "generator" in models else {}


class SaveStylised(Callback):
    """Saves the stylised image as PNG each epoch (``stylised/epoch_NNN.png``) and as
    ``stylised.png``, the latest, in the run dir."""

    order = Order.PRODUCER

    def __init__(self, recipe: StyleTransfer):
        self.recipe = recipe

    def on_epoch_end(self, run: Run, epoch: int, logs) -> None:
        if run.run_dir is None:
            return
        pixels = images.to_uint8(self.recipe.picture(run), value_range=(0.0, 1.0))
        scale = max(1, 256 // pixels.shape[1])
        images.save_png(
            pixels, Path(run.run_dir) / "stylised" / f"epoch_{epoch + 1:03d}.png", scale
        )
        run.artifacts["stylised image"] = images.save_png(
            pixels, Path(run.run_dir) / "stylised.png", scale
        )
