"""The supervised recipe with an evaluated average (``ema_decay``) on one device and on a
MirroredStrategy over two logical CPUs (same global batches), for ``test_averaged.py``:
``python averaged_mirrored.py OUT``. Writes both runs' validation figures, the largest
weight difference between them and the export's outputs to OUT (JSON)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import numpy as np
import tensorflow as tf
from helpers import all_weights

import beatloop


def run(strategy, out: Path):
    result = beatloop.fit("supervised", config={"ema_decay": 0.8, "hidden": 16}, epochs=2,
                          steps_per_epoch=6, seed=5, strategy=strategy, progress=False,
                          steps_per_execution=3)  # fmt: skip
    served = tf.saved_model.load(str(result.export(out)["model"]))
    x = tf.constant(np.linspace(-1, 1, 5 * 64).reshape(5, 64), tf.float32)
    figures = {name: values[-1] for name, values in result.history.items()}
    return figures, all_weights(result.models), served.serve(x).numpy()


def main(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with tempfile.TemporaryDirectory() as folder:
        one, two = (run(s, Path(folder) / name) for s, name in ((None, "one"), (strategy, "two")))
    report = {
        "replicas": strategy.num_replicas_in_sync,
        "figures": [one[0], two[0]],
        "max_weight_difference": max(float(np.max(np.abs(one[1][k] - two[1][k]))) for k in one[1]),
        "max_served_difference": float(np.max(np.abs(one[2] - two[2]))),
    }
    Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
