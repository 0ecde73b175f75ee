"""A two-tower recommender for tests and ``benchmarks/replica_gaps.py``: the TensorFlow
Recommenders multitask tutorial (retrieval and rating from one pair of towers) on small
seeded synthetic data.

The user tower is ``StringLookup`` + ``Embedding(32)`` over user ids ("u0", "u1", ...),
the item tower ``IntegerLookup`` + ``Embedding(32)`` over item ids; the rating model
``Dense(256, relu) - Dense(128, relu) - Dense(1)`` reads both embeddings concatenated.
One loss, the weighted sum of two tasks, one optimizer (Adam by default):

- retrieval: an in-batch softmax. Each of this replica's users scores every item of the
  *global* batch (``models.all_gather``); its own item, at ``models.batch_offset`` plus
  its row, is the label. The mean over this replica's rows: summed with the replicas'
  shares, the global batch's mean, as on one device.
- rating: the mean squared error of the predicted rating.

Data: ``USERS`` users and ``ITEMS`` items with hidden factors, each user rating
``RATED`` items (a rating of 1 to 5 from the factors, plus noise); the rows in a fixed,
seeded order, unshuffled (so one device and a strategy see the same batches): 1,024
rows, 32 steps of 32 an epoch (``batch_size`` in the config: 33 gives 31 steps of 33
and a last batch of one row).
"""

from __future__ import annotations

from typing import Literal

import attrs
import keras
import numpy as np
import tensorflow as tf

import beatloop
from beatloop.core.data.batches import DataSplit

USERS, ITEMS, RATED, FACTORS, EMBEDDING = 64, 48, 16, 4, 32


def two_tower_rows(seed: int = 0) -> dict[str, np.ndarray]:
    """``USERS * RATED`` rows ``{"user_id": str, "item_id": int64, "rating": float32}``
    in a seeded random order."""
    rng = np.random.default_rng(seed)
    users = rng.normal(size=(USERS, FACTORS))
    items = rng.normal(size=(ITEMS, FACTORS))
    user = np.repeat(np.arange(USERS), RATED)
    item = np.concatenate([rng.choice(ITEMS, RATED, replace=False) for _ in range(USERS)])
    affinity = np.sum(users[user] * items[item], axis=1) / np.sqrt(FACTORS)
    rating = np.clip(np.round(3.0 + affinity + 0.3 * rng.normal(size=user.size)), 1, 5)
    order = rng.permutation(user.size)
    return {
        "user_id": np.array([f"u{u}" for u in user[order]]),
        "item_id": (100 + item[order]).astype(np.int64),  # ids that are not row numbers
        "rating": rating[order].astype(np.float32),
    }


def two_tower_data(seed: int = 0, batch_size: int = 32) -> DataSplit:
    rows = two_tower_rows(seed)
    return DataSplit(tf.data.Dataset.from_tensor_slices(rows).batch(batch_size))


def two_tower_models(activation: str = "relu") -> dict[str, keras.Model]:
    """The towers and the rating model (built; weights from Keras's global seed)."""
    users = [f"u{u}" for u in range(USERS)]
    items = list(range(100, 100 + ITEMS))
    dense = keras.layers.Dense
    return {
        "user": keras.Sequential(
            [
                keras.Input((), dtype="string"),
                keras.layers.StringLookup(vocabulary=users, name="user_lookup"),
                keras.layers.Embedding(USERS + 1, EMBEDDING, name="user_embedding"),
            ],
            name="user",
        ),
        "item": keras.Sequential(
            [
                keras.Input((), dtype="int64"),
                keras.layers.IntegerLookup(vocabulary=items, name="item_lookup"),
                keras.layers.Embedding(ITEMS + 1, EMBEDDING, name="item_embedding"),
            ],
            name="item",
        ),
        "rating": keras.Sequential(
            [
                keras.Input((2 * EMBEDDING,)),
                dense(256, activation=activation, name="rating_1"),
                dense(128, activation=activation, name="rating_2"),
                dense(1, name="rating_out"),
            ],
            name="rating",
        ),
    }


class TwoTower(beatloop.Recipe):
    """Retrieval (in-batch softmax over the global batch's items) plus rating (MSE)."""

    name = "two_tower_test"
    batch_keys = {"user_id": 1, "item_id": 1, "rating": 1}

    @attrs.frozen
    class Config:
        rating_weight: float = 1.0
        retrieval_weight: float = 1.0
        optimizer: Literal["adam", "sgd"] = "adam"
        learning_rate: float = 0.01
        batch_size: int = 32
        activation: str = "relu"  # the rating model's hidden layers'
        data_seed: int = 0

    def default_data(self, seed):
        return two_tower_data(self.config.data_seed, self.config.batch_size)

    def build_models(self, batch_spec):
        return two_tower_models(self.config.activation)

    def build_optimizers(self):
        c = self.config
        if c.optimizer == "sgd":
            return {"optimizer": keras.optimizers.SGD(c.learning_rate)}
        return {"optimizer": keras.optimizers.Adam(c.learning_rate)}

    def losses(self):
        return {"total": self.total}

    def total(self, models, batch) -> dict[str, tf.Tensor]:
        users = models["user"](batch["user_id"])
        items = models["item"](batch["item_id"])
        everyone = models.all_gather(items)  # the global batch's items
        rows = models.batch_offset + tf.range(tf.shape(users)[0])
        scores = tf.matmul(users, everyone, transpose_b=True)
        retrieval = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(rows, scores))
        predicted = models["rating"](tf.concat([users, items], axis=1))[:, 0]
        rating = tf.reduce_mean(tf.square(predicted - batch["rating"]))
        c = self.config
        loss = c.rating_weight * rating + c.retrieval_weight * retrieval
        return {"loss": loss, "retrieval": retrieval, "rating": rating}

    def schedule(self):
        return beatloop.Schedule(
            beatloop.Beat("total", "optimizer", updates=("user", "item", "rating"))
        )

    def build_metrics(self):
        return {name: keras.metrics.Mean(name=name) for name in ("retrieval", "rating")}

    def update_metrics(self, metrics, batch, outputs):
        rows = tf.cast(tf.shape(batch["rating"])[0], tf.float32)  # replicas by their rows
        for name, metric in metrics.items():
            metric.update_state(outputs["total"][name], sample_weight=rows)
