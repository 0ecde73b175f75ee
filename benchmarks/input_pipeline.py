"""Is input the bottleneck? Training steps/s on the built-in pipeline (cache, seeded
shuffle each epoch, batch, prefetch) beside the same training on batches already
materialised in memory, and the pipeline alone (batches/s with no training).

    python benchmarks/input_pipeline.py            # full run
    python benchmarks/input_pipeline.py --quick    # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import statistics
import time

import tensorflow as tf
from common import TrainingTimer

import beatloop
from beatloop.datasets import batches, digits_arrays

RECIPES = {"supervised": {}, "gan": {"quality_samples": 32}}


def pipeline(recipe: str, batch_size: int) -> tf.data.Dataset:
    train, _ = digits_arrays(0, signed=recipe == "gan")
    if recipe == "gan":
        train = {"x": train["x"]}
    return batches(train, batch_size, shuffle_seed=0)


def in_memory(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """One epoch of the pipeline's batches, materialised once: no input work left."""
    materialised = list(dataset)
    return tf.data.Dataset.from_tensor_slices(
        {k: tf.stack([b[k] for b in materialised[:-1]]) for k in materialised[0]}
    )


def train_rate(recipe: str, data: tf.data.Dataset, epochs: int) -> float:
    timer = TrainingTimer()
    config = {**RECIPES[recipe], "batch_size": 64}
    result = beatloop.fit(
        recipe, data=data, config=config, epochs=epochs, seed=0, callbacks=[timer]
    )
    return timer.rate(result.steps / result.epochs)


def read_rate(dataset: tf.data.Dataset, passes: int) -> float:
    times = []
    for _ in range(passes):
        start, count = time.perf_counter(), 0
        for _ in dataset:
            count += 1
        times.append(count / (time.perf_counter() - start))
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.epochs = 1, 2
    rows = []
    for recipe in RECIPES:
        fed, cached, alone = [], [], []
        for _ in range(args.repeats):
            source = pipeline(recipe, 64)
            fed.append(train_rate(recipe, source, args.epochs))
            # Same batch count: the materialised set drops the short last batch.
            cached.append(train_rate(recipe, in_memory(source), args.epochs))
            alone.append(read_rate(source, args.epochs))
        rows.append((recipe, *(statistics.median(v) for v in (fed, cached, alone))))
    print(f"\nsteps/s, batch 64, median of {args.repeats} repeat(s)")
    print(f"{'recipe':<12}{'pipeline':>12}{'in memory':>12}{'ratio':>8}{'pipeline alone':>16}")
    for recipe, fed, cached, alone in rows:
        print(f"{recipe:<12}{fed:>12,.0f}{cached:>12,.0f}{fed / cached:>7.2f}x{alone:>16,.0f}")


if __name__ == "__main__":
    main()
