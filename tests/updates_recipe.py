"""A BYOL-style test recipe (an online encoder and predictor trained by a beat, a target
encoder that follows them by ``EMA`` or ``Copy``) and the hand-written TensorFlow loop it
must equal bit for bit. Shared by tests/test_updates.py, its worker and the benchmark."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import beatloop

FEATURES, WIDTH, NOISE, DECAY, LEARNING_RATE = 8, 6, 0.1, 0.9, 0.05


def byol_data(count: int = 64, batch_size: int = 16, seed: int = 0) -> tf.data.Dataset:
    """Batches ``{"x": (batch, FEATURES)}`` of fixed random inputs, in a fixed order."""
    x = np.random.default_rng(seed).normal(size=(count, FEATURES)).astype("float32")
    return tf.data.Dataset.from_tensor_slices({"x": x}).batch(batch_size)


def build_byol_models(seed: int = 1, width: int = WIDTH) -> dict[str, keras.Model]:
    """The online encoder, its predictor and a target encoder (built from ``seed``)."""
    keras.utils.set_random_seed(seed)

    def encoder(name):
        layers = [keras.Input((FEATURES,)), keras.layers.Dense(width, activation="tanh")]
        return keras.Sequential([*layers, keras.layers.Dense(width)], name=name)

    predictor = keras.Sequential([keras.Input((width,)), keras.layers.Dense(width)], name="pred")
    return {"online": encoder("online"), "predictor": predictor, "target": encoder("target")}


def byol_loss(online, predictor, target, x, random) -> tf.Tensor:
    """2 - 2 cos(prediction of view 1, target's projection of view 2), both views noisy;
    the target's output is a constant (stop_gradient)."""
    view1 = x + NOISE * random.normal(tf.shape(x))
    view2 = x + NOISE * random.normal(tf.shape(x))
    p = tf.math.l2_normalize(predictor(online(view1)), axis=-1)
    z = tf.stop_gradient(tf.math.l2_normalize(target(view2), axis=-1))
    return tf.reduce_mean(2.0 - 2.0 * tf.reduce_sum(p * z, axis=-1))


class Byol(beatloop.Recipe):
    """Beat ``byol`` (SGD) trains ``online`` and ``predictor``; then ``follow`` (an
    ``EMA``, a ``Copy`` or nothing) moves ``target``. ``act`` (if given) is an extra
    ``Act`` entry; ``acted`` counts the steps it ran (a state-like variable)."""

    name = "byol_test"
    batch_keys = {"x": 2}

    def __init__(self, follow="ema", *, every: int = 1, act: bool = False, width: int = WIDTH):
        super().__init__()
        self.follow, self.every, self.act, self.width = follow, every, act, width
        self.acted = None

    def build_models(self, batch_spec):
        self.acted = tf.Variable(0, dtype=tf.int64, trainable=False)
        return build_byol_models(width=self.width)

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(LEARNING_RATE)}

    def losses(self):
        def loss(models, batch):
            return byol_loss(
                models["online"], models["predictor"], models["target"], batch["x"], models.random
            )

        return {"byol": loss}

    def count(self, models, batch):
        self.acted.assign_add(1)

    def schedule(self):
        entries = [beatloop.Beat("byol", "sgd", updates=("online", "predictor"))]
        if self.follow == "ema":
            entries.append(beatloop.EMA("online", "target", DECAY, every=self.every))
        elif self.follow == "copy":
            entries.append(beatloop.Copy("online", "target", every=self.every))
        if self.act:
            entries.append(beatloop.Act(self.count, name="count", every=self.every))
        frozen = "target" if self.follow is None else ()
        return beatloop.Schedule(entries, frozen=frozen)


def hand_written_byol(models, data, *, epochs: int, seed: int, follow="ema", every: int = 1):
    """The same training as ``Byol``, as a plain ``tf.function`` / ``GradientTape`` loop:
    one SGD step on the loss, then the target follows (Polyak ``decay * t + (1 - decay)
    * s``, or a copy on steps that are multiples of ``every``)."""
    online, predictor, target = models["online"], models["predictor"], models["target"]
    optimizer = keras.optimizers.SGD(LEARNING_RATE)
    variables = online.trainable_variables + predictor.trainable_variables
    optimizer.build(variables)
    random = tf.random.Generator.from_seed(seed)
    pairs = list(zip(target.trainable_variables, online.trainable_variables, strict=True))

    @tf.function
    def step(x, number):
        with tf.GradientTape() as tape:
            loss = byol_loss(
                lambda v: online(v, training=True),
                lambda v: predictor(v, training=True),
                lambda v: target(v, training=False),
                x,
                random,
            )
        optimizer.apply(tape.gradient(loss, variables), variables)
        if number % every == 0:
            for t, s in pairs:
                if follow == "ema":
                    t.assign(tf.constant(DECAY) * t + tf.constant(1 - DECAY) * s)
                else:
                    t.assign(s)

    number = 0
    for _ in range(epochs):
        for batch in data:
            step(batch["x"], tf.constant(number, tf.int64))
            number += 1
