"""What a one-replica strategy costs: a run with no strategy beside the same run under
``OneDeviceStrategy("/cpu:0")`` and ``MirroredStrategy(["/cpu:0"])``.

The target: a strategy with one replica costs no more than 3% over no strategy. Every
run trains the same recipe from the same seed on the same (unshuffled) data: the
``supervised`` recipe on ``engine_overhead.py``'s synthetic 784-feature data (its
784-64-10 classifier, batch 32) and the ``gan`` recipe's step (``gan_step.py``'s digits,
batch 64, without the end-of-epoch figures), at steps_per_execution 1 and 32. Each fit's
first epoch (tracing) is dropped and its fastest other epoch of training time kept
(``TrainingTimer``); repeats are interleaved, the order rotated each repeat. Printed:
steps/s per case (median of the repeats, ± half their range), then each strategy's cost,
``no strategy / strategy`` steps/s, from the medians and as the median of each repeat's
own ratio (paired, so the machine's drift between repeats cancels), and the largest
weight difference between each strategy's run and the run without one (0: bit for bit).

    python benchmarks/strategy_overhead.py               # full run (a few minutes)
    python benchmarks/strategy_overhead.py --quick       # smoke run
    python benchmarks/strategy_overhead.py --recipes supervised --repeats 7
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import statistics
import sys

import numpy as np
import tensorflow as tf
from common import TrainingTimer, spread
from engine_overhead import make_arrays
from gan_step import StepOnly
from gan_step import make_data as gan_data

import beatloop

TARGET = 1.03  # no strategy / one-replica strategy, in time: at most 3% more
STEPS = (1, 32)
STRATEGIES = {
    "none": lambda: None,
    "OneDevice": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    "Mirrored(1)": lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
}


def supervised_data(examples: int) -> tf.data.Dataset:
    x, y = make_arrays(examples)
    return tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(32).prefetch(2)


def cases(examples: int) -> dict:
    """recipe name -> (recipe, config, data)."""
    return {
        "supervised": ("supervised", {}, supervised_data(examples)),
        "gan": (StepOnly, {"hidden": 64, "quality_samples": 32}, gan_data()),
    }


def run(recipe, config, data, strategy, steps_per_execution: int, epochs: int):
    """(steps/s of the fastest epoch after the first, the trained weights)."""
    timer = TrainingTimer()
    result = beatloop.fit(
        recipe,
        data=(data, None),
        config=config,
        epochs=epochs,
        seed=0,
        steps_per_execution=steps_per_execution,
        progress=False,
        callbacks=[timer],
        strategy=strategy,
    )
    rate = max(s / t for s, t in zip(timer.epoch_steps[1:], timer.epoch_seconds[1:], strict=True))
    weights = {
        f"{name}/{i}": w for name in sorted(result.models)
        for i, w in enumerate(result.models[name].get_weights())
    }  # fmt: skip
    return rate, weights


def largest_difference(first: dict, second: dict) -> float:
    return max(float(np.abs(first[key] - second[key]).max()) for key in first)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="per fit; the first is dropped")
    parser.add_argument("--examples", type=int, default=16384, help="supervised's per epoch")
    parser.add_argument("--recipes", default="supervised,gan")
    parser.add_argument("--steps", default=",".join(map(str, STEPS)), help="steps per call")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2 epochs")
    args = parser.parse_args(argv)
    repeats, epochs = (1, 2) if args.quick else (args.repeats, max(args.epochs, 2))
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    steps_list = [int(s) for s in args.steps.split(",")]
    every = cases(args.examples)
    keys = [(r, k, s) for r in recipes for k in steps_list for s in STRATEGIES]
    rates = {key: [] for key in keys}
    differences: dict[tuple, float] = {}
    baseline: dict[tuple, dict] = {}
    for repeat in range(repeats):
        shift = repeat % len(STRATEGIES)
        names = list(STRATEGIES)[shift:] + list(STRATEGIES)[:shift]
        for recipe in recipes:
            for k in steps_list:
                for name in names:
                    target, config, data = every[recipe]
                    rate, weights = run(target, config, data, STRATEGIES[name](), k, epochs)
                    rates[recipe, k, name].append(rate)
                    if name == "none":
                        baseline.setdefault((recipe, k), weights)
                    else:
                        differences.setdefault((recipe, k, name), weights)
                    print(
                        f"repeat {repeat + 1}/{repeats}  {recipe:<10} spe={k:<3} {name:<12} "
                        f"{rate:9,.0f} steps/s",
                        file=sys.stderr,
                        flush=True,
                    )
    for key, weights in differences.items():
        differences[key] = largest_difference(baseline[key[:2]], weights)

    print(f"\nsteps/s, fastest epoch after the first, median of {repeats} repeat(s) (± half range)")
    print(f"{'recipe':<11}{'spe':>4}" + "".join(f"{name:>20}" for name in STRATEGIES))
    for recipe in recipes:
        for k in steps_list:
            cells = "".join(
                f"{statistics.median(rates[recipe, k, n]):>13,.0f} {spread(rates[recipe, k, n]):<6}"
                for n in STRATEGIES
            )
            print(f"{recipe:<11}{k:>4}{cells}")
    print(
        "\ncost of a one-replica strategy: no strategy / strategy steps/s "
        f"(target: at most {TARGET});"
        "\n'medians': the ratio of the medians; 'paired': the median of each repeat's ratio"
        "\n(± half range); 'max |dw|': largest weight difference from no strategy"
    )
    print(f"{'case':<34}{'medians':>9}{'paired':>10}{'':<7}{'max |dw|':>10}")
    for recipe in recipes:
        for k in steps_list:
            none = rates[recipe, k, "none"]
            for name in list(STRATEGIES)[1:]:
                other = rates[recipe, k, name]
                of_medians = statistics.median(none) / statistics.median(other)
                paired = [a / b for a, b in zip(none, other, strict=True)]
                verdict = "ok" if statistics.median(paired) <= TARGET else "--"
                print(
                    f"{f'{recipe} spe={k} {name}':<34}{of_medians:>8.3f}x"
                    f"{statistics.median(paired):>9.3f}x {spread(paired):<6}"
                    f"{differences[recipe, k, name]:>10.1e}  {verdict}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
