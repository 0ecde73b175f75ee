"""Distributed runs for the distribution tests, in their own processes (logical devices
and TF_CONFIG must be set before TensorFlow starts).

``mirrored OUT``: supervised and gan, each on one device and on a MirroredStrategy over
two logical CPUs with the same global batch; writes the largest weight difference and
both histories to OUT (JSON). ``worker OUT``: one worker of a MultiWorkerMirroredStrategy
(TF_CONFIG from the environment) training supervised; writes its weights to OUT (.npz,
keys ``model/index`` as ``helpers.all_weights`` names them, and ``history``, JSON).
``single OUT``: the same supervised run on one device, for reference.

Importing TensorFlow, Keras and beatloop (as ``helpers`` does) leaves the runtime
uninitialised; the logical devices are set up in ``mirrored`` before anything runs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import numpy as np
import tensorflow as tf
from helpers import all_weights, dict_batches, gan_data

import beatloop


def digits_data(recipe: str):
    """Unshuffled batches of 32 (256 training digits; 64 validation for supervised)."""
    if recipe.startswith("gan"):
        return gan_data(256)
    from beatloop.datasets import digits_arrays

    train, validation = digits_arrays(0)
    return dict_batches(train, 32, 256), dict_batches(validation, 32, 64)


CONFIGS = {
    "supervised": {"optimizer": "sgd", "learning_rate": 0.1},
    "gan": {"n_critic": 2, "quality_samples": 32},
    "gan_simultaneous": {"update": "simultaneous", "quality_samples": 32},
}


class LastLosses(beatloop.Callback):
    """Every step's beat losses (``last_`` + beat name): it asks for one step a call."""

    max_steps_per_execution = 1

    def __init__(self):
        self.values: list[dict[str, float]] = []

    def on_execution_end(self, run, steps, logs):
        self.values.append({k: logs[k] for k in logs if k.startswith("last_")})


class StartingWeights(beatloop.Callback):
    """Keeps every model's weights as the run starts: how far training moves them is the
    scale a difference between runs is judged against."""

    weights: dict[str, np.ndarray]

    def on_fit_start(self, run):
        self.weights = all_weights(run.models)


def train(recipe: str, strategy=None, callbacks=()):
    return beatloop.fit(
        recipe.partition("_")[0],
        data=digits_data(recipe),
        config=CONFIGS[recipe],
        epochs=2,
        seed=7,
        strategy=strategy,
        callbacks=list(callbacks),
    )


def largest_difference(first: dict, second: dict) -> float:
    assert sorted(first) == sorted(second)
    return max(float(np.abs(first[key] - second[key]).max()) for key in first)


def mirrored(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {"replicas": strategy.num_replicas_in_sync}
    for recipe in CONFIGS:
        start, last_one, last_two = StartingWeights(), LastLosses(), LastLosses()
        one = train(recipe, callbacks=[start, last_one])
        two = train(recipe, strategy, callbacks=[last_two])
        report[recipe] = {
            "last": [last_one.values, last_two.values],
            "max_difference": largest_difference(all_weights(one.models), all_weights(two.models)),
            "max_move": largest_difference(all_weights(one.models), start.weights),
            "one": one.history,
            "two": two.history,
            "steps": [one.steps, two.steps],
        }
    with open(out, "w") as handle:
        json.dump(report, handle)


def worker(out: str) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    save(train("supervised", strategy), out)


def single(out: str) -> None:
    save(train("supervised"), out)


def save(result, out: str) -> None:
    np.savez(out, **all_weights(result.models), history=np.array(json.dumps(result.history)))


if __name__ == "__main__":
    {"mirrored": mirrored, "worker": worker, "single": single}[sys.argv[1]](sys.argv[2])
