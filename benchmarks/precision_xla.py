"""Mixed precision and XLA beside float32, for `supervised` and `gan`: training steps/s
(median over interleaved repeats of each run's median epoch after the first). On a CPU
half precision and XLA may well be slower: the figures are reported, not hidden.

    python benchmarks/precision_xla.py            # full run
    python benchmarks/precision_xla.py --quick    # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import statistics
import sys

import tensorflow as tf
from common import TrainingTimer

import beatloop
from beatloop.datasets import digits_arrays

VARIANTS = {
    "float32": {},
    "mixed_float16": {"precision": "mixed_float16"},
    "mixed_bfloat16": {"precision": "mixed_bfloat16"},
    "float32 + XLA": {"jit_compile": True},
}
RECIPES = {"supervised": {"hidden": 256}, "gan": {"hidden": 256, "quality_samples": 32}}


def make_data(recipe: str, passes: int) -> tf.data.Dataset:
    train, _ = digits_arrays(0, signed=recipe == "gan")
    if recipe == "gan":
        train = {"x": train["x"]}
    return tf.data.Dataset.from_tensor_slices(train).batch(64).repeat(passes)


def rate(recipe: str, variant: str, epochs: int, passes: int) -> float:
    timer = TrainingTimer()
    result = beatloop.fit(
        recipe,
        data=make_data(recipe, passes),
        config=RECIPES[recipe],
        epochs=epochs,
        seed=0,
        callbacks=[timer],
        **VARIANTS[variant],
    )
    return timer.rate(result.steps / result.epochs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="per fit; the first is dropped")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    # float16 matmuls are emulated on a CPU (tens of times slower): keep epochs short.
    repeats, epochs, passes = (1, 2, 1) if args.quick else (args.repeats, args.epochs, 2)
    rates = {(r, v): [] for r in RECIPES for v in VARIANTS}
    for repeat in range(repeats):
        for recipe in RECIPES:
            for variant in VARIANTS:
                value = rate(recipe, variant, epochs, passes)
                rates[recipe, variant].append(value)
                print(
                    f"repeat {repeat + 1}  {recipe:<11} {variant:<15} {value:8,.0f}",
                    file=sys.stderr,
                )
    print(f"\nsteps/s (batch 64, hidden 256), median of {repeats} repeat(s); ratio to float32")
    print(f"{'variant':<16}" + "".join(f"{r:>22}" for r in RECIPES))
    for variant in VARIANTS:
        cells = []
        for recipe in RECIPES:
            value = statistics.median(rates[recipe, variant])
            base = statistics.median(rates[recipe, "float32"])
            cells.append(f"{value:>13,.0f} ({value / base:4.2f}x)")
        print(f"{variant:<16}" + "".join(f"{c:>22}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
