"""The recommender recipe: two towers and two tasks, as in the TensorFlow Recommenders
multitask tutorial, with the ``multitask`` recipe's loss weightings.

A query tower (user id -> ``StringLookup``/``IntegerLookup`` -> ``Embedding`` ->
optional MLP) and an item tower (the same over item ids), the vocabularies the sorted
ids of the training data (``read_training_data``: independent of its order, so a
resumed, evaluated or exported run rebuilds the same lookups). One beat, one Adam, the
weighted sum of two task losses (``beatloop.recipes.loss_weights``: fixed, uncertainty,
dwa):

- retrieval: an in-batch softmax. Each of this replica's users scores every item of the
  *global* batch (``models.all_gather``), its own item (at ``models.batch_offset`` plus
  its row) the label; with ``logq``, each item's logit less the log of its share of the
  training rows (the sampling-bias correction of Yi et al., RecSys 2019);
- rating: a rating model on both embeddings concatenated, mean squared error.

Figures: each task's loss, RMSE, and recall@K (``recall_at_k``): the share of rows whose
item is among the K best-scored of the items its user did not rate in training (exact:
the unrated items scoring above the row's own item counted, every item scored,
``recall_chunk`` at a time; unknown items never hit). The items each user rated are kept
sparse (``beatloop.recipes.retrieval``): memory grows with the ratings and the items,
never users x items. Exported: ``top_items``, user ids -> the K best item ids and their
scores (a running top-K over the same chunks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import attrs
import keras
import numpy as np
import tensorflow as tf

from beatloop import (
    Beat,
    Callback,
    ConfigError,
    DataSplit,
    ModelCalls,
    Recipe,
    Run,
    Schedule,
    choice,
    setting,
)
from beatloop.recipes import loss_weights, retrieval
from beatloop.recipes.recommender_data import Vocabulary, read_vocabulary, synthetic_split

_positive = attrs.validators.gt(0)
TASKS = ["retrieval", "rating"]
#: Up to this many users x items (bytes) the seen pairs are a table: a step's one gather.
DENSE_SEEN = 2**24


def _widths(instance, attribute, value) -> None:
    if any(not isinstance(w, int) or w < 1 for w in value):
        raise ValueError(f"{attribute.name} takes positive layer widths, got {list(value)}")


@attrs.frozen
class RecommenderConfig:
    """Settings of the recommender recipe."""

    user_key: str = setting("user", "the batch key of the user ids (strings or integers)")
    item_key: str = setting("item", "the batch key of the item ids (strings or integers)")
    rating_key: str = setting("rating", "the batch key of the ratings")
    embedding: int = setting(32, "width of each tower's id embedding", _positive)
    tower_layers: tuple[int, ...] = setting(
        (), "widths of an MLP on each tower's embedding (ReLU between; the last is its output)",
        _widths,
    )  # fmt: skip
    rating_layers: tuple[int, ...] = setting(
        (64, 32), "hidden widths of the rating model (ReLU) on both towers' outputs", _widths
    )
    weighting: Literal["fixed", "uncertainty", "dwa"] = choice(
        "fixed", loss_weights.WEIGHTINGS, loss_weights.WEIGHTING_HELP
    )
    weights: tuple[float, ...] = setting(
        (), "fixed weights of the retrieval and rating losses, each at least 0 (default: 1, 1)",
        loss_weights.non_negative,
    )  # fmt: skip
    dwa_temperature: float = setting(2.0, "DWA's temperature T", _positive)
    logq: bool = setting(
        True, "correct the in-batch softmax for item popularity (logit minus log share)"
    )
    top_k: int = setting(
        10, "K of the figures' recall@K and of the exported top items: below the data's items",
        _positive,
    )  # fmt: skip
    recall_chunk: int = setting(
        4096, "items recall@K and top_items score at once (memory: batch x this scores)",
        _positive,
    )  # fmt: skip
    train_recall: bool = setting(
        True, "recall@K on training batches too (it scores every item each step: off for "
        "large catalogues, where val_recall_at_k is what counts)",
    )  # fmt: skip
    learning_rate: float = setting(0.05, "Adam's learning rate", _positive)
    batch_size: int = setting(128, "batch size of the built-in data", _positive)
    users: int = setting(500, "built-in data: users", _positive)
    items: int = setting(300, "built-in data: items (Zipf-like popularity)", _positive)
    ratings_per_user: int = setting(
        50, "built-in data: mean ratings per user (5 of each held out for validation)", _positive
    )

    def __attrs_post_init__(self) -> None:
        if self.weights and len(self.weights) != 2:
            raise ValueError(
                f"weights gives {len(self.weights)} value(s) for 2 tasks (retrieval, rating)"
            )


def lookup_layer(vocabulary: np.ndarray) -> type[keras.Layer]:
    """``StringLookup`` for string ids, ``IntegerLookup`` for integers."""
    strings = vocabulary.dtype.kind in "US"
    return keras.layers.StringLookup if strings else keras.layers.IntegerLookup


def tower(vocabulary: np.ndarray, embedding: int, layers: tuple[int, ...], name: str):
    """Ids -> lookup (index 0: an unknown id) -> embedding -> the optional MLP."""
    strings = vocabulary.dtype.kind in "US"
    parts = [
        keras.Input((), dtype="string" if strings else "int64"),
        lookup_layer(vocabulary)(vocabulary=vocabulary, name=f"{name}_lookup"),
        keras.layers.Embedding(len(vocabulary) + 1, embedding, name=f"{name}_embedding"),
    ]
    for index, width in enumerate(layers):
        last = index == len(layers) - 1
        activation = None if last else "relu"
        parts.append(keras.layers.Dense(width, activation=activation, name=f"{name}_{index}"))
    return keras.Sequential(parts, name=name)


class Recommender(Recipe):
    """Two towers, two tasks: in-batch-softmax retrieval and rating (synthetic ratings)."""

    name = "recommender"
    autograph = False  # no Python control flow on tensors: traced as written
    quality_figure = ("val_recall_at_k", "max")
    Config = RecommenderConfig
    vocabulary: Vocabulary | None = None

    @property
    def batch_keys(self) -> dict[str, int]:
        c = self.config
        return {c.user_key: 1, c.item_key: 1, c.rating_key: 1}

    def check_batch_spec(self, spec: Mapping[str, tf.TensorSpec]) -> list[str]:
        c, problems = self.config, []
        for key in (c.user_key, c.item_key):
            dtype = spec[key].dtype if key in spec else None
            if dtype is not None and not (dtype == tf.string or dtype.is_integer):
                problems.append(f"{key!r} holds ids: strings or integers, not {dtype.name}")
        return problems

    def default_data(self, seed: int) -> DataSplit:
        c = self.config
        return synthetic_split(seed, c.batch_size, c.users, c.items, c.ratings_per_user)

    def read_training_data(self, train: tf.data.Dataset) -> None:
        """The vocabularies; a ``top_k`` not below the items the data has is refused
        (every row would be a hit of recall@K)."""
        self.vocabulary = read_vocabulary(train, self.config.user_key, self.config.item_key)
        items, k = len(self.vocabulary.items), self.config.top_k
        if k >= items:
            fewer = max(1, min(10, items - 1))
            raise ConfigError(
                f"recipe {self.name!r}: top_k={k} is not below the {items} items of the "
                f"training data, so recall@{k} would count every row as a hit (it would read "
                f"1, meaning nothing); set top_k below {items} (--set top_k={fewer})"
            )

    def _vocabulary(self) -> Vocabulary:
        if self.vocabulary is None:
            raise ConfigError(
                "the recommender's vocabularies come from its training data: call "
                "read_training_data(train) before build_models"
            )
        return self.vocabulary

    def build_models(self, batch_spec: Mapping[str, tf.TensorSpec]) -> dict[str, keras.Layer]:
        c, vocabulary = self.config, self._vocabulary()
        width = c.tower_layers[-1] if c.tower_layers else c.embedding
        layers = [keras.Input((2 * width,))]
        for index, hidden in enumerate(c.rating_layers):
            layers.append(keras.layers.Dense(hidden, activation="relu", name=f"rating_{index}"))
        layers.append(keras.layers.Dense(1, name="rating_out"))
        models = {
            "user": tower(vocabulary.users, c.embedding, c.tower_layers, "user"),
            "item": tower(vocabulary.items, c.embedding, c.tower_layers, "item"),
            "rating": keras.Sequential(layers, name="rating"),
        }
        models.update(loss_weights.weight_models(c.weighting, TASKS, c.weights))
        self.item_lookup = lookup_layer(vocabulary.items)(vocabulary=vocabulary.items)
        self.user_lookup = lookup_layer(vocabulary.users)(vocabulary=vocabulary.users)
        self.seen = seen_variables(vocabulary)
        return models

    def build_state(self) -> dict[str, tf.Variable]:
        """``vocabulary``: the fingerprint of the vocabularies the run trains with, in
        every checkpoint; each step checks it against the vocabularies read now."""
        known = 0 if self.vocabulary is None else self.vocabulary.fingerprint()
        return {"vocabulary": tf.Variable(tf.constant(known, tf.int64), trainable=False)}

    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        return {"optimizer": keras.optimizers.Adam(self.config.learning_rate)}

    def schedule(self) -> Schedule:
        updates = ["user", "item", "rating"]
        if self.config.weighting == "uncertainty":
            updates.append("uncertainty")
        return Schedule(Beat(loss="total", optimizer="optimizer", updates=tuple(updates)))

    def losses(self):
        return {"total": self.total}

    def total(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        """Both tasks' losses weighted and summed, with what the figures need."""
        c = self.config
        tf.debugging.assert_equal(
            models.state["vocabulary"], tf.constant(self._vocabulary().fingerprint(), tf.int64),
            message="the recommender's vocabularies differ from those its checkpoint was "
            "trained with: it was rebuilt on other training data; pass data= (--data) like "
            "the data it trained on",
        )  # fmt: skip
        users = models["user"](ids(batch[c.user_key]))
        item_ids = ids(batch[c.item_key])
        items = models["item"](item_ids)
        logits = tf.matmul(users, models.all_gather(items), transpose_b=True)
        if c.logq:
            log_q = tf.gather(tf.constant(self._vocabulary().log_q()), self._index(item_ids))
            logits -= models.all_gather(log_q)[None, :]
        rows = models.batch_offset + tf.range(tf.shape(users)[0])
        retrieval = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(rows, logits))
        predicted = models["rating"](tf.concat([users, items], axis=1))[:, 0]
        rating = tf.reduce_mean(tf.square(predicted - self._ratings(batch)))
        total = [
            loss_weights.weighted(models, c.weighting, index, name, loss)
            for index, (name, loss) in enumerate(zip(TASKS, (retrieval, rating), strict=True))
        ]
        out = {"loss": tf.add_n(total), "retrieval": retrieval, "rating": rating,
               "predicted": predicted}  # fmt: skip
        if c.train_recall or not models.is_training("user"):
            out["hits"] = self._hits(models, users, ids(batch[c.user_key]), item_ids)
        return out

    def _ratings(self, batch) -> tf.Tensor:
        """The batch's ratings as float32 (a CSV's whole-number ratings are int32)."""
        return tf.cast(tf.reshape(batch[self.config.rating_key], [-1]), tf.float32)

    def _index(self, item_ids: tf.Tensor) -> tf.Tensor:
        """Each item id's lookup index (0: not in the vocabulary), by a lookup of the
        recipe's own (a user's item tower may have none)."""
        return tf.cast(self.item_lookup(item_ids), tf.int32)

    def _hits(self, models: ModelCalls, users, user_ids, item_ids) -> tf.Tensor:
        """1 where the row's item is among the K best-scored of the known items its user
        did not rate in training (the row's own item aside)."""
        c, vocabulary = self.config, self._vocabulary()
        every = models["item"](tf.constant(vocabulary.items))
        index = self._index(item_ids)
        above = retrieval.count_unseen_above(
            tf.stop_gradient(users), tf.stop_gradient(every), tf.maximum(index - 1, 0),
            self.user_lookup(user_ids), self.seen, c.recall_chunk,
        )  # fmt: skip
        return tf.cast(tf.logical_and(index > 0, above < c.top_k), tf.float32)

    # --- figures -------------------------------------------------------------------------

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        metrics = {f"{name}_loss": keras.metrics.Mean(name=f"{name}_loss") for name in TASKS}
        metrics["rmse"] = keras.metrics.RootMeanSquaredError(name="rmse")
        metrics["recall_at_k"] = keras.metrics.Mean(name="recall_at_k")
        return metrics

    def update_metrics(self, metrics, batch, outputs) -> None:
        out = outputs["total"]
        rows = tf.cast(tf.shape(out["predicted"])[0], tf.float32)  # replicas by their rows
        for name in TASKS:
            metrics[f"{name}_loss"].update_state(out[name], sample_weight=rows)
        metrics["rmse"].update_state(self._ratings(batch), out["predicted"])
        if "hits" in out:  # not in training with train_recall off: the figure is missing
            metrics["recall_at_k"].update_state(out["hits"])

    def epoch_figures(self, run: Run) -> dict[str, float]:
        weights = loss_weights.current_weights(run.models, self.config.weighting, TASKS)
        return {f"weight_{name}": w for name, w in weights.items()}

    def callbacks(self) -> list[Callback]:
        if self.config.weighting != "dwa":
            return []
        return [loss_weights.DynamicWeightAverage(lambda: TASKS, self._temperature)]

    def _temperature(self) -> float:
        return self.config.dwa_temperature

    def inference_models(self, models):
        """``top_items``: user ids -> ``item_ids`` and ``scores`` of the K best items."""
        user = models["user"]
        inputs = keras.Input((), dtype=user.inputs[0].dtype)
        c = self.config
        top = TopItems(models["item"], self._vocabulary().items, c.top_k, c.recall_chunk)
        return {"top_items": keras.Model(inputs, top(user(inputs)), name="top_items")}


