"""Where a recipe on two replicas parts from one device, and why.

Each case fits a recipe twice from the same seed (so the same initial weights and data):
on one device, and under a ``MirroredStrategy`` over two logical CPUs, one step per
compiled call, recording every weight after every step. Printed per case: the steps,
the largest weight difference after step 1 and at the end, the step where it first
exceeds 1e-6, the largest one-step growth when it is a jump (tenfold, past 1e-6: a
step where one run took another branch of a kink, e.g. a ReLU's input within round-off
of 0), and the growth (the gap at steps 1, 2, 4, 8, ...). Variants turn one thing off
at a time (a loss term, Adam for SGD, the learning rate, ReLU for GELU) to show what
the gap comes from; ``1 vs 1`` fits one device twice (the process's own
reproducibility). docs/speed.md, "Many devices: where the gaps come from", explains
the figures.

    python benchmarks/replica_gaps.py                 # every case (8-10 minutes on 2 cores)
    python benchmarks/replica_gaps.py --only two_tower,meta
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

if __name__ == "__main__":  # logical devices before TensorFlow runs anything
    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import attrs
import keras
import numpy as np

import beatloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

THRESHOLD = 1e-6


class StepWeights(beatloop.Callback):
    """Every weight of every model before the first step and after each call (one step
    a call here), and the logs of each call."""

    def __init__(self):
        self.weights: list[dict[str, np.ndarray]] = []
        self.logs: list[dict[str, float]] = []

    def _snapshot(self, run) -> None:
        self.weights.append(
            {
                f"{name}/{variable.path}": np.array(variable.numpy())
                for name, model in run.models.items()
                for variable in model.weights
            }
        )

    def on_fit_start(self, run) -> None:
        self._snapshot(run)

    def on_execution_end(self, run, steps, logs) -> None:
        self._snapshot(run)
        self.logs.append(dict(logs))


@attrs.frozen
class Case:
    """One comparison: ``fit(**kwargs())`` with a fresh recipe, on one device and on two
    replicas. ``kwargs`` builds the recipe and data anew for each fit."""

    recipe: str
    variant: str
    kwargs: Callable[[], dict]
    steps: int
    control: bool = False  # also fit one device twice


def fit_recorded(case: Case, strategy) -> StepWeights:
    record = StepWeights()
    with strategy.scope() if strategy else contextlib.nullcontext():  # an optimizer given
        kwargs = case.kwargs()
    beatloop.fit(
        **kwargs,
        strategy=strategy,
        steps_per_execution=1,
        callbacks=[record],
        progress=False,
    )
    return record


def gaps(first: StepWeights, second: StepWeights) -> list[float]:
    """The largest weight difference before the first step and after each step."""
    return [
        max(float(np.abs(a[key] - b[key]).max()) for key in a)
        for a, b in zip(first.weights, second.weights, strict=True)
    ]


def summary(case: Case, variant: str, per_step: list[float], seconds: float) -> dict:
    over = next((step for step, gap in enumerate(per_step) if gap > THRESHOLD), None)
    marks = [1]
    while marks[-1] * 2 < len(per_step):
        marks.append(marks[-1] * 2)
    marks.append(len(per_step) - 1)
    # The largest one-step growth, shown when tenfold and past THRESHOLD: a jump (a step
    # that took another branch of a kink, a ReLU's, a sign) rather than steady growth.
    # From step 2: step 1 grows the gap from nothing.
    jump = max(range(2, len(per_step)), key=lambda t: per_step[t] / max(per_step[t - 1], 1e-9))
    return {
        "recipe": case.recipe,
        "variant": variant,
        "steps": len(per_step) - 1,
        "start": per_step[0],
        "first": per_step[1],
        "final": per_step[-1],
        "over": over,
        "jump": (
            f"{jump}: {per_step[jump - 1]:.0e} -> {per_step[jump]:.0e}"
            if per_step[jump] > THRESHOLD and per_step[jump] >= 10 * per_step[jump - 1]
            else "none"
        ),
        "growth": " ".join(f"{per_step[m]:.0e}" for m in dict.fromkeys(marks)),
        "seconds": seconds,
    }


def measure(case: Case, strategy) -> list[dict]:
    started = time.perf_counter()
    one = fit_recorded(case, None)
    two = fit_recorded(case, strategy)
    rows = [summary(case, case.variant, gaps(one, two), time.perf_counter() - started)]
    if case.control:
        again = fit_recorded(case, None)
        rows.append(summary(case, "1 vs 1 device: " + case.variant, gaps(one, again), 0.0))
    return rows


# --- the cases ---------------------------------------------------------------------------


def two_tower_cases() -> list[Case]:
    from two_tower_recipe import TwoTower

    def make(steps=32, **config):
        def kwargs():
            recipe = TwoTower(TwoTower.Config(**config))
            return {"recipe": recipe, "epochs": 1, "seed": 0}

        return kwargs

    def odd(**config):  # batches of 33
        return make(batch_size=33, **config)

    return [
        Case("two_tower", "defaults (Adam, batch 32: shares 16 + 16)", make(), 32, control=True),
        Case("two_tower", "batch 33 (shares 17 + 16, last 1 + 0)", make(batch_size=33), 32),
        Case("two_tower", "batch 33, SGD 0.01", make(batch_size=33, optimizer="sgd"), 32),
        Case("two_tower", "batch 33, rating model with gelu", odd(activation="gelu"), 32),
        Case("two_tower", "batch 33, rating task alone", odd(retrieval_weight=0.0), 32),
        Case("two_tower", "batch 33, retrieval task alone", odd(rating_weight=0.0), 32),
    ]


def smooth_learner(recipe, activation: str) -> Callable:
    """``recipe.build_models`` with the learner's hidden layers' ReLU replaced."""
    build = recipe.build_models

    def build_models(spec):
        models = build(spec)
        for layer in models["learner"].layers[:-1]:
            layer.activation = keras.activations.get(activation)
        return models

    return build_models


def meta_cases() -> list[Case]:
    def make(optimizer=None, activation="relu", **config):
        def kwargs():
            recipe = beatloop.make_recipe("meta", config)
            if activation != "relu":
                recipe.build_models = smooth_learner(recipe, activation)
            fitted = {"recipe": recipe, "epochs": 1, "seed": 0}
            # Training only (no validation), built as fit builds it: a seeded shuffle
            # also depends on the global seed (fit's own data gives the same figures).
            keras.utils.set_random_seed(0)
            fitted["data"] = recipe.default_data(0).train
            if optimizer is not None:
                fitted["optimizers"] = {"adam": optimizer()}
            return fitted

        return kwargs

    return [
        Case("meta", "defaults (Adam)", make(), 400, control=True),
        Case("meta", "SGD 1e-3", make(lambda: keras.optimizers.SGD(1e-3)), 400),
        Case("meta", "learner with gelu (no kink)", make(activation="gelu"), 400),
    ]


def style_transfer_cases() -> list[Case]:
    def make(optimizer=None, **config):
        def kwargs():
            fitted = {"recipe": "style_transfer", "config": config, "epochs": 1, "seed": 0}
            if optimizer is not None:
                fitted["optimizers"] = {"optimizer": optimizer()}
            return fitted

        return kwargs

    return [
        Case("style_transfer", "defaults (Adam 0.02)", make(), 50, control=True),
        Case("style_transfer", "SGD 0.02", make(lambda: keras.optimizers.SGD(0.02)), 50),
        Case("style_transfer", "Adam 2e-4", make(learning_rate=2e-4), 50),
    ]


def byol_cases() -> list[Case]:
    from contrastive_hand import SMALL, digits_data

    def make(rows=216, batch_size=9, sgd=False):
        def kwargs():
            config = {**SMALL, "target": "ema", "pretrain_epochs": 1}
            fitted = {"recipe": "contrastive", "config": config, "epochs": 1, "seed": 3}
            fitted["data"] = digits_data(rows, batch_size, 9)[0]  # pretraining only
            if sgd:
                fitted["optimizers"] = {
                    "pretrain": keras.optimizers.SGD(0.05),
                    "predictor": keras.optimizers.SGD(0.05),
                }
            return fitted

        return kwargs

    return [
        Case("byol", "Adam, batch 9 (shares 5 + 4)", make(), 24, control=True),
        Case("byol", "Adam, batch 9, 217 rows: last batch 1 + 0", make(rows=217), 25),
        Case("byol", "Adam, batch 8 (shares 4 + 4)", make(rows=192, batch_size=8), 24),
        Case("byol", "SGD 0.05, batch 9", make(sgd=True), 24),
    ]


CASES: dict[str, Callable[[], list[Case]]] = {
    "two_tower": two_tower_cases,
    "meta": meta_cases,
    "style_transfer": style_transfer_cases,
    "byol": byol_cases,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated recipes")
    args = parser.parse_args()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    header = (
        "recipe", "variant", "steps", "after step 1", "final", "first > 1e-6",
        "largest jump (step: before -> after)", "growth (steps 1, 2, 4, ..., last)",
    )  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in args.only.split(","):
        for case in CASES[name]():
            for row in measure(case, strategy):
                assert row["start"] == 0.0, row  # the same initial weights
                over = "never" if row["over"] is None else str(row["over"])
                print(
                    f"| {row['recipe']} | {row['variant']} | {row['steps']} | "
                    f"{row['first']:.1e} | {row['final']:.1e} | {over} | {row['jump']} | "
                    f"{row['growth']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
