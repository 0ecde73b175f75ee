"""DQN throughput: the built-in ``dqn`` recipe (an ``Act`` stepping the chain walk and
filling a replay buffer in recipe state, a Q-learning beat, a target ``Copy``) beside
the same DQN written by hand with ``tf.function`` and ``GradientTape``.

The hand-written loop is tests/dqn_hand.py's, on the recipe's environment and config
and the same initial weights and seed (the tests check both end bit-identical).
beatloop runs at its default steps_per_execution ("auto") and at K=32, training time
only (``TrainingTimer``: validation and the epoch's greedy roll-out not counted); the
hand-written loop calls its compiled step once per step, as such loops are written,
and also runs 32 steps per compiled call. Each fit's first epoch (tracing, and "auto"
finding its K) is dropped and its fastest remaining epoch kept; the figure is the
median over interleaved repeats, with the spread (half the min-max range).

    python benchmarks/dqn_step.py             # full run
    python benchmarks/dqn_step.py --quick     # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys
import time
from pathlib import Path

import keras
import tensorflow as tf
from common import as_the_others, as_users_run, cross_race, race_arguments

import beatloop
from beatloop import TrainingTimer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from dqn_hand import HandWrittenDqn  # the loop the tests compare

MULTI_STEP, SEED, TARGET = 32, 0, 1.0
RECIPE = beatloop.make_recipe("dqn")  # the default config: the chain, 1000 steps an epoch
STEPS = RECIPE.config.steps_per_epoch


def beatloop_fit(steps_per_execution: int | str):
    """Training seconds of each epoch of the dqn recipe run by ``beatloop.fit``."""

    def run(epochs: int) -> list[float]:
        timer = TrainingTimer()
        beatloop.fit(
            "dqn", epochs=epochs, seed=SEED, steps_per_execution=steps_per_execution,
            progress=False, callbacks=[timer], **as_the_others(),
        )  # fmt: skip
        return timer.epoch_seconds

    return run


def hand_written(steps_per_call: int | None):
    """Epoch times of the hand-written loop: one compiled step a call (``None``) or
    ``steps_per_call`` steps a call."""

    def run(epochs: int) -> list[float]:
        as_users_run()  # op determinism off, as beatloop's fit beside it
        keras.utils.set_random_seed(SEED)
        q, target = RECIPE.q_network("q"), RECIPE.q_network("target")
        target.set_weights(q.get_weights())
        loop = HandWrittenDqn(RECIPE.environment, RECIPE.config, q, target, SEED)

        @tf.function(autograph=False)
        def many(start):
            def body(offset):
                loop.train_step(start + offset)
                return offset + 1

            tf.while_loop(lambda offset: offset < steps_per_call, body, [tf.constant(0, tf.int64)])

        times, number = [], 0
        for _ in range(epochs):
            began = time.perf_counter()
            if steps_per_call is None:
                for _ in range(STEPS):
                    loop.step(tf.constant(number, tf.int64))
                    number += 1
            else:
                for _ in range(STEPS // steps_per_call):
                    many(tf.constant(number, tf.int64))
                    number += steps_per_call
            float(loop.state["stored"].numpy())  # the epoch's work is done
            times.append(time.perf_counter() - began)
        return times

    return run


LOOPS = {
    "beatloop dqn, spe=auto": beatloop_fit("auto"),
    f"beatloop dqn, spe={MULTI_STEP}": beatloop_fit(MULTI_STEP),
    "hand-written, one step per call": hand_written(None),
    f"hand-written, {MULTI_STEP} steps per call": hand_written(MULTI_STEP),
}


def main(argv=None) -> int:
    args = race_arguments(argv, __doc__.splitlines()[0])
    cross_race(LOOPS, STEPS, args.repeats, args.epochs, "DQN", TARGET)
    return 0


if __name__ == "__main__":
    sys.exit(main())
