"""Single-task `supervised` against `multitask` (joint and alternating schedules, each
with fixed, uncertainty and DWA weighting) on the digits: task figures and speed.

Every run trains on the same split with Adam 1e-3, batch 32, the same backbone width;
reported: validation digit accuracy, validation ink MAE (the regression head's mean
absolute error on mean pixel intensity), and examples/second (median epoch after the
first, validation included), each the median of repeats over seeds.

    python benchmarks/multitask_comparison.py            # full run
    python benchmarks/multitask_comparison.py --quick    # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import statistics
import sys

from common import EpochTimer

import beatloop

TRAIN_EXAMPLES = 1437
RUNS = {
    "supervised (digit only)": ("supervised", {"hidden": 64}),
    **{
        f"multitask {schedule}, {weighting}": (
            "multitask",
            {"schedule": schedule, "weighting": weighting},
        )
        for schedule in ("joint", "alternating")
        for weighting in ("fixed", "uncertainty", "dwa")
    },
}


def measure(repeats: int, epochs: int) -> dict[str, dict[str, float]]:
    figures = {name: {"accuracy": [], "mae": [], "rate": []} for name in RUNS}
    for seed in range(repeats):
        for name, (recipe, config) in RUNS.items():
            timer = EpochTimer()
            history = beatloop.fit(
                recipe, config=config, epochs=epochs, seed=seed, callbacks=[timer]
            ).history
            accuracy = history.get("val_accuracy", history.get("val_digit_accuracy"))
            figures[name]["accuracy"].append(accuracy[-1])
            if "val_ink_mae" in history:
                figures[name]["mae"].append(history["val_ink_mae"][-1])
            figures[name]["rate"].append(timer.rate(TRAIN_EXAMPLES))
            print(f"seed {seed} {name}: accuracy {accuracy[-1]:.4f}", file=sys.stderr)
    return {
        name: {key: statistics.median(v) if v else float("nan") for key, v in values.items()}
        for name, values in figures.items()
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    repeats, epochs = (1, 2) if args.quick else (args.repeats, args.epochs)
    medians = measure(repeats, epochs)
    print(f"\ndigits, {epochs} epochs, median of {repeats} seed(s)")
    print(f"{'run':<34}{'val digit acc':>15}{'val ink MAE':>13}{'examples/s':>12}")
    for name, value in medians.items():
        mae = "-" if value["mae"] != value["mae"] else f"{value['mae']:.4f}"
        print(f"{name:<34}{value['accuracy']:>15.4f}{mae:>13}{value['rate']:>12,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
