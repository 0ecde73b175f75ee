"""The recommender recipe's algorithm written by hand, as a TensorFlow user writes the
TFRS multitask model without TFRS: vocabularies from a pass over the training data,
lookups and embeddings, a ``tf.function`` step with a ``GradientTape`` and a Keras Adam
fed each embedding's gradient with its rows summed per id (``summed_per_id``: Keras 2's
optimizers did that before a sparse update, Keras 3's do not), the task losses weighted
(fixed, or DWA set after each epoch from the epoch's mean task losses).
tests/test_recommender.py checks that the built-in recipe ends bit-identical to it;
benchmarks/recommender_step.py times the two side by side.

It shares nothing with the recipe but the data and the config values.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf


def vocabularies(train: tf.data.Dataset, config):
    """Sorted user and item ids of the training data, and each item's share of its rows."""
    users, counts = set(), {}
    for batch in train:
        users.update(v.decode() for v in batch[config.user_key].numpy().tolist())
        for item in batch[config.item_key].numpy().tolist():
            counts[item] = counts.get(item, 0) + 1
    items = sorted(counts)
    shares = np.array([counts[i] for i in items], np.float64) / sum(counts.values())
    log_q = np.log(np.concatenate([[shares.min()], shares])).astype(np.float32)
    return np.array(sorted(users)), np.array(items), log_q


def towers(users, items, config) -> dict[str, keras.Model]:
    def tower(vocabulary, lookup, dtype):
        return keras.Sequential(
            [
                keras.Input((), dtype=dtype),
                lookup(vocabulary=vocabulary),
                keras.layers.Embedding(len(vocabulary) + 1, config.embedding),
            ]
        )

    layers = [keras.Input((2 * config.embedding,))]
    layers += [keras.layers.Dense(w, activation="relu") for w in config.rating_layers]
    return {
        "user": tower(users, keras.layers.StringLookup, "string"),
        "item": tower(items, keras.layers.IntegerLookup, "int64"),
        "rating": keras.Sequential([*layers, keras.layers.Dense(1)]),
    }


def summed_per_id(grad):
    """An embedding's gradient (``IndexedSlices``, a row per lookup) with the rows of each
    id summed into one, as the dense gradient sums them; any other gradient as it is."""
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    ids, rows = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, rows, tf.shape(ids)[0])
    return tf.IndexedSlices(values, ids, grad.dense_shape)


class HandWrittenRecommender:
    """Two towers, retrieval and rating, trained on ``train`` from ``models`` (copies of
    the recipe's initial weights), one compiled step a call."""

    def __init__(self, train: tf.data.Dataset, config, models: dict, log_q: np.ndarray):
        self.train, self.config, self.models = train, config, models
        self.log_q = tf.constant(log_q)
        self.item_lookup = models["item"].layers[0]
        self.variables = [v for name in ("user", "item", "rating")
                          for v in models[name].trainable_variables]  # fmt: skip
        self.optimizer = keras.optimizers.Adam(config.learning_rate)
        self.optimizer.build(self.variables)
        self.weights = tf.Variable(list(config.weights) or [1.0, 1.0], trainable=False)
        self.sums = [tf.Variable(0.0) for _ in range(3)]  # retrieval, rating, rows
        self.step = tf.function(self.train_step, autograph=False)
        self.epoch_losses: list[list[float]] = []

    def train_step(self, batch) -> None:
        c, m = self.config, self.models
        with tf.GradientTape() as tape:
            users = m["user"](batch[c.user_key], training=True)
            items = m["item"](batch[c.item_key], training=True)
            logits = tf.matmul(users, items, transpose_b=True)
            if c.logq:
                index = tf.cast(self.item_lookup(batch[c.item_key]), tf.int32)
                logits -= tf.gather(self.log_q, index)[None, :]
            labels = tf.range(tf.shape(users)[0])
            retrieval = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            )
            both = tf.concat([users, items], axis=1)
            predicted = m["rating"](both, training=True)[:, 0]
            rating = tf.reduce_mean(tf.square(predicted - batch[c.rating_key]))
            loss = tf.add_n([self.weights[0] * retrieval, self.weights[1] * rating])
        grads = [summed_per_id(g) for g in tape.gradient(loss, self.variables)]
        self.optimizer.apply_gradients(zip(grads, self.variables, strict=True))
        rows = tf.cast(tf.shape(users)[0], tf.float32)
        self.sums[0].assign_add(retrieval * rows)
        self.sums[1].assign_add(rating * rows)
        self.sums[2].assign_add(rows)

    def fit(self, epochs: int) -> None:
        for _ in range(epochs):
            for s in self.sums:
                s.assign(0.0)
            for batch in self.train:
                self.step(batch)
            rows = self.sums[2]
            self.epoch_losses.append([float(self.sums[0] / rows), float(self.sums[1] / rows)])
            if self.config.weighting == "dwa" and len(self.epoch_losses) >= 2:
                (r1, m1), (r0, m0) = self.epoch_losses[-1], self.epoch_losses[-2]
                t = self.config.dwa_temperature
                exps = [math.exp((r1 / r0) / t), math.exp((m1 / m0) / t)]
                self.weights.assign([2 * e / sum(exps) for e in exps])
