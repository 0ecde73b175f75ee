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


def main(spec: dict) -> int:
    kill = [] if spec.get("kill_at") is None else [SignalAt(spec["kill_at"], signal.SIGKILL)]
    result = beatloop.fit(
        "recommender",
        config=spec.get("config"),
        epochs=spec["epochs"],
        seed=spec["seed"],
        run_dir=spec["run_dir"],
        checkpoint_every=spec.get("checkpoint_every"),
        steps_per_execution=spec.get("steps_per_execution", "auto"),
        callbacks=kill,
        progress=False,
    )
    slots = {
        f"optimizer/{i}": np.array(v.numpy())
        for i, v in enumerate(result.optimizers["optimizer"].variables)
    }
    np.savez(spec["out"], **all_weights(result.models), **slots)
    print(json.dumps({"steps": result.steps, "resumed_from": result.resumed_from}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
