"""NT-Xent with the global batch's negatives (``models.all_gather``) on one device and
on a MirroredStrategy over two logical CPUs, in its own process (logical devices must be
set before TensorFlow runs anything).

``mirrored OUT``: the SimCLR-style recipe on one device, on two replicas with the gather
and on two replicas without it (each replica's negatives only), from the same initial
weights, data (global batches of 9: replica shares of 5 and 4, then a last batch of 4)
and noise; then a recipe gathering a matrix whose second dimension is the replica's
batch size, which fails in the gather. Writes JSON to OUT: the largest weight
differences, how far training moved the weights, the histories and the failure's class,
exit code and message.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import attrs
import keras
import numpy as np
import tensorflow as tf
from helpers import all_weights, dict_batches

import beatloop


@attrs.frozen
class ContrastiveConfig:
    gather: bool = True  # negatives from the global batch (False: the replica's only)
    matrix: bool = False  # gather a (rows, rows) matrix: shapes differ across replicas


class Contrastive(beatloop.Recipe):
    """SimCLR's NT-Xent on two noisy views of each digit, temperature 0.5."""

    name = "contrastive"
    Config = ContrastiveConfig
    batch_keys = {"x": 2}

    def build_models(self, spec):
        encoder = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(8)]
        )
        return {"encoder": encoder}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.1)}

    def losses(self):
        return {"nt_xent": self.nt_xent}

    def nt_xent(self, models, batch):
        x = batch["x"]
        views = [x + 0.3 * models.random.normal(tf.shape(x)) for _ in range(2)]
        first, second = (tf.math.l2_normalize(models["encoder"](v), axis=1) for v in views)
        if self.config.matrix:
            return tf.reduce_mean(models.all_gather(tf.matmul(first, second, transpose_b=True)))
        gather = models.all_gather if self.config.gather else (lambda t: t)
        offset = models.batch_offset if self.config.gather else 0
        everyone = tf.concat([gather(first), gather(second)], axis=0)  # 2N rows
        total = tf.shape(everyone)[0] // 2
        rows = offset + tf.range(tf.shape(x)[0])  # this replica's rows of the global batch

        def side(anchors, own, positives):
            logits = tf.matmul(anchors, everyone, transpose_b=True) / 0.5
            logits -= 1e9 * tf.one_hot(own, 2 * total)  # an example is not its own negative
            return tf.nn.sparse_softmax_cross_entropy_with_logits(positives, logits)

        losses = tf.concat([side(first, rows, rows + total), side(second, rows + total, rows)], 0)
        return tf.reduce_mean(losses)  # the mean over this replica's examples

    def schedule(self):
        return beatloop.Schedule(beatloop.Beat("nt_xent", "sgd", "encoder"))


def data():
    from beatloop.data import digits_arrays

    train, validation = digits_arrays(0)
    return dict_batches(train, 9, 40), dict_batches(validation, 9, 18)


def train(initial: list, strategy=None, **config):
    """Two epochs from the ``initial`` encoder weights (models built in the strategy's
    scope, as the engine builds its own)."""
    recipe = beatloop.make_recipe(Contrastive, config)
    with strategy.scope() if strategy else contextlib.nullcontext():
        models = recipe.build_models({})
    models["encoder"].set_weights(initial)
    return beatloop.fit(
        recipe, data=data(), models=models, epochs=2, seed=3, strategy=strategy, progress=False
    )


def largest_difference(first: dict, second: dict) -> float:
    return max(float(np.abs(first[key] - second[key]).max()) for key in first)


def mirrored(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    encoder = beatloop.make_recipe(Contrastive).build_models({})["encoder"]
    start, initial = all_weights({"encoder": encoder}), encoder.get_weights()
    one = train(initial)
    two = train(initial, strategy)
    apart = train(initial, strategy, gather=False)
    ones = all_weights(one.models)
    report = {
        "replicas": strategy.num_replicas_in_sync,
        "moved": largest_difference(ones, start),
        "gathered": largest_difference(ones, all_weights(two.models)),
        "not_gathered": largest_difference(ones, all_weights(apart.models)),
        "one": one.history,
        "two": two.history,
        "steps": [one.steps, two.steps],
    }
    try:  # last: a failed collective leaves the process's collectives aborted
        train(initial, strategy, matrix=True)
    except beatloop.BeatloopError as error:
        report["failure"] = {
            "class": type(error).__name__,
            "data_error": isinstance(error, beatloop.DataError),
            "exit_code": error.exit_code,
            "message": str(error),
        }
    with open(out, "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    {"mirrored": mirrored}[sys.argv[1]](sys.argv[2])
