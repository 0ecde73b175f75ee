"""The built-in `recommender` against the simple baselines on its synthetic ratings:
recall@10 over the items a user did not rate in training, and RMSE.

Baselines: the 10 most rated items a user has not rated (popularity), 10 unrated items
at random (chance), and the training mean rating (RMSE). Runs: the recipe at its
defaults (log-Q on, fixed weights), without log-Q, and with the uncertainty and DWA
weightings; reported: the final epoch's validation recall@10 and RMSE, the median over
seeds (each seed its own data set, baselines included).

    python benchmarks/recommender_comparison.py            # 5 epochs, 3 seeds
    python benchmarks/recommender_comparison.py --quick    # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import statistics
import sys

import beatloop
from beatloop.recipes.recommender import RecommenderConfig
from beatloop.recipes.recommender_data import baselines, synthetic_ratings

RUNS = {
    "recommender (defaults: log-Q, fixed)": {},
    "recommender, no log-Q": {"logq": False},
    "recommender, uncertainty": {"weighting": "uncertainty"},
    "recommender, dwa": {"weighting": "dwa"},
}


def measure(repeats: int, epochs: int) -> dict[str, tuple[float, float]]:
    c = RecommenderConfig()
    found = {name: ([], []) for name in ["popularity / mean rating", "chance", *RUNS]}
    for seed in range(repeats):
        base = baselines(*synthetic_ratings(seed, c.users, c.items, c.ratings_per_user), c.top_k)
        found["popularity / mean rating"][0].append(base["popular_recall"])
        found["popularity / mean rating"][1].append(base["mean_rmse"])
        found["chance"][0].append(base["random_recall"])
        for name, config in RUNS.items():
            history = beatloop.fit("recommender", config=config, epochs=epochs, seed=seed).history
            found[name][0].append(history["val_recall_at_k"][-1])
            found[name][1].append(history["val_rmse"][-1])
            print(f"seed {seed} {name}: {found[name][0][-1]:.4f}", file=sys.stderr)
    return {
        name: tuple(statistics.median(v) if v else float("nan") for v in values)
        for name, values in found.items()
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    repeats, epochs = (1, 1) if args.quick else (args.repeats, args.epochs)
    medians = measure(repeats, epochs)
    print(f"\nsynthetic ratings, {epochs} epochs, median of {repeats} seed(s)")
    print(f"{'run':<40}{'val recall@10':>15}{'val RMSE':>10}")
    for name, (recall, rmse) in medians.items():
        shown = "-" if rmse != rmse else f"{rmse:.3f}"
        print(f"{name:<40}{recall:>15.3f}{shown:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
