"""Runs of the BYOL-style test recipe (tests/updates_recipe.py) in their own processes.

``mirrored OUT``: the EMA recipe on one device and on a MirroredStrategy over two
logical CPUs (same global batch); writes the largest weight difference and how far
training moved the weights to OUT (JSON). ``resume SPEC_JSON``: one run with a run dir
that can SIGKILL itself once a compiled call ends at or past ``kill_at``; writes its
final weights to ``out`` (.npz, keys ``model/index``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder

import numpy as np
import tensorflow as tf
from helpers import all_weights, largest_difference
from updates_recipe import Byol, build_byol_models, byol_data

import beatloop


def mirrored(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    runs = {
        name: beatloop.fit(
            Byol("ema"), data=byol_data(), epochs=2, seed=5, strategy=s, progress=False
        )
        for name, s in (("one", None), ("two", strategy))
    }
    one, two = (all_weights(runs[name].models) for name in ("one", "two"))
    start = all_weights(build_byol_models())
    target = [key for key in one if key.startswith("target/")]
    report = {
        "replicas": strategy.num_replicas_in_sync,
        "max_difference": largest_difference(one, two),
        "target_move": largest_difference({k: one[k] for k in target}, start),
        "steps": [runs["one"].steps, runs["two"].steps],
    }
    Path(out).write_text(json.dumps(report))


class SignalAt(beatloop.Callback):
    """SIGKILLs this process once a compiled call ends at or past ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_execution_end(self, run, steps, logs):
        if run.step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def fit(spec: dict, callbacks=()):
    """The ``resume`` run ``spec`` describes, fitted in this process (the tests fit the
    reference and resumed runs so; only the killed one needs a process of its own)."""
    return beatloop.fit(
        Byol(spec["follow"], every=spec["every"]),
        data=byol_data(count=96),
        epochs=spec["epochs"],
        seed=5,
        run_dir=spec["run_dir"],
        checkpoint_every=spec["checkpoint_every"],
        steps_per_execution=spec["steps_per_execution"],
        callbacks=list(callbacks),
        progress=False,
    )


def resume(spec: dict) -> None:
    result = fit(spec, [] if spec.get("kill_at") is None else [SignalAt(spec["kill_at"])])
    np.savez(spec["out"], **all_weights(result.models))
    print(json.dumps({"steps": result.steps, "resumed_from": result.resumed_from}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "mirrored":
        mirrored(sys.argv[2])
    else:
        resume(json.loads(sys.argv[2]))
