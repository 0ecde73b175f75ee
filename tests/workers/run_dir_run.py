"""A training run for the run dir tests, in its own process: ``python run_dir_run.py
SPEC_JSON``. It can send itself a signal after a given step (``signal_at: [STEP, NAME]``),
or stop after a given step until a file appears (``pause_at``, ``paused_file``,
``go_file``: it writes its pid into ``paused_file`` and holds its run dir meanwhile). It
writes the final weights to ``out`` (keys ``model/index``, as ``helpers.all_weights``
names them) and exits with the error's ``exit_code`` when beatloop stops it, as the
command line does."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import numpy as np
from helpers import all_weights
from resumable_run import SignalAt  # the same callback as the SIGKILL worker's

import beatloop


class PauseAt(beatloop.Callback):
    """Once a compiled call ends at or past ``step``: write the pid to ``paused``, then
    wait (at most two minutes) until the file ``go`` exists."""

    def __init__(self, step: int, paused: str, go: str):
        self.step, self.paused, self.go, self.done = step, Path(paused), Path(go), False

    def on_execution_end(self, run, steps, logs):
        if self.done or run.step < self.step:
            return
        self.done = True
        self.paused.write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not self.go.exists() and time.monotonic() < deadline:
            time.sleep(0.1)


def callbacks(spec: dict) -> list:
    made = []
    if spec.get("signal_at") is not None:
        step, name = spec["signal_at"]
        made.append(SignalAt(step, getattr(signal, name)))
    if spec.get("pause_at") is not None:
        made.append(PauseAt(spec["pause_at"], spec["paused_file"], spec["go_file"]))
    return made


def fit(spec: dict, callbacks=()):
    """The run ``spec`` describes, fitted in this process (a test fits its reference
    and resumed runs so; the run a signal or a second run must meet has its own)."""
    return beatloop.fit(
        spec["recipe"],
        config=spec.get("config"),
        epochs=spec["epochs"],
        seed=spec.get("seed"),
        run_dir=spec["run_dir"],
        checkpoint_every=spec.get("checkpoint_every"),
        steps_per_execution=spec.get("steps_per_execution", 1),
        callbacks=list(callbacks),
        progress=False,
    )


def main(spec: dict) -> int:
    try:
        result = fit(spec, callbacks(spec))
    except beatloop.RunInterrupted as error:
        print(json.dumps({"interrupted": str(error), "checkpoint": error.checkpoint}), flush=True)
        return error.exit_code
    except beatloop.BeatloopError as error:
        print(f"error: {type(error).__name__}: {error}", flush=True)
        return error.exit_code
    np.savez(spec["out"], **all_weights(result.models))
    print(json.dumps({"steps": result.steps, "resumed_from": result.resumed_from}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
