"""A training run for the resume tests, in its own process: ``python resumable_run.py
SPEC_JSON``. It can SIGKILL itself after a given step (a real crash, mid-epoch, at a
moment the test chooses) or fill its disk, and writes the final weights to an .npz
(keys ``model/index``, as ``helpers.all_weights`` names them)."""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import numpy as np
from helpers import all_weights

import beatloop
from beatloop.named_data.load import NamedData


class FileSizeLimitAt(beatloop.Callback):
    """From ``step`` on, no file this process writes may grow past ``size`` bytes: the
    disk is "full" for the next checkpoint (writes fail with EFBIG, not a signal)."""

    def __init__(self, step: int, size: int):
        self.step, self.size = step, size

    def on_execution_end(self, run, steps, logs):
        if run.step >= self.step:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.size, resource.RLIM_INFINITY))


class SignalAt(beatloop.Callback):
    """Sends this process ``signum`` once a compiled call ends at or past ``step``."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum, self.sent = step, signum, False

    def on_execution_end(self, run, steps, logs):
        if not self.sent and run.step >= self.step:
            self.sent = True
            os.kill(os.getpid(), self.signum)


def fit(spec: dict, callbacks=()):
    """The run ``spec`` describes, fitted in this process (a test fits its reference
    and resumed runs so; only the run that is killed needs a process of its own)."""
    named = spec.get("data")  # {"source": "KIND:PATH", "settings": [...]}: as --data gives
    data = NamedData(named["source"], tuple(named.get("settings", ()))) if named else None
    return beatloop.fit(
        spec["recipe"],
        data=data,
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
    callbacks = []
    if spec.get("kill_at") is not None:
        callbacks.append(SignalAt(spec["kill_at"], signal.SIGKILL))
    if spec.get("full_disk_at") is not None:
        callbacks.append(FileSizeLimitAt(spec["full_disk_at"], 1024))
    try:
        result = fit(spec, callbacks)
    except beatloop.BeatloopError as error:
        print(f"error: {type(error).__name__}: {error}", flush=True)
        return 2
    np.savez(spec["out"], **all_weights(result.models))
    print(json.dumps({"steps": result.steps, "resumed_from": result.resumed_from}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
