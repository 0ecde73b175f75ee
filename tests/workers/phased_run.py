"""A run of the two-phase test recipe (``tests/phased_recipe.py``) in its own process, for
the resume tests: ``python phased_run.py SPEC_JSON``. It can SIGKILL itself once a
compiled call ends at or past a given step, and writes the final weights to an .npz
(keys ``model/index``, as ``helpers.all_weights`` names them)."""

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
from phased_recipe import PretrainThenProbe

import beatloop


class KillAt(beatloop.Callback):
    """SIGKILLs this process once a compiled call ends at or past ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_execution_end(self, run, steps, logs):
        if run.step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def fit(spec: dict, callbacks=()):
    """The run ``spec`` describes, fitted in this process (the resume test fits its
    reference and resumed runs so; only the killed one needs a process of its own)."""
    return beatloop.fit(
        PretrainThenProbe,
        epochs=spec["epochs"],
        seed=3,
        run_dir=spec["run_dir"],
        checkpoint_every=spec["checkpoint_every"],
        steps_per_execution=1,
        callbacks=list(callbacks),
        progress=False,
    )


def main(spec: dict) -> int:
    result = fit(spec, [KillAt(spec["kill_at"])] if spec.get("kill_at") is not None else [])
    np.savez(spec["out"], **all_weights(result.models))
    print(json.dumps({"steps": result.steps, "resumed_from": result.resumed_from}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
