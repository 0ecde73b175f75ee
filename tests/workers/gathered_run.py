"""NT-Xent with the global batch's negatives (``models.all_gather``) on one device and
on a MirroredStrategy over two logical CPUs, in its own process (logical devices must be
set before TensorFlow runs anything).

``mirrored OUT``: the docs' SimClr recipe (and a variant gathering both views as one
dict) on one device and on two replicas from the same initial weights, data and noise,
at one step per call, four, and ``"auto"``; data sets whose batches split into replica
shares of 5 and 4 rows (batches of 9, as ``(x,)`` tuples) or 21 and 20 (batches of 41),
each pass ending in a short batch (1 + 0: a replica with no rows; 2 + 2), so the shares
change within a compiled call; evaluations on the validation data and on data of a larger
batch; the gather's gradient against TensorFlow's own; data whose batch size TensorFlow
cannot compute; the misuses that are refused; last, a recipe gathering a matrix whose
second dimension is the replica's batch size, which fails in the gather. Writes JSON to
OUT: per case the largest weight differences, histories and evaluations; the errors'
classes and messages.
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
from beatloop.core.devices.collectives import Gathering, all_gather


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
    call after the logical devices are set); the same gathering both views as one dict;
    the same without the gather; the misuses; and one that gathers a (rows, rows)
    matrix, whose second dimension differs between replicas of 5 and 4 rows."""
    namespace: dict = {}
    find_block("class SimClr").run(namespace)
    docs = namespace["SimClr"]

    class Structured(docs):
        """The docs' loss with both views gathered as one dict."""

        def nt_xent(self, models, batch):
            x = batch["x"]
            views = [x + 0.3 * models.random.normal(tf.shape(x)) for _ in range(2)]
            first, second = (tf.math.l2_normalize(models["encoder"](v), axis=1) for v in views)
            both = models.all_gather({"first": first, "second": (second,)})
            everyone = tf.concat([both["first"], both["second"][0]], axis=0)
            total = tf.shape(everyone)[0] // 2
            own = models.batch_offset + tf.range(tf.shape(x)[0])

            def against_everyone(anchors, rows, positives):
                logits = tf.matmul(anchors, everyone, transpose_b=True) / self.temperature
                logits -= 1e9 * tf.one_hot(rows, 2 * total)
                return tf.nn.sparse_softmax_cross_entropy_with_logits(positives, logits)

            terms = [
                against_everyone(first, own, own + total),
                against_everyone(second, own + total, own),
            ]
            return tf.reduce_mean(tf.concat(terms, axis=0))

    class NotGathered(docs):
        def nt_xent(self, models, batch):
            return super().nt_xent(ReplicaOnly(models), batch)

    def misuse(gathered):
        class Misuse(docs):
            def nt_xent(self, models, batch):
                z = models["encoder"](batch["x"])
                return tf.reduce_mean(tf.concat(tf.nest.flatten(gathered(models, z)), 0))

        return Misuse

    class Matrix(docs):
        def nt_xent(self, models, batch):
            z = models["encoder"](batch["x"])
            return tf.reduce_mean(models.all_gather(tf.matmul(z, z, transpose_b=True)))

    return {
        "docs": docs,
        "structured": Structured,
        "not_gathered": NotGathered,
        "scalar": misuse(lambda models, z: models.all_gather(tf.reduce_mean(z))[None]),
        "ragged": misuse(lambda m, z: m.all_gather(tf.RaggedTensor.from_tensor(z)).flat_values),
        "doubled": misuse(lambda models, z: models.all_gather(tf.concat([z, z], 0))),
        "matrix": Matrix,
    }


#: Data sets: (batch size, training rows, validation rows, as (x,) tuples). Batches of 9:
#: shares 5 + 4, training's last batch 1 + 0, validation's 2 + 2; of 41: 21 + 20, then
#: 1 + 0 and 2 + 2.
CASES = {"5+4": (9, 28, 22, True), "21+20": (41, 83, 45, False)}
#: Steps per call under which each case runs on two replicas.
STEPS = (1, 4, "auto")


def data(case: str):
    from beatloop.datasets import digits_arrays

    size, rows, validation_rows, tuples = CASES[case]
    train, validation = digits_arrays(0)
    if tuples:  # mapped to dicts by beatloop: its batch size is still read
        return tuple(
            tf.data.Dataset.from_tensor_slices((arrays["x"][:n],)).batch(size)
            for arrays, n in ((train, rows), (validation, validation_rows))
        )
    return dict_batches(train, size, rows), dict_batches(validation, size, validation_rows)


def train(recipe_class, initial: list, split, strategy=None, spe=1, epochs=2):
    """``epochs`` from the ``initial`` encoder weights (models built in the strategy's
    scope, as the engine builds its own)."""
    recipe = recipe_class()
    with strategy.scope() if strategy else contextlib.nullcontext():
        models = recipe.build_models({})
    models["encoder"].set_weights(initial)
    return beatloop.fit(
        recipe, data=split, models=models, epochs=epochs, seed=3, strategy=strategy,
        steps_per_execution=spe, progress=False,
    )  # fmt: skip