def ids(values: tf.Tensor) -> tf.Tensor:
    """A batch's ids as the lookups take them: strings as they are, integers as int64."""
    values = tf.reshape(values, [-1])
    return values if values.dtype == tf.string else tf.cast(values, tf.int64)


class TopItems(keras.layers.Layer):
    """User embeddings -> the K best-scored items, every item scored ``chunk`` at a time
    with a running top-K (the same items and order as one ``top_k`` over all)."""

    def __init__(self, item_tower: keras.Layer, items: np.ndarray, k: int, chunk: int, **kwargs):
        super().__init__(**kwargs)
        self.item_tower, self.items = item_tower, items
        self.k, self.chunk = min(k, len(items)), chunk

    def call(self, users):
        items = tf.constant(self.items)
        scores, best = retrieval.running_top_k(users, self.item_tower(items), self.k, self.chunk)
        return {"item_ids": tf.gather(items, best), "scores": scores}


def seen_variables(vocabulary: Vocabulary) -> tuple[tf.Variable, tf.Variable] | tf.Variable:
    """The seen pairs as variables, not graph constants (TensorFlow caps a graph at 2 GB),
    and not checkpointed (read from the training data like the vocabularies): up to
    ``DENSE_SEEN`` users x items a table, one gather a step; past it sparse."""
    seen = vocabulary.seen
    if seen is None:
        return tf.Variable(tf.zeros([2], tf.int64)), tf.Variable(tf.zeros([0], tf.int32))
    if (len(vocabulary.users) + 1) * len(vocabulary.items) <= DENSE_SEEN:
        return tf.Variable(seen.table(len(vocabulary.items)), trainable=False, name="seen")
    return (
        tf.Variable(seen.starts, trainable=False, name="seen_starts"),
        tf.Variable(seen.items, trainable=False, name="seen_items"),
    )
