"""The built-in ppo recipe run in its own process (tests/test_ppo.py).

``python ppo_run.py SPEC_JSON``: one run for the resume tests, on ``killable_cartpole``
(the cart-pole, its batched step also counting the process's moves); it can SIGKILL
itself inside a rollout, at a given move (``kill_at_move``), or after a given step
(``kill_at``), and writes the final weights and recipe state to an .npz (``model/index``,
``state/name``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder

import numpy as np
import tensorflow as tf
from helpers import all_weights
from resumable_run import SignalAt

import beatloop
from beatloop.environments.kinds import CartPole

KILL_AFTER_MOVES: list[int | None] = [None]
MOVES = [0]


def count_move() -> np.int64:
    """Counts a batched move of the environments; SIGKILLs the process past the limit."""
    MOVES[0] += 1
    if KILL_AFTER_MOVES[0] is not None and MOVES[0] > KILL_AFTER_MOVES[0]:
        os.kill(os.getpid(), signal.SIGKILL)
    return np.int64(MOVES[0])


class KillableCartPole(CartPole):
    """The cart-pole, its batched moves counted in Python (test environment)."""

    name = "killable_cartpole"

    def step_batch(self, state, action, random):
        counted = tf.numpy_function(count_move, [], tf.int64, stateful=True)
        with tf.control_dependencies([counted]):
            after, reward, terminal = super().step_batch(state, action, random)
            return after, tf.identity(reward), terminal


def fit(spec: dict, callbacks=()):
    """The run ``spec`` describes, fitted in this process (the resume test fits its
    reference and resumed runs so, ``killable_cartpole`` registered and no kill set)."""
    return beatloop.fit(
        "ppo",
        config=spec.get("config"),
        epochs=spec["epochs"],
        seed=spec["seed"],
        run_dir=spec["run_dir"],
        checkpoint_every=spec.get("checkpoint_every"),
        steps_per_execution=spec.get("steps_per_execution", "auto"),
        callbacks=list(callbacks),
        progress=False,
    )


def final(result) -> dict[str, np.ndarray]:
    """A run's final weights and recipe state, keyed ``model/index`` and ``state/name``."""
    state = {f"state/{name}": v.numpy() for name, v in result.engine.bound.state.items()}
    return {**all_weights(result.models), **state}


def main(spec: dict) -> int:
    beatloop.register_environment(KillableCartPole)
    KILL_AFTER_MOVES[0] = spec.get("kill_at_move")
    kill = [] if spec.get("kill_at") is None else [SignalAt(spec["kill_at"], signal.SIGKILL)]
    result = fit(spec, kill)
    np.savez(spec["out"], **final(result))
    print(json.dumps({"steps": result.steps, "resumed_from": result.resumed_from}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