def largest_difference(first: dict, second: dict) -> float:
    return max(float(np.abs(first[key] - second[key]).max()) for key in first)


def evaluation_data():
    """31 validation digits in batches of 15: shares 8 + 7 (more rows than validation's
    largest share, 5), and 1 + 0."""
    from beatloop.datasets import digits_arrays

    return dict_batches(digits_arrays(0)[1], 15, 31)


def compare(kind, case, initial, strategy) -> tuple[dict, dict]:
    """One device against two replicas at each of ``STEPS``, with evaluations; and the
    one-device run's weights."""
    split = data(case)
    one = train(kind, initial, split)
    ones = all_weights(one.models)
    report = {"one": one.history, "steps": {}, "two": {}, "weights": {}, "evaluations": {}}
    report["one_evaluation"] = one.evaluate(evaluation_data())
    for spe in STEPS:
        two = train(kind, initial, split, strategy, spe)
        report["weights"][str(spe)] = largest_difference(ones, all_weights(two.models))
        report["two"][str(spe)] = two.history
        report["steps"][str(spe)] = [one.steps, two.steps]
        if spe == 4:
            report["evaluations"] = {
                "validation": two.evaluate(steps_per_execution=4),
                "other": two.evaluate(evaluation_data(), steps_per_execution=4),
            }
    return report, ones


def gradients(strategy) -> dict:
    """A global batch of 5 rows split 3 + 2; ``loss_r = sum(c_r * gathered)`` on each
    replica with its own ``c_r``. The gather padded to 4 rows, and TensorFlow's own
    (padded to the step's largest share): the same values and gradients."""
    rows = tf.reshape(tf.range(5 * 3, dtype=tf.float32), [5, 3])
    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices({"x": rows}).batch(5)
    )
    weights = tf.reshape(tf.range(5 * 3, dtype=tf.float32) / 7.0, [5, 3])

    def on_replica(batch, ours: bool):
        x = batch["x"]
        replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
        with tf.GradientTape() as tape:
            tape.watch(x)
            if ours:
                gathered = all_gather(x, batch, Gathering(4, steps=4))
            else:
                gathered = tf.distribute.get_replica_context().all_gather(x, axis=0)
            loss = tf.reduce_sum(gathered * weights * (replica + 1.0))
        return gathered, tape.gradient(loss, x)

    @tf.function
    def step(batch, ours):
        return strategy.run(on_replica, args=(batch, ours))

    batch = next(iter(batches))
    found = {}
    for name, ours in (("ours", True), ("tensorflow", False)):
        gathered, gradient = step(batch, ours)
        found[name] = {
            "gathered": [t.numpy().tolist() for t in strategy.experimental_local_results(gathered)],
            "gradient": [t.numpy().tolist() for t in strategy.experimental_local_results(gradient)],
        }
    return found


def failure(run) -> dict:
    try:
        run()
    except beatloop.BeatloopError as error:
        return {
            "class": type(error).__name__,
            "data_error": isinstance(error, beatloop.DataError),
            "exit_code": error.exit_code,
            "message": str(error),
        }
    return {"class": None}


def mirrored(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    kinds = recipes()
    encoder = kinds["docs"]().build_models({})["encoder"]
    start, initial = all_weights({"encoder": encoder}), encoder.get_weights()
    report = {"replicas": strategy.num_replicas_in_sync, "gradients": gradients(strategy)}
    docs, ones = compare(kinds["docs"], "5+4", initial, strategy)
    report["cases"] = {
        "5+4": docs,
        "21+20": compare(kinds["structured"], "21+20", initial, strategy)[0],
    }
    report["moved"] = largest_difference(ones, start)
    apart = train(kinds["not_gathered"], initial, data("5+4"), strategy, 4)
    report["not_gathered"] = largest_difference(ones, all_weights(apart.models))
    # batches TensorFlow cannot size (a map after the batch): refused above one step a
    # call, padded to each step's own largest share at one
    unsized = tuple(d.map(lambda b: b) for d in data("21+20"))
    report["unsized"] = failure(lambda: train(kinds["docs"], initial, unsized, strategy, 4, 1))
    unsized_one = train(kinds["docs"], initial, unsized, epochs=1)
    unsized_two = train(kinds["docs"], initial, unsized, strategy, 1, 1)
    report["unsized_weights"] = largest_difference(
        all_weights(unsized_one.models), all_weights(unsized_two.models)
    )
    report["misuse"] = {
        name: failure(lambda name=name: train(kinds[name], initial, data("5+4"), strategy, 4, 1))
        for name in ("scalar", "ragged", "doubled")
    }
    # last: a failed collective leaves the process's collectives aborted
    report["failure"] = failure(lambda: train(kinds["matrix"], initial, data("5+4"), strategy))
    with open(out, "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    {"mirrored": mirrored}[sys.argv[1]](sys.argv[2])
