"""MAML throughput: the meta recipe (second order, its default sizes: 25 sinusoid tasks
a batch, 10 support and 10 query points each, one inner step) beside the same MAML
written by hand with ``tf.function`` and ``GradientTape`` (tests/meta_hand.py, which
the tests check ends bit-identical to the recipe).

beatloop runs at its default steps_per_execution ("auto") and at K=32; the hand-written
loop calls its compiled step once per batch, as such loops are written, and also runs
32 steps per compiled call; both keep the mean query loss before and after adaptation
as figures. Training data only (no validation pass). Each fit's first epoch (tracing,
and "auto" finding its K) is dropped and its fastest remaining epoch kept; the figure
is the median over interleaved repeats, with the spread (half the min-max range).

    python benchmarks/meta_step.py             # full run
    python benchmarks/meta_step.py --quick     # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import functools
import sys
from pathlib import Path

import keras
from common import cross_race, handwritten_epochs, race_arguments, timed_fit

import beatloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import meta_hand  # the loop the tests compare with the recipe

MULTI_STEP, SEED, TARGET = 32, 0, 1.0


def make_data():
    """The recipe's built-in training tasks at its default sizes."""
    keras.utils.set_random_seed(SEED)
    return beatloop.make_recipe("meta").default_data(SEED).train


def beatloop_fit(steps_per_execution: int | str):
    def run(data, epochs: int) -> list[float]:
        return timed_fit(beatloop.make_recipe("meta"), data, epochs, steps_per_execution)

    return run


def hand_written(steps_per_call: int | None):
    def run(data, epochs: int) -> list[float]:
        keras.utils.set_random_seed(SEED)
        loop = meta_hand.HandWrittenMaml(meta_hand.learner(), data.element_spec)
        metrics = {"before": keras.metrics.Mean(), "after": keras.metrics.Mean()}

        def step(batch):
            before, after = loop.train_step(batch)
            metrics["before"].update_state(before)
            metrics["after"].update_state(after)

        return handwritten_epochs(step, data, metrics, epochs, steps_per_call)

    return run


LOOPS = {
    "beatloop meta, spe=auto": beatloop_fit("auto"),
    f"beatloop meta, spe={MULTI_STEP}": beatloop_fit(MULTI_STEP),
    "hand-written, one step per call": hand_written(None),
    f"hand-written, {MULTI_STEP} steps per call": hand_written(MULTI_STEP),
}


def main(argv=None) -> int:
    args = race_arguments(argv, __doc__.splitlines()[0])
    data = make_data()
    loops = {name: functools.partial(loop, data) for name, loop in LOOPS.items()}
    cross_race(loops, int(data.cardinality()), args.repeats, args.epochs, "MAML", TARGET)
    return 0


if __name__ == "__main__":
    sys.exit(main())
