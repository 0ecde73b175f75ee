"""Distributed runs for the distribution tests, in their own processes (logical devices
and TF_CONFIG must be set before TensorFlow starts).

``mirrored OUT``: supervised and gan, each on one device and on a MirroredStrategy over
two logical CPUs with the same global batch; writes the largest weight difference and
both histories to OUT (JSON). ``worker OUT``: one worker of a MultiWorkerMirroredStrategy
(TF_CONFIG from the environment) training supervised; writes its weights to OUT (.npz).
``single OUT``: the same supervised run on one device, for reference.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf


def digits_data(recipe: str):
    """Unshuffled batches of 32 (256 training digits; 64 validation for supervised)."""
    from beatloop.data import digits_arrays

    train, validation = digits_arrays(0, signed=recipe == "gan")
    if recipe == "gan":
        return tf.data.Dataset.from_tensor_slices({"x": train["x"][:256]}).batch(32)
    train = {k: v[:256] for k, v in train.items()}
    validation = {k: v[:64] for k, v in validation.items()}
    return tuple(tf.data.Dataset.from_tensor_slices(d).batch(32) for d in (train, validation))


CONFIGS = {
    "supervised": {"optimizer": "sgd", "learning_rate": 0.1},
    "gan": {"n_critic": 2, "quality_samples": 32},
}


def starting_weights():
    """A callback keeping every model's weights as the run starts: how far training
    moves them is the scale a difference between runs is judged against. (Defined late:
    beatloop's callbacks import Keras, which must wait for the device setup.)"""
    import beatloop

    class StartingWeights(beatloop.Callback):
        weights: list = []

        def on_fit_start(self, run):
            self.weights = [
                w for name in sorted(run.models) for w in run.models[name].get_weights()
            ]

    return StartingWeights()


def train(recipe: str, strategy=None, callbacks=()):
    import beatloop

    return beatloop.fit(
        recipe,
        data=digits_data(recipe),
        config=CONFIGS[recipe],
        epochs=2,
        seed=7,
        strategy=strategy,
        callbacks=list(callbacks),
    )


def weights(result) -> list[np.ndarray]:
    return [w for name in sorted(result.models) for w in result.models[name].get_weights()]


def largest_difference(first, second) -> float:
    return max(float(np.abs(a - b).max()) for a, b in zip(first, second, strict=True))


def mirrored(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {"replicas": strategy.num_replicas_in_sync}
    for recipe in CONFIGS:
        start = starting_weights()
        one, two = train(recipe, callbacks=[start]), train(recipe, strategy)
        report[recipe] = {
            "max_difference": largest_difference(weights(one), weights(two)),
            "max_move": largest_difference(weights(one), start.weights),
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
    np.savez(out, *weights(result), history=np.array(json.dumps(result.history)))


if __name__ == "__main__":
    {"mirrored": mirrored, "worker": worker, "single": single}[sys.argv[1]](sys.argv[2])
