"""The text classifier (``sparse_classifier.py``) on one device and on a MirroredStrategy
over two logical CPUs, for ``test_sparse_updates.py``: ``python sparse_mirrored.py OUT``.
Batches of 33 (replica shares of 17 and 16 rows), four steps a call, Adam; plain,
accumulating two batches, and clipped by global norm. Writes, per run, how far the two
replicas and the one device end from the hand-written loop handing Adam the dense
gradient, how far Keras's form of the rows ends from it, and how far training moved the
weights, to OUT (JSON)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder

import keras
import tensorflow as tf
from helpers import all_weights, largest_difference
from sparse_classifier import OneBeat, hand_written, text_classifier, token_batches

import beatloop

CLIP = beatloop.ClipByGlobalNorm(0.05)
RUNS = {
    # name: (the beat's settings, the hand-written loop's batch size and transform)
    "plain": ({}, 33, None),
    "accumulate": ({"accumulate": 2}, 66, None),  # 33 + 33 rows an update, as one of 66
    "clip": ({"transform": CLIP}, 33, CLIP),
}


def adam() -> keras.optimizers.Optimizer:
    return keras.optimizers.Adam(1e-2)


def main(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {"replicas": strategy.num_replicas_in_sync, "runs": {}}
    start = all_weights({"model": text_classifier()})
    for name, (beat, batch, transform) in RUNS.items():
        ends = {}
        for side, chosen in (("one_device", None), ("two_replicas", strategy)):
            result = beatloop.fit(
                OneBeat(adam, **beat), data=(token_batches(33), None), epochs=2, seed=0,
                strategy=chosen, steps_per_execution=4, progress=False,
            )  # fmt: skip
            ends[side] = all_weights(result.models)
        dense, keras_form = (
            all_weights({"model": hand_written(token_batches(batch), 2, adam(), form,
                                               transform=transform)})
            for form in ("dense", "keras")
        )  # fmt: skip
        report["runs"][name] = {
            "one_device": largest_difference(ends["one_device"], dense),
            "two_replicas": largest_difference(ends["two_replicas"], dense),
            "keras_form": largest_difference(keras_form, dense),
            "moved": largest_difference(dense, start),
        }
    Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
