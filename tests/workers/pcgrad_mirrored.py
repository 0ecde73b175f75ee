"""The multitask recipe's three-task PCGrad on one device and on a MirroredStrategy over
two logical CPUs (same global batch), for ``test_combine.py``: ``python
pcgrad_mirrored.py OUT [REFERENCE_OUT]``. Logical devices must be set before TensorFlow
starts, hence a process of its own. Writes the largest weight difference between the two
runs and how far training moved the weights to OUT (JSON). With REFERENCE_OUT, the same
process first runs ``combine_reference.py``'s bit-for-bit comparisons into it (before
anything else is traced: the clean slate they need), saving the test a process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder: the other workers

import combine_reference
import keras
import tensorflow as tf
from combine_reference import PCGRAD, largest_difference, three_task_data
from helpers import all_weights

import beatloop


def main(out: str, reference_out: str | None = None) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    if reference_out is not None:
        combine_reference.main(reference_out)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    recipe = beatloop.make_recipe("multitask", PCGRAD)
    data = three_task_data()
    keras.utils.set_random_seed(3)
    start = all_weights(recipe.build_models(data.element_spec))
    runs = [
        beatloop.fit(recipe, data=data, epochs=2, seed=3, strategy=strategy, progress=False)
        for strategy in (None, strategy)
    ]
    one, two = (all_weights(run.models) for run in runs)
    report = {
        "replicas": strategy.num_replicas_in_sync,
        "max_difference": largest_difference(one, two),
        "max_move": largest_difference(one, start),
    }
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
