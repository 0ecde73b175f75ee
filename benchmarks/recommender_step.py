"""Two-tower step throughput: beatloop's `recommender` recipe beside the hand-written
loop doing the same update (each embedding's gradient rows summed per id before Adam,
as beatloop does: ``common.summed_per_id``).

Each step: the user and item towers on the batch, the in-batch softmax with log-Q over
the batch's items, the rating model's MSE, the weighted sum, one Adam update of both
towers and the rating model; and the same figures (each task's mean loss, RMSE,
recall@10 of every row against every item its user did not rate). The built-in
synthetic ratings (22,565 rows) in unshuffled batches of 128, repeated 4 times: 708
steps an epoch. beatloop runs at its default steps_per_execution ("auto") and at 32,
the hand-written loop one step a call and 32 a call; each fit's first epoch (tracing,
and "auto" choosing K) is dropped, the fastest remaining one kept, the median over
interleaved repeats.

    python benchmarks/recommender_step.py             # full run
    python benchmarks/recommender_step.py --quick     # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys

import keras
import numpy as np
import tensorflow as tf
from common import cross_race, handwritten_epochs, race_arguments, summed_per_id, timed_fit

from beatloop.recipes.recommender import Recommender
from beatloop.recipes.recommender_data import synthetic_ratings

BATCH, PASSES, MULTI_STEP, TARGET = 128, 4, 32, 1.0


def make_data() -> tf.data.Dataset:
    c = Recommender.Config()
    train, _ = synthetic_ratings(0, c.users, c.items, c.ratings_per_user)
    batches = tf.data.Dataset.from_tensor_slices(train).batch(BATCH)
    return batches.repeat(PASSES).cache().prefetch(tf.data.AUTOTUNE)


class StepOnly(Recommender):
    """The recommender recipe without its epoch-end weight figures."""

    def epoch_figures(self, run):
        return {}


def make_parts(data):
    """The recipe's own models and optimizer (vocabularies read from ``data``)."""
    keras.utils.set_random_seed(0)
    recipe = StepOnly()
    recipe.read_training_data(data)
    models = recipe.build_models(data.element_spec)
    return recipe, models, recipe.build_optimizers()["optimizer"]


def run_beatloop(data, epochs: int, steps_per_execution: int | str) -> list[float]:
    recipe, models, optimizer = make_parts(data)
    parts = {"models": models, "optimizers": {"optimizer": optimizer}}
    return timed_fit(recipe, data, epochs, steps_per_execution, **parts)


def dense_seen(vocabulary) -> np.ndarray:
    """The users x items table of seen pairs a hand-written loop keeps at this size
    (beatloop's own is sparse; before it was this table)."""
    if isinstance(vocabulary.seen, np.ndarray):
        return vocabulary.seen
    starts = vocabulary.seen.starts
    table = np.zeros([len(starts) - 1, len(vocabulary.items)], np.uint8)
    table[np.repeat(np.arange(len(starts) - 1), np.diff(starts)), vocabulary.seen.items] = 1
    return table


def run_handwritten(data, epochs: int, steps_per_call: int | None) -> list[float]:
    recipe, models, optimizer = make_parts(data)
    user, item, rating_model = models["user"], models["item"], models["rating"]
    variables = [*user.trainable_variables, *item.trainable_variables,
                 *rating_model.trainable_variables]  # fmt: skip
    optimizer.build(variables)
    weights = models["loss_weights"].variable
    vocabulary = recipe.vocabulary
    seen_table = tf.constant(dense_seen(vocabulary))
    user_lookup, item_lookup = user.layers[0], item.layers[0]
    metrics = {name: keras.metrics.Mean(name) for name in ("retrieval", "rating", "recall")}
    metrics["rmse"] = keras.metrics.RootMeanSquaredError()

    def step(batch):
        with tf.GradientTape() as tape:
            users, items = user(batch["user"], training=True), item(batch["item"], training=True)
            index = tf.cast(item_lookup(batch["item"]), tf.int32)
            logits = tf.matmul(users, items, transpose_b=True)
            logits -= tf.gather(tf.constant(vocabulary.log_q()), index)[None, :]
            labels = tf.range(tf.shape(users)[0])
            retrieval = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            )
            predicted = rating_model(tf.concat([users, items], 1), training=True)[:, 0]
            rating = tf.reduce_mean(tf.square(predicted - batch["rating"]))
            loss = tf.add_n([weights[0] * retrieval, weights[1] * rating])
        optimizer.apply(summed_per_id(tape.gradient(loss, variables)), variables)
        every = item(tf.constant(vocabulary.items))
        scores = tf.stop_gradient(tf.matmul(users, every, transpose_b=True))
        own = tf.gather(scores, tf.maximum(index - 1, 0), batch_dims=1)
        seen = tf.gather(seen_table, user_lookup(batch["user"]))
        above = tf.reduce_sum(tf.cast((scores > own[:, None]) & (seen == 0), tf.int32), 1)
        hits = tf.cast((index > 0) & (above < 10), tf.float32)
        rows = tf.cast(tf.shape(users)[0], tf.float32)
        metrics["retrieval"].update_state(retrieval, sample_weight=rows)
        metrics["rating"].update_state(rating, sample_weight=rows)
        metrics["recall"].update_state(hits)
        metrics["rmse"].update_state(batch["rating"], predicted)

    return handwritten_epochs(step, data, metrics, epochs, steps_per_call)


def loops(data) -> dict:
    """beatloop at its default K ("auto") and at 32, the hand-written loop one step a
    call and 32 steps a call: each ``loop(epochs) -> epoch times``."""
    return {
        "beatloop recommender, spe=auto": lambda epochs: run_beatloop(data, epochs, "auto"),
        f"beatloop recommender, spe={MULTI_STEP}": lambda epochs: run_beatloop(
            data, epochs, MULTI_STEP
        ),
        "hand-written step, per batch": lambda epochs: run_handwritten(data, epochs, None),
        f"hand-written, {MULTI_STEP} steps/call": lambda epochs: run_handwritten(
            data, epochs, MULTI_STEP
        ),
    }


def main(argv=None) -> int:
    args = race_arguments(argv, __doc__.splitlines()[0])
    data = make_data()
    steps = int(data.cardinality())
    cross_race(loops(data), steps, args.repeats, args.epochs, "recommender", TARGET)
    return 0


if __name__ == "__main__":
    sys.exit(main())
