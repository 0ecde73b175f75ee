"""A small text classifier whose embedding's gradient is sparse (an ``Embedding``, mean
pooling, a ``Dense``), token batches in which ids repeat, its recipe of one beat, and the
hand-written loop the engine is compared with: the gradient handed to the optimizer as
Keras gives it (``"keras"``: an ``IndexedSlices``, a row per token) or made dense first
(``"dense"``: the batch's true gradient)."""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

import beatloop

VOCABULARY, LENGTH, CLASSES, WIDTH = 40, 12, 3, 8


def token_rows(count: int = 192) -> tuple[np.ndarray, np.ndarray]:
    """``count`` sequences of ``LENGTH`` ids, Zipf-like (low ids in most rows, several
    times in many), and a label of ``CLASSES`` read from them."""
    rng = np.random.default_rng(0)
    ids = np.minimum(rng.zipf(1.5, size=(count, LENGTH)) - 1, VOCABULARY - 1)
    labels = (ids[:, :4].sum(axis=1) % CLASSES).astype(np.int32)
    return ids.astype(np.int64), labels


def token_batches(size: int, count: int = 192) -> tf.data.Dataset:
    """Unshuffled ``{"x", "y"}`` batches of ``size`` (a short last one when ``size``
    does not divide ``count``)."""
    ids, labels = token_rows(count)
    return tf.data.Dataset.from_tensor_slices({"x": ids, "y": labels}).batch(size)


def text_classifier(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((LENGTH,), dtype="int64"),
            keras.layers.Embedding(VOCABULARY, WIDTH),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(CLASSES),
        ]
    )


def mean_cross_entropy(model, batch) -> tf.Tensor:
    """The supervised recipe's loss: the batch's mean cross-entropy of the logits."""
    logits = model(batch["x"], training=True)
    values = keras.losses.sparse_categorical_crossentropy(batch["y"], logits, from_logits=True)
    return tf.reduce_sum(values) / tf.cast(tf.size(values), values.dtype)


class OneBeat(beatloop.Recipe):
    """The text classifier and its one beat, with ``beat``'s settings (``accumulate``,
    ``transform``); its optimizer is ``optimizer()`` (made in a strategy's scope)."""

    name = "sparse_one_beat_test"
    batch_keys = {"x": 2, "y": 1}

    def __init__(self, optimizer: Callable, **beat):
        super().__init__()
        self.make_optimizer, self.beat = optimizer, beat

    def build_models(self, batch_spec):
        return {"model": text_classifier()}

    def build_optimizers(self):
        return {"optimizer": self.make_optimizer()}

    def losses(self):
        return {"loss": lambda models, batch: mean_cross_entropy(models["model"], batch)}

    def schedule(self):
        beat = beatloop.Beat(loss="loss", optimizer="optimizer", updates="model", **self.beat)
        return beatloop.Schedule(beat)


def hand_written(data, epochs: int, optimizer, form: str, *, transform=None) -> keras.Model:
    """A ``tf.function`` step a batch: the classifier's gradients in ``form`` (``"keras"``
    or ``"dense"``), through ``transform``, applied by ``optimizer``; the model."""
    model = text_classifier()
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function(autograph=False, reduce_retracing=True)  # a short last batch: one trace more
    def step(batch):
        with tf.GradientTape() as tape:
            loss = mean_cross_entropy(model, batch)
        grads = tape.gradient(loss, variables)
        if form == "dense":
            grads = [tf.convert_to_tensor(g) for g in grads]
        if transform is not None:
            grads = transform(grads, variables)
        optimizer.apply(grads, variables)

    for _ in range(epochs):
        for batch in data:
            step(batch)
    return model
