"""The multitask recipe's three-task PCGrad run for the resume test, in its own process:
``python pcgrad_run.py SPEC_JSON``. Like ``resumable_run.py`` (whose ``SignalAt`` it
uses to SIGKILL itself mid-epoch), but on data with a third task's labels, and writes
the final weights to an .npz (keys ``model/index``)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder: the other workers

import numpy as np
from combine_reference import PCGRAD, three_task_data
from helpers import all_weights
from resumable_run import SignalAt

import beatloop


def fit(spec: dict, callbacks=()):
    """The run ``spec`` describes, fitted in this process (the resume test fits its
    reference and resumed runs so; only the killed one needs a process of its own)."""
    return beatloop.fit(
        "multitask", config=PCGRAD, data=three_task_data(), epochs=spec["epochs"], seed=5,
        run_dir=spec["run_dir"], checkpoint_every=spec["checkpoint_every"],
        steps_per_execution=spec.get("steps_per_execution", 1), callbacks=list(callbacks),
        progress=False,
    )  # fmt: skip


def main(spec: dict) -> int:
    callbacks = [SignalAt(spec["kill_at"], signal.SIGKILL)] if spec.get("kill_at") else []
    result = fit(spec, callbacks)
    np.savez(spec["out"], **all_weights(result.models))
    print(json.dumps({"steps": result.steps, "resumed_from": result.resumed_from}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
