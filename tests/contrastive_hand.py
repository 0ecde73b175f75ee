"""The contrastive recipe's algorithm written as a plain TensorFlow loop (``tf.function``,
``GradientTape``, Keras optimizers), for tests/test_contrastive.py and the benchmark
(benchmarks/contrastive_step.py).

Pretraining steps: two views of each digit (a shift of up to one pixel, zero-padded,
then Gaussian noise, drawn from one ``tf.random.Generator``), the encoder and projector
on each, SimCLR's NT-Xent (or BYOL's symmetric normalised MSE against EMA target
networks, whose projector and predictor are batch-normalised and whose target runs in
training mode too), an online probe on the clean digits' stop-gradient features; every
gradient from the same forward, then each optimizer's update (BYOL's predictor has its
own), then the targets' EMA. Probe steps: a linear probe on the frozen encoder.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from beatloop.datasets import digits_arrays

#: The small sizes the tests and the benchmark train at.
SMALL = {"hidden": 32, "features": 8, "projection": 8, "batch_size": 32}
NOISE, TEMPERATURE, DECAY, RATE, PROBE_RATE, PREDICTOR_RATE = 0.1, 0.5, 0.99, 1e-3, 5e-2, 1e-2


def digits_data(
    count: int, batch_size: int, validation_count: int = 64
) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """The first ``count`` training digits and ``validation_count`` validation digits,
    in unshuffled batches."""
    train, validation = digits_arrays(seed=0)

    def batches(arrays, rows):
        rows_of = {key: value[:rows] for key, value in arrays.items()}
        return tf.data.Dataset.from_tensor_slices(rows_of).batch(batch_size)

    return batches(train, count), batches(validation, validation_count)


def stack(inputs: int, hidden: int, out: int, bias: bool = True) -> keras.Sequential:
    dense = keras.layers.Dense
    layers = [keras.Input((inputs,)), dense(hidden, "relu"), dense(out, use_bias=bias)]
    return keras.Sequential(layers)


def head(inputs: int, hidden: int, out: int, bias: bool = True) -> keras.Sequential:
    """BYOL's projector and predictor: batch normalisation before the ReLU, no bias
    feeding a normalisation (it would cancel)."""
    layers = keras.layers
    norm = layers.BatchNormalization(synchronized=True)
    dense = [
        layers.Dense(hidden, use_bias=False),
        norm,
        layers.ReLU(),
        layers.Dense(out, use_bias=bias),
    ]
    return keras.Sequential([keras.Input((inputs,)), *dense])


def build_models(sizes: dict, byol: bool) -> dict[str, keras.Model]:
    """The networks the recipe builds, in its order (their weights are then set)."""
    hidden, features, projection = sizes["hidden"], sizes["features"], sizes["projection"]
    projector, biased = (head, False) if byol else (stack, True)
    models = {
        "encoder": stack(64, hidden, features, biased),
        "projector": projector(features, hidden, projection, biased),
        "probe": keras.Sequential([keras.Input((features,)), keras.layers.Dense(10)]),
        "linear_probe": keras.Sequential([keras.Input((features,)), keras.layers.Dense(10)]),
    }
    if byol:
        models["predictor"] = head(projection, hidden, projection)
        models["target_encoder"] = stack(64, hidden, features, biased)
        models["target_projector"] = head(features, hidden, projection, biased)
    return models


def view(x, random):
    """A digit moved by up to a pixel each way (zeros shifted in), plus noise."""
    images = tf.reshape(x, [-1, 8, 8, 1])
    rows = tf.shape(images)[0]
    offsets = random.uniform([rows, 2], -1, 2, dtype=tf.int32)
    padded = tf.pad(images, [[0, 0], [1, 1], [1, 1], [0, 0]])
    down = 1 - offsets[:, :1] + tf.range(tf.shape(images)[1])[tf.newaxis]
    right = 1 - offsets[:, 1:] + tf.range(tf.shape(images)[2])[tf.newaxis]
    images = tf.gather(tf.gather(padded, down, axis=1, batch_dims=1), right, axis=2, batch_dims=1)
    images = images + NOISE * random.normal(tf.shape(images))
    return tf.reshape(images, tf.shape(x))


def nt_xent(z1, z2):
    z1, z2 = tf.math.l2_normalize(z1, axis=1), tf.math.l2_normalize(z2, axis=1)
    both = tf.concat([z1, z2], axis=0)
    n = tf.shape(both)[0] // 2
    rows = tf.constant(0) + tf.range(tf.shape(z1)[0])

    def cross_entropy(anchors, own, positives):
        logits = tf.matmul(anchors, both, transpose_b=True) / TEMPERATURE
        logits -= 1e9 * tf.one_hot(own, 2 * n)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(positives, logits)

    return tf.reduce_mean(
        tf.concat([cross_entropy(z1, rows, rows + n), cross_entropy(z2, rows + n, rows)], 0)
    )


def byol_term(p, z):
    p, z = tf.math.l2_normalize(p, axis=-1), tf.stop_gradient(tf.math.l2_normalize(z, axis=-1))
    return 2.0 - 2.0 * tf.reduce_sum(p * z, axis=-1)


def cross_entropy(labels, logits):
    values = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    return tf.reduce_mean(values)


class HandWritten:
    """The loop, on ``models`` (whose weights the caller sets), drawing from a generator
    seeded with ``seed``; ``step(batch)`` and ``probe_step(batch)`` are compiled for
    ``spec``."""

    def __init__(self, models: dict, seed: int, spec, byol: bool = False):
        tf.config.experimental.enable_op_determinism()
        self.models, self.byol = models, byol
        self.random = tf.random.Generator.from_seed(seed)

        def variables(*names):
            return [v for name in names for v in models[name].trainable_variables]

        self.online = variables("encoder", "projector")
        self.predictor_variables = variables("predictor") if byol else []
        self.probe_variables = variables("probe")
        self.linear_variables = variables("linear_probe")
        rates = (RATE, PREDICTOR_RATE, PROBE_RATE, PROBE_RATE)
        self.pretrain, self.predictor, self.probe, self.linear = map(keras.optimizers.Adam, rates)
        self.pretrain.build(self.online)
        self.predictor.build(self.predictor_variables)
        self.probe.build(self.probe_variables)
        self.linear.build(self.linear_variables)
        pairs = []
        if byol:
            for name in ("encoder", "projector"):
                target = models[f"target_{name}"].trainable_variables
                pairs += list(zip(target, models[name].trainable_variables, strict=True))
        self.pairs = pairs
        self.step = tf.function(self._step, input_signature=[spec])
        self.probe_step = tf.function(self._probe_step, input_signature=[spec])

    def _losses(self, batch):
        m, x = self.models, batch["x"]
        if self.byol:
            online, targets = [], []  # batch statistics: every network in training mode
            for _ in range(2):
                v = view(x, self.random)
                projection = m["projector"](m["encoder"](v), training=True)
                online.append(m["predictor"](projection, training=True))
                targets.append(m["target_projector"](m["target_encoder"](v), training=True))
            features = tf.stop_gradient(m["encoder"](x))
            loss = tf.reduce_mean(
                byol_term(online[0], targets[1]) + byol_term(online[1], targets[0])
            )
        else:
            z1, z2 = (m["projector"](m["encoder"](view(x, self.random))) for _ in range(2))
            features = tf.stop_gradient(m["encoder"](x))
            loss = nt_xent(z1, z2)
        return loss, cross_entropy(batch["y"], m["probe"](features))

    def _step(self, batch):
        with (
            tf.GradientTape() as tape,
            tf.GradientTape() as predictor_tape,
            tf.GradientTape() as probe_tape,
        ):
            loss, probe_loss = self._losses(batch)
        self.pretrain.apply(tape.gradient(loss, self.online), self.online)
        if self.byol:
            predictor_gradients = predictor_tape.gradient(loss, self.predictor_variables)
            self.predictor.apply(predictor_gradients, self.predictor_variables)
        probe_gradients = probe_tape.gradient(probe_loss, self.probe_variables)
        self.probe.apply(probe_gradients, self.probe_variables)
        for t, s in self.pairs:
            t.assign(tf.constant(DECAY) * t + tf.constant(1 - DECAY) * s)

    def _probe_step(self, batch):
        m = self.models
        with tf.GradientTape() as tape:
            loss = cross_entropy(batch["y"], m["linear_probe"](m["encoder"](batch["x"])))
        self.linear.apply(tape.gradient(loss, self.linear_variables), self.linear_variables)

    def train(self, data, pretrain_epochs: int, probe_epochs: int) -> None:
        for epoch in range(pretrain_epochs + probe_epochs):
            step = self.step if epoch < pretrain_epochs else self.probe_step
            for batch in data:
                step(batch)


def weights_of(models: dict) -> dict[str, list[np.ndarray]]:
    return {name: model.get_weights() for name, model in models.items()}
