"""Runs of the old plugin's ``distill`` recipe (``tests/old_plugin``, written from
beatloop 0.1.0's docs) for ``test_old_plugin.py``, in the throwaway environment it is
installed in (the live one lacks it): ``python old_plugin_run.py OUT``. Prints one JSON
line last:

- ``warnings``: every warning the process raised from its first registry lookup (which
  loads the plugins, importing the plugin's modules) to the end of its last run, each
  recorded as often as it was raised (``"always"``): category, message, file and line;
- ``plugin_file``: the file of the plugin's recipe module, as imported;
- ``recipes``, ``origin``, ``failed``: the recipes it finds, where ``distill`` came from,
  and the entry points that failed to load;
- ``runs``: ``distill`` at its defaults with the plugin's ``distill_gap`` callback, for
  1 epoch in ``OUT/split`` then for 2 epochs there (a resume), and for 2 epochs
  uninterrupted in ``OUT/whole``: what each run did. The weights after each run are
  written to ``OUT/first.npz``, ``OUT/resumed.npz`` and ``OUT/whole.npz`` (keys
  ``model/index``, as ``helpers.all_weights`` names them).
"""

from __future__ import annotations

import io
import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import numpy as np
from helpers import all_weights

import beatloop
from beatloop.plugins.registry import registry


def runs(out: Path) -> dict:
    gap = registry().callback("distill_gap").cls
    done = {}
    for name, run_dir, epochs in [
        ("first", "split", 1),
        ("resumed", "split", 2),
        ("whole", "whole", 2),
    ]:
        printed = io.StringIO()
        callback = gap(stream=printed)
        result = beatloop.fit(
            "distill",
            epochs=epochs,
            seed=0,
            run_dir=out / run_dir,
            callbacks=[callback],
            progress=False,
        )
        np.savez(out / f"{name}.npz", **all_weights(result.models))
        done[name] = {
            "steps": result.steps,
            "checkpoint": result.checkpoint,
            "resumed_from": result.resumed_from,
            "history": result.history,
            "applies": {key: int(opt.iterations) for key, opt in result.optimizers.items()},
            "gaps": callback.gaps,
            "agreements": callback.agreements,
            "printed": printed.getvalue().splitlines(),
        }
    return done


def main(out: Path) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recipes = beatloop.recipes()  # the first lookup: loads every plugin
        record = {
            "recipes": recipes,
            "origin": registry().recipe("distill").origin,
            "failed": [[f.plugin, f.origin, f.error] for f in registry().failures],
            "plugin_file": sys.modules["bl_distill.distill"].__file__,
            "runs": runs(out),
        }
    record["warnings"] = [
        {
            "category": caught_warning.category.__name__,
            "message": str(caught_warning.message),
            "filename": caught_warning.filename,
            "lineno": caught_warning.lineno,
        }
        for caught_warning in caught
    ]
    return record


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
