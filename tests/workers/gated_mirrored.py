"""Gated beats on one device and on a MirroredStrategy over two logical CPUs (same
global batch), for ``test_accumulate.py``: ``python gated_mirrored.py OUT``. Writes,
per run, the largest weight difference between the two, how far training moved the
weights and each run's update counts per epoch, to OUT (JSON); and the one-device run
of ``only_if_accumulate_clip`` (``worker_run`` without a strategy: the multi-worker
test's reference), its weights and update counts, to OUT with the suffix .npz. ``python
gated_mirrored.py --worker OUT``: one worker of a MultiWorkerMirroredStrategy (TF_CONFIG
from the environment) training ``only_if_accumulate_clip``, its weights and update
counts to OUT (.npz)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder: the other workers

import keras
import numpy as np
import tensorflow as tf
from gated_recipes import Classifier, ThresholdGan, digit_batches
from helpers import all_weights, gan_data, largest_difference

import beatloop

CLIP = beatloop.ClipByGlobalNorm(0.05)
RUNS = {
    # name: (recipe factory, data factory, the figure counting updates)
    "accumulate": (
        lambda: Classifier(lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.05), accumulate=4),
        lambda: digit_batches(8), "loss_updates",
    ),
    "only_if": (
        lambda: Classifier(lambda: keras.optimizers.Adam(1e-2), only_if="bright"),
        lambda: digit_batches(8), "loss_updates",
    ),
    "only_if_accumulate_clip": (
        lambda: Classifier(lambda: keras.optimizers.SGD(0.5), only_if="bright", accumulate=3,
                           transform=CLIP),
        lambda: digit_batches(8), "loss_updates",
    ),
    "ema_after_beat": (
        lambda: Classifier(lambda: keras.optimizers.SGD(0.1), only_if="bright", ema="loss"),
        lambda: digit_batches(8), "loss_updates",
    ),
    "gan_threshold": (lambda: ThresholdGan(threshold=1.2), lambda: gan_data(128, 16),
                      "d_loss_updates"),
}  # fmt: skip


def worker_run(strategy=None):
    """The multi-worker test's run: a condition of the global batch, accumulation and a
    clip, with a strategy (each worker) or without (the reference)."""
    recipe, data, _ = RUNS["only_if_accumulate_clip"]
    return beatloop.fit(recipe(), data=data(), epochs=2, seed=3, strategy=strategy,
                        progress=False, steps_per_execution=4)  # fmt: skip


def save_worker(out, result=None) -> None:
    """A run's weights and update counts to ``out`` (.npz): ``result``, or the worker's
    run under a MultiWorkerMirroredStrategy."""
    if result is None:
        result = worker_run(tf.distribute.MultiWorkerMirroredStrategy())
    counts = np.array(result.history["loss_updates"])
    np.savez(out, **all_weights(result.models), updates=counts)


def main(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {"replicas": strategy.num_replicas_in_sync, "runs": {}}
    for name, (recipe, data, counted) in RUNS.items():
        start = all_weights(recipe().build_models(None))
        runs = [
            beatloop.fit(recipe(), data=data(), epochs=2, seed=3, strategy=s, progress=False,
                         steps_per_execution=4)
            for s in (None, strategy)
        ]  # fmt: skip
        if name == "only_if_accumulate_clip":  # worker_run(): the multi-worker reference
            save_worker(Path(out).with_suffix(".npz"), runs[0])
        one, two = (all_weights(run.models) for run in runs)
        report["runs"][name] = {
            "max_difference": largest_difference(one, two),
            "moved": largest_difference(one, start),
            "updates_one": runs[0].history[counted],
            "updates_two": runs[1].history[counted],
        }
    Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        save_worker(sys.argv[2])
    else:
        main(sys.argv[1])
