"""The built-in recommender recipe run in its own process (tests/test_recommender.py).

``python recommender_run.py SPEC_JSON``: one run for the resume test; it can SIGKILL
itself after a given step, and writes the final weights and optimizer variables to an
.npz.
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
from helpers import all_weights
from resumable_run import SignalAt

import beatloop


def fit(spec: dict, callbacks=()):
    """The run ``spec`` describes, fitted in this process (the resume test fits its
    reference and resumed runs so; only the killed one needs a process of its own)."""
    return beatloop.fit(
        "recommender",
        config=spec.get("config"),
        epochs=spec["epochs"],
        seed=spec["seed"],
        run_dir=spec["run_dir"],
        checkpoint_every=spec.get("checkpoint_every"),
        steps_per_execution=spec.get("steps_per_execution", "auto"),
        callbacks=list(callbacks),
        progress=False,
    )


def final(result) -> dict[str, np.ndarray]:
    """A run's final weights and optimizer variables (``model/index``, ``optimizer/i``)."""
    slots = {
        f"optimizer/{i}": np.array(v.numpy())
        for i, v in enumerate(result.optimizers["optimizer"].variables)
    }
    return {**all_weights(result.models), **slots}


def main(spec: dict) -> int:
    kill = [] if spec.get("kill_at") is None else [SignalAt(spec["kill_at"], signal.SIGKILL)]
    result = fit(spec, kill)
    np.savez(spec["out"], **final(result))
    print(json.dumps({"steps": result.steps, "resumed_from": result.resumed_from}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
