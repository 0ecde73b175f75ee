"""`supervised` against `risk_weighted` on the breast-cancer data, and what clipping does
when a few extreme, mislabelled, heavily weighted samples are in the data.

Part 1 trains both recipes (same width, SGD 0.05, batch 32) and prints validation AUC and
KS, the variance of the per-step training loss, and examples/second (whole epochs,
validation and metrics included), medians of repeats. Part 2 trains `risk_weighted` on
the data with 5 outliers (features x10, label flipped, risk 100) with and without
clipping and prints both loss curves.

    python benchmarks/risk_comparison.py            # full run
    python benchmarks/risk_comparison.py --quick    # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import statistics
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import beatloop
from beatloop import datasets as data
from beatloop.metrics import KSStatistic

SHARED = {"hidden": 32, "learning_rate": 0.05, "batch_size": 32}
CONFIGS = {
    "supervised": {**SHARED, "classes": 2, "optimizer": "sgd"},
    "risk_weighted": {**SHARED, "optimizer": "sgd"},
}


class StepLosses(beatloop.Callback):
    """Each step's own loss, recovered from the running (batch-size weighted) mean the
    engine logs after every step (steps_per_execution=1), plus each epoch's time."""

    def __init__(self):
        self.losses: list[float] = []
        self.seconds: list[float] = []

    def on_epoch_start(self, run, epoch):
        self._mean, self._seen, self._start = 0.0, 0, time.perf_counter()
        self._base = run.examples

    def on_execution_end(self, run, steps, logs):
        seen = run.examples - self._base
        mean = logs["loss"]
        self.losses.append((mean * seen - self._mean * self._seen) / (seen - self._seen))
        self._mean, self._seen = mean, seen

    def on_epoch_end(self, run, epoch, logs):
        self.seconds.append(time.perf_counter() - self._start)


def validation_scores(name: str, model: keras.Model, x: np.ndarray) -> np.ndarray:
    logits = model(x, training=False)
    if name == "supervised":
        return tf.nn.softmax(logits)[:, 1].numpy()
    return tf.sigmoid(logits[:, 0]).numpy()


def auc_and_ks(labels: np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    auc, ks = keras.metrics.AUC(), KSStatistic()
    auc.update_state(labels, scores)
    ks.update_state(labels, scores)
    return float(auc.result()), float(ks.result())


def compare(repeats: int, epochs: int) -> None:
    train, validation = data.breast_cancer_arrays(0)
    figures: dict[str, dict[str, list[float]]] = {
        name: {"auc": [], "ks": [], "variance": [], "rate": []} for name in CONFIGS
    }
    for repeat in range(repeats):
        for name, config in CONFIGS.items():
            steps = StepLosses()
            result = beatloop.fit(
                name,
                data=(data.batches(train, 32, shuffle_seed=repeat), data.batches(validation, 32)),
                config=config,
                epochs=epochs,
                seed=repeat,
                callbacks=[steps],
            )
            scores = validation_scores(name, result.models["model"], validation["x"])
            auc, ks = auc_and_ks(validation["y"], scores)
            per_epoch = len(steps.losses) // epochs
            figures[name]["auc"].append(auc)
            figures[name]["ks"].append(ks)
            figures[name]["variance"].append(float(np.var(steps.losses[per_epoch:])))
            figures[name]["rate"].append(len(train["y"]) / statistics.median(steps.seconds[1:]))
            print(
                f"repeat {repeat + 1}/{repeats} {name}: auc {auc:.4f} ks {ks:.4f}", file=sys.stderr
            )
    print(f"\nbreast cancer, {epochs} epochs, median of {repeats} repeat(s)")
    print(f"{'recipe':<16}{'val AUC':>10}{'val KS':>10}{'step-loss var':>16}{'examples/s':>14}")
    for name, values in figures.items():
        med = {key: statistics.median(v) for key, v in values.items()}
        print(
            f"{name:<16}{med['auc']:>10.4f}{med['ks']:>10.4f}{med['variance']:>16.4f}"
            f"{med['rate']:>14,.0f}"
        )


def outliers(epochs: int) -> None:
    train, validation = data.breast_cancer_arrays(0)
    noisy = data.with_outliers(train, count=5, weight=100.0, scale=10.0, seed=0)
    print("\nrisk_weighted with 5 outliers (x10 features, flipped label, risk 100), seed 0")
    for clip in ("none", "norm"):
        steps = StepLosses()
        history = beatloop.fit(
            "risk_weighted",
            data=(data.batches(noisy, 32, shuffle_seed=0), data.batches(validation, 32)),
            config={**CONFIGS["risk_weighted"], "clip": clip},
            epochs=epochs,
            seed=0,
            callbacks=[steps],
        ).history
        label = "no clipping" if clip == "none" else "clip_by_norm 1.0"
        print(f"{label:<18} epoch loss: " + " ".join(f"{v:.3g}" for v in history["loss"]))
        print(f"{'':<18} max step loss {max(steps.losses):.3g}, final val AUC "
              f"{history['val_auc'][-1]:.4f}")  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    repeats, epochs = (1, 3) if args.quick else (args.repeats, args.epochs)
    compare(repeats, epochs)
    outliers(epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
