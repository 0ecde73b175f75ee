"""Runs of the example plugin's ``wgan_gp`` recipe (and of the built-in ``dqn`` on its
``grid`` environment) for ``test_example_plugin.py``, in
the throwaway environment the plugin is installed in (the live one lacks it):
``python plugin_run.py MODE OUT``. Each mode prints one JSON line last; mode ``all``
runs the four below in one process (one TensorFlow start-up), ``list`` first, and prints
``{mode: record}``.

``list OUT``: what ``beatloop list --verbose`` prints, run first thing in the process
(no registry loaded yet, as in a new process of the command).
``train OUT``: 2 epochs of the default config with the plugin's ``epoch_timer``
callback; prints the history and how often each optimizer applied.
``resume OUT``: a small config run for 1 epoch in ``OUT/split`` then for 2 epochs there
(a resume), and for 2 epochs uninterrupted in ``OUT/whole``; writes the weights after
each run to ``OUT/first.npz``, ``OUT/resumed.npz`` and ``OUT/whole.npz`` (keys
``model/index``, as ``helpers.all_weights`` names them) and prints what each run did.
``grid OUT``: 1 epoch (1,000 steps) of ``dqn`` with ``env=grid``; prints the history and where the
environment came from.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import numpy as np
from helpers import all_weights

import beatloop
from beatloop.cli import main
from beatloop.plugins.registry import registry

# Small enough for a few seconds a run: 1,437 training digits in batches of 64.
SMALL = {"hidden": 16, "n_critic": 2, "batch_size": 64}


def listed(out: Path) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["list", "--verbose"]) == 0
    return printed.getvalue()


def train(out: Path) -> dict:
    timer = registry().callback("epoch_timer").cls()
    result = beatloop.fit("wgan_gp", epochs=2, seed=0, callbacks=[timer], progress=False)
    return {
        "history": result.history,
        "timed": len(timer.seconds),
        "critic_applies": int(result.optimizers["critic_opt"].iterations),
        "generator_applies": int(result.optimizers["generator_opt"].iterations),
        "steps": result.steps,
    }


def resume(out: Path) -> dict:
    runs = {}
    for name, run_dir, epochs in [
        ("first", "split", 1),
        ("resumed", "split", 2),
        ("whole", "whole", 2),
    ]:
        result = beatloop.fit(
            "wgan_gp", config=SMALL, epochs=epochs, seed=0, run_dir=out / run_dir, progress=False
        )
        np.savez(out / f"{name}.npz", **all_weights(result.models))
        runs[name] = {
            "steps": result.steps,
            "checkpoint": result.checkpoint,
            "resumed_from": result.resumed_from,
            "history": result.history,
        }
    return runs


def grid(out: Path) -> dict:
    result = beatloop.fit("dqn", config={"env": "grid"}, epochs=1, seed=0, progress=False)
    entry = registry().environment("grid")
    return {
        "history": result.history,
        "origin": entry.origin,
        "optimal_return": result.recipe.environment.optimal_return,
    }


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    modes = {"list": listed, "train": train, "resume": resume, "grid": grid}
    if mode == "all":
        print(json.dumps({name: run(out) for name, run in modes.items()}))
    else:
        print(json.dumps(modes[mode](out)))
