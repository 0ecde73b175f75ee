"""The runs ``test_same_process.py`` makes several times in one process, and their
reference in a fresh one: ``python same_process.py CASE OUT.npz`` fits CASE first thing
in the process and writes its final weights to OUT (keys ``model/index``).

``Ensemble`` sums the logits of five unnamed models: Keras names them from its process
counters, and Grappler orders the sum's operands by node name, so where the process
built other models first the sum can be added in another order.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import keras
import numpy as np
import tensorflow as tf
from helpers import all_weights, dict_batches, gan_data

import beatloop
from beatloop.datasets import digits_arrays


class Ensemble(beatloop.Recipe):
    """Five unnamed Dense(10) models over the digits, fitted together: the loss is the
    cross-entropy of the sum of their logits (test recipe)."""

    name = "ensemble_same_process_test"
    batch_keys = {"x": 2, "y": 1}
    members = 5

    def build_models(self, batch_spec):
        return {
            f"m{index}": keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
            for index in range(self.members)
        }

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.05)}

    def losses(self):
        return {"loss": self.loss}

    def loss(self, models, batch):
        logits = models["m0"](batch["x"])
        for index in range(1, self.members):
            logits = logits + models[f"m{index}"](batch["x"])
        values = keras.losses.sparse_categorical_crossentropy(batch["y"], logits, from_logits=True)
        return tf.reduce_mean(values)

    def schedule(self):
        updates = tuple(f"m{index}" for index in range(self.members))
        return beatloop.Schedule(beatloop.Beat(loss="loss", optimizer="sgd", updates=updates))


GAN = {"architecture": "conv", "hidden": 16, "latent_dim": 8, "batch_size": 16}


def case_runs() -> dict[str, tuple]:
    """Each case as ``(registered name, recipe class or None, config, fit options)``."""
    train, _ = digits_arrays(0)
    ensemble_data = dict_batches(train, 32, 160)
    return {
        "ensemble": ("ensemble_same_process_test", Ensemble, {}, {"data": ensemble_data}),
        "supervised": ("supervised", None, {"hidden": 16}, {"data": dict_batches(train, 32, 160)}),
        "gan_group": ("gan", None, {**GAN, "update": "simultaneous"}, {"data": gan_data(80, 16)}),
    }


def fit(case: str, *, by: str = "name", **options) -> beatloop.FitResult:
    """Fit ``case`` for 2 epochs (or ``epochs=``) with seed 5, the recipe given ``by``
    its registered name or as an instance."""
    name, cls, config, fit_options = case_runs()[case]
    if by == "name":
        recipe, config_given = name, config
    else:
        recipe, config_given = beatloop.make_recipe(cls or name, config), None
    options = {"epochs": 2, "seed": 5, "progress": False, **fit_options, **options}
    return beatloop.fit(recipe, config=config_given, **options)


def main(case: str, out: str) -> None:
    np.savez(out, **all_weights(fit(case, by="instance").models))


if __name__ == "__main__":
    main(*sys.argv[1:])
