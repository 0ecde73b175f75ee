"""The divergence guard on one device and on a MirroredStrategy over two logical CPUs
(logical devices must be set before TensorFlow starts, hence a process of its own).

``divergence_mirrored.py OUT``: supervised on 10 unshuffled batches of 32 digits, the
7th with its pixels times 100, ``divergence=10``, 4 steps per call, on each; writes
to OUT (JSON) the replica count and, per run, the step it stopped at and the loss and
median its message names.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import numpy as np
import tensorflow as tf
from helpers import dict_batches

import beatloop
from beatloop.datasets import digits_arrays


def data():
    train, _ = digits_arrays(0)
    train = {key: np.array(values[:320], copy=True) for key, values in train.items()}
    train["x"][192:224] *= 1000.0
    return dict_batches(train, 32)


def stop(strategy=None) -> dict:
    try:
        beatloop.fit(
            "supervised", data=data(), seed=7, divergence=10, steps_per_execution=4,
            strategy=strategy, progress=False,
        )  # fmt: skip
    except beatloop.NumericsError as error:
        found = re.search(r"loss (\S+) is above 10 times its running median (\S+) at step (\d+)",
                          str(error))  # fmt: skip
        return {"numbers": [float(found[1]), float(found[2])], "step": int(found[3])}
    raise AssertionError("the guard did not stop the run")


def main(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {"replicas": strategy.num_replicas_in_sync, "one": stop(), "two": stop(strategy)}
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
