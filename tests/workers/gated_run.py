"""A gated run for the resume tests, in its own process: ``python gated_run.py
SPEC_JSON``. ``recipe`` is ``accumulate`` (the classifier summing 4 batches of 8 into
one Adam update) or ``only_if`` (the threshold GAN, its discriminator's updates skipped
while its loss is low); like ``pcgrad_run.py`` it SIGKILLs itself at ``kill_at``
(``resumable_run.SignalAt``) and writes the final weights to ``out`` (.npz)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder: the other workers

import keras
import numpy as np
from gated_recipes import Classifier, ThresholdGan, digit_batches
from helpers import all_weights, gan_data
from resumable_run import SignalAt

import beatloop


def recipe_and_data(name: str):
    if name == "accumulate":
        return Classifier(lambda: keras.optimizers.Adam(1e-2), accumulate=4), digit_batches(8)
    return ThresholdGan(threshold=1.3), gan_data(128, 16)


def fit(spec: dict, callbacks=()):
    """The run ``spec`` describes, fitted in this process (the resume tests fit their
    reference and resumed runs so; only the killed one needs a process of its own)."""
    recipe, data = recipe_and_data(spec["recipe"])
    return beatloop.fit(
        recipe, data=data, epochs=spec["epochs"], seed=5, run_dir=spec["run_dir"],
        checkpoint_every=spec["checkpoint_every"], callbacks=list(callbacks),
        steps_per_execution=spec.get("steps_per_execution", 1), progress=False,
    )  # fmt: skip


def main(spec: dict) -> int:
    callbacks = [SignalAt(spec["kill_at"], signal.SIGKILL)] if spec.get("kill_at") else []
    result = fit(spec, callbacks)
    np.savez(spec["out"], **all_weights(result.models))
    print(json.dumps({"steps": result.steps, "resumed_from": result.resumed_from}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
