"""An optimizer's own clipping (``clipnorm``, ``global_clipnorm``, ``clipvalue``) on one
device and on a MirroredStrategy over two logical CPUs (same global batch), for
``test_edges_port.py``: ``python optimizer_clip_mirrored.py OUT``. Writes, per run, the
largest weight difference between the two and how far training moved the weights, to
OUT (JSON)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import keras
import tensorflow as tf
from gated_recipes import Classifier, digit_batches
from helpers import all_weights, largest_difference

import beatloop

RUNS = {
    # name: (the optimizer's clipping option, accumulate)
    "global_clipnorm": ({"global_clipnorm": 0.05}, 1),
    "global_clipnorm_accumulate": ({"global_clipnorm": 0.05}, 4),
    "clipnorm": ({"clipnorm": 0.02}, 1),
    "clipvalue": ({"clipvalue": 0.002}, 1),
}


def main(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {"replicas": strategy.num_replicas_in_sync, "runs": {}}
    for name, (clip, accumulate) in RUNS.items():

        def recipe(clip=clip, accumulate=accumulate):
            return Classifier(lambda: keras.optimizers.SGD(0.5, **clip), accumulate=accumulate)

        start = all_weights(recipe().build_models(None))
        runs = [
            beatloop.fit(recipe(), data=digit_batches(16, count=128), epochs=1, seed=3,
                         strategy=s, progress=False, steps_per_execution=4)
            for s in (None, strategy)
        ]  # fmt: skip
        one, two = (all_weights(run.models) for run in runs)
        report["runs"][name] = {
            "max_difference": largest_difference(one, two),
            "moved": largest_difference(one, start),
        }
    Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
