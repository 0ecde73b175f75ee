"""The contrastive recipe on one device and on a MirroredStrategy over two logical CPUs,
in its own process (logical devices must be set before TensorFlow runs anything).

``python contrastive_mirrored.py OUT``: for each target (``none``: SimCLR, ``ema``:
BYOL), one epoch of pretraining and one of the linear probe from the same initial
weights, data (37 training and 37 validation digits in global batches of 9: replica
shares of 5 and 4, then a last batch of one row, split 1 + 0, so one replica has no rows)
and seed, once per device setup.
Writes JSON to OUT: per target the largest weight difference between the two, how far
training moved the weights, both histories and the step counts.
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
from contrastive_hand import SMALL, digits_data
from helpers import all_weights

import beatloop


def train(target: str, initial: dict, strategy=None):
    data = digits_data(37, 9, 37)
    config = {**SMALL, "target": target, "pretrain_epochs": 1}
    recipe = beatloop.make_recipe("contrastive", config)
    with strategy.scope() if strategy else contextlib.nullcontext():
        models = recipe.build_models(data[0].element_spec)
    for name, model in models.items():
        model.set_weights(initial[name])
    return beatloop.fit(
        recipe, data=data, models=models, epochs=2, seed=3, strategy=strategy, progress=False
    )


def largest_difference(first: dict, second: dict) -> float:
    return max(float(np.abs(first[key] - second[key]).max()) for key in first)


def compare(target: str, strategy) -> dict:
    recipe = beatloop.make_recipe("contrastive", {**SMALL, "target": target})
    built = recipe.build_models(digits_data(37, 9, 37)[0].element_spec)
    initial = {name: model.get_weights() for name, model in built.items()}
    one, two = train(target, initial), train(target, initial, strategy)
    ones = all_weights(one.models)
    return {
        "replicas": strategy.num_replicas_in_sync,
        "moved": largest_difference(ones, all_weights(built)),
        "largest_difference": largest_difference(ones, all_weights(two.models)),
        "one": one.history,
        "two": two.history,
        "steps": [one.steps, two.steps],
    }


def main(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {target: compare(target, strategy) for target in ("none", "ema")}
    with open(out, "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main(sys.argv[1])
