"""NT-Xent with the global batch's negatives (``models.all_gather``) on one device and
on a MirroredStrategy over two logical CPUs, in its own process (logical devices must be
set before TensorFlow runs anything).

``mirrored OUT``: the docs' SimClr recipe on one device, on two replicas with the gather
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

import numpy as np
import tensorflow as tf
from helpers import all_weights, dict_batches, find_block

import beatloop


class ReplicaOnly:
    """``models`` as a loss sees it, but with no gather: each replica's negatives only."""

    batch_offset = 0

    def __init__(self, models):
        self.models = models
        self.random = models.random

    def __getitem__(self, name):
        return self.models[name]

    def all_gather(self, x):
        return x


def recipes() -> dict[str, type]:
    """The docs' SimClr recipe (docs/schedules.md; its block is run, training included:
    call after the logical devices are set), the same without the gather, and one that
    gathers a (rows, rows) matrix, whose shape differs between replicas of 5 and 4 rows."""
    namespace: dict = {}
    find_block("class SimClr").run(namespace)
    docs = namespace["SimClr"]

    class NotGathered(docs):
        def nt_xent(self, models, batch):
            return super().nt_xent(ReplicaOnly(models), batch)

    class Matrix(docs):
        def nt_xent(self, models, batch):
            z = models["encoder"](batch["x"])
            return tf.reduce_mean(models.all_gather(tf.matmul(z, z, transpose_b=True)))

    return {"gathered": docs, "not_gathered": NotGathered, "matrix": Matrix}


def data():
    from beatloop.data import digits_arrays

    train, validation = digits_arrays(0)
    return dict_batches(train, 9, 40), dict_batches(validation, 9, 18)


def train(recipe_class, initial: list, strategy=None):
    """Two epochs from the ``initial`` encoder weights (models built in the strategy's
    scope, as the engine builds its own)."""
    recipe = recipe_class()
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
    kinds = recipes()
    encoder = kinds["gathered"]().build_models({})["encoder"]
    start, initial = all_weights({"encoder": encoder}), encoder.get_weights()
    one = train(kinds["gathered"], initial)
    two = train(kinds["gathered"], initial, strategy)
    apart = train(kinds["not_gathered"], initial, strategy)
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
        train(kinds["matrix"], initial, strategy)
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
