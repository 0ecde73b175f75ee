"""Contrastive pretraining throughput: the contrastive recipe's pretraining step (SimCLR:
two views, NT-Xent, the online probe, in one ``Group``) beside the same step written by
hand with ``tf.function`` and ``GradientTape``, at the recipe's default sizes.

The hand-written loop is tests/contrastive_hand.py's (the tests check it ends
bit-identical to the recipe). beatloop runs at its default steps_per_execution ("auto")
and at K=32; the hand-written loop calls its compiled step once per batch, as such loops
are written, and also runs 32 steps per compiled call. Data: the 1,437 training digits
in unshuffled batches of 128 (12 batches, the last of 29), sixteen times over: 192 steps
an epoch, no validation. Each fit's first epoch (tracing, and "auto" finding its K) is
dropped and its fastest remaining epoch kept; the figure is the median over interleaved
repeats, with the spread (half the min-max range).

    python benchmarks/contrastive_step.py             # full run
    python benchmarks/contrastive_step.py --quick     # smoke run
    python benchmarks/contrastive_step.py --set target=ema   # BYOL
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import functools
import sys
from pathlib import Path

import keras
from common import EpochTimer, as_the_others, cross_race, handwritten_epochs, race_arguments

import beatloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import contrastive_hand  # the loop the tests compare with the recipe

MULTI_STEP, SEED, TARGET, BATCH = 32, 0, 1.0, 128
SIZES = {"hidden": 128, "features": 16, "projection": 32}  # the recipe's defaults


def make_data():
    train, _ = contrastive_hand.digits_data(1437, BATCH)
    return train.repeat(16)


def beatloop_fit(steps_per_execution, target: str):
    def run(data, epochs: int) -> list[float]:
        timer = EpochTimer()
        config = {"target": target, "pretrain_epochs": epochs, "batch_size": BATCH}
        beatloop.fit(
            "contrastive", config=config, data=data, epochs=epochs, seed=SEED,
            steps_per_execution=steps_per_execution, progress=False, callbacks=[timer],
            **as_the_others(),
        )  # fmt: skip
        return timer.times

    return run


def hand_written(steps_per_call: int | None, target: str):
    def run(data, epochs: int) -> list[float]:
        keras.utils.set_random_seed(SEED)
        models = contrastive_hand.build_models(SIZES, byol=target == "ema")
        loop = contrastive_hand.HandWritten(models, SEED, data.element_spec, target == "ema")
        step = loop.step if steps_per_call is None else loop._step
        return handwritten_epochs(step, data, {}, epochs, steps_per_call)

    return run


def add_target(parser) -> None:
    parser.add_argument("--set", default="target=none", help="target=none (SimCLR) or ema")


def main(argv=None) -> int:
    args = race_arguments(argv, __doc__.splitlines()[0], add_target)
    target = args.set.removeprefix("target=")
    data = make_data()
    loops = {
        "beatloop contrastive, spe=auto": beatloop_fit("auto", target),
        f"beatloop contrastive, spe={MULTI_STEP}": beatloop_fit(MULTI_STEP, target),
        "hand-written, one step per call": hand_written(None, target),
        f"hand-written, {MULTI_STEP} steps per call": hand_written(MULTI_STEP, target),
    }
    loops = {name: functools.partial(loop, data) for name, loop in loops.items()}
    what = "BYOL pretraining" if target == "ema" else "SimCLR pretraining"
    cross_race(loops, int(data.cardinality()), args.repeats, args.epochs, what, TARGET)
    return 0


if __name__ == "__main__":
    sys.exit(main())
