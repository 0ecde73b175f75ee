"""The meta recipe on one device and on a MirroredStrategy over two logical CPUs, in
its own process (logical devices must be set before TensorFlow runs anything).

``OUT``: for each order, three epochs from the same initial weights and seed (so the
same tasks) of 21 training tasks in batches of 5: the replicas get 3 and 2 tasks of a
full batch, and 1 and none of the last batch of one task. Writes JSON to OUT: the
replica count, per order the largest weight difference between the two runs, how far
training moved the weights, both histories and both step counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import keras
import numpy as np
import tensorflow as tf
from helpers import all_weights

import beatloop

CONFIG = {"batch_size": 5, "train_tasks": 21, "validation_tasks": 7, "support": 5, "query": 5}


def largest_difference(first: dict, second: dict) -> float:
    return max(float(np.abs(first[key] - second[key]).max()) for key in first)


def train(recipe, initial: list, strategy=None):
    """Three epochs from the ``initial`` learner weights (built in the strategy's scope,
    as the engine builds its own models)."""
    with strategy.scope() if strategy else contextlib.nullcontext():
        models = recipe.build_models({})
    models["learner"].set_weights(initial)
    return beatloop.fit(recipe, models=models, epochs=3, seed=2, strategy=strategy, progress=False)


def main(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report: dict = {"replicas": strategy.num_replicas_in_sync}
    for order in ("second", "first"):
        recipe = beatloop.make_recipe("meta", {**CONFIG, "order": order})
        keras.utils.set_random_seed(0)
        initial = recipe.build_models({})["learner"].get_weights()
        runs = [train(recipe, initial, s) for s in (None, strategy)]
        one, two = (all_weights(run.models) for run in runs)
        start = dict(zip((f"learner/{i}" for i in range(len(initial))), initial, strict=True))
        report[order] = {
            "difference": largest_difference(one, two),
            "moved": largest_difference(one, start),
            "one": runs[0].history,
            "two": runs[1].history,
            "steps": [run.steps for run in runs],
        }
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
