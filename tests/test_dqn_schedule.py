"""Issue 24's DQN: an in-graph chain walk and a replay buffer in recipe state, acting in
an ``Act`` entry, a Q-learning beat sampling the buffer with ``models.random`` and a
target ``Copy`` every N steps (tests/dqn_chain.py), against a hand-written
``tf.function`` / ``GradientTape`` loop on the same initial weights, seed and noise."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, load_npz, same_weights, start_python

import beatloop
from beatloop.core.batches import DataSplit
from beatloop.core.engine import Engine, EngineOptions

pytestmark = pytest.mark.skipif(
    not hasattr(beatloop, "Act") or not hasattr(beatloop, "Copy"),
    reason="beatloop.Act and beatloop.Copy (branch entries) have not landed",
)

SEED, EPOCHS = 5, 3
WORKER = Path(__file__).parent / "workers" / "dqn_run.py"


def _chain():
    import dqn_chain

    return dqn_chain


def snapshot(engine) -> dict[str, np.ndarray]:
    """Every model weight, recipe state variable, optimizer variable, the generator's
    state and the counters: all a step can change."""
    found = {f"weight/{k}": v for k, v in all_weights(engine.bound.models).items()}
    found |= {f"state/{k}": np.array(v.numpy()) for k, v in engine.bound.state.items()}
    for name, optimizer in engine.bound.optimizers.items():
        found |= {f"{name}/{i}": np.array(v.numpy()) for i, v in enumerate(optimizer.variables)}
    found["random"] = engine.bound.random.state.numpy()
    found |= {f"counter/{k}": np.array(v) for k, v in engine.counters.position().items()}
    return found


def engine_and_hand_loop(data=None, steps_per_execution=8):
    """An engine of the DQN recipe and the hand-written loop on copies of its initial
    weights."""
    chain = _chain()
    recipe = chain.DqnChain()
    options = EngineOptions(steps_per_execution=steps_per_execution)
    keras.utils.set_random_seed(SEED)  # as fit does: the same initial weights each time
    engine = Engine(recipe, data or recipe.default_data(SEED), options=options, seed=SEED)
    copies = {name: chain.q_network() for name in ("q", "target")}
    for name, model in copies.items():
        model.set_weights(engine.bound.models[name].get_weights())
    return engine, chain.HandWritten(copies, SEED)


def test_the_dqn_schedule_equals_its_hand_written_loop_bit_for_bit():
    chain = _chain()
    engine, hand = engine_and_hand_loop()
    engine.fit(EPOCHS)
    steps = EPOCHS * chain.STEPS_PER_EPOCH
    hand.fit(steps)
    assert int(engine.counters.step) == steps == int(engine.counters.examples)
    assert_same_weights(
        all_weights(engine.bound.models), all_weights({"q": hand.q, "target": hand.target})
    )
    for name, variable in engine.bound.state.items():
        np.testing.assert_array_equal(variable.numpy(), hand.state[name].numpy(), err_msg=name)
    assert int(engine.bound.state["stored"].numpy()) == steps  # one transition a step
    assert float(engine.bound.state["collected"].numpy()) > 0  # it reached the end
    assert chain.greedy_return(engine.bound.models["q"]) == 1.0  # and learned the way there
    np.testing.assert_array_equal(engine.bound.random.state.numpy(), hand.random.state.numpy())
    # Steps 113-119 came after the last copy (step 112): the target lags the Q network.
    models = engine.bound.models
    assert not same_weights(all_weights({"m": models["target"]}), all_weights({"m": models["q"]}))


def ticks(count: int) -> tf.data.Dataset:
    return beatloop.loop_data().train.take(count)


def test_validation_and_evaluate_leave_env_buffer_and_every_variable_unchanged():
    chain = _chain()
    with_validation = DataSplit(beatloop.loop_data().train, validation=ticks(3))
    validated, _ = engine_and_hand_loop(with_validation)
    plain, _ = engine_and_hand_loop()
    validated.fit(2)
    plain.fit(2)
    after_training = snapshot(validated)
    assert_same_weights(after_training, snapshot(plain))  # validating changed nothing
    figures = validated.evaluate(ticks(4))
    assert np.isfinite(figures["td"])
    validated.validate()
    assert_same_weights(snapshot(validated), after_training)
    assert int(validated.bound.state["stored"].numpy()) == 2 * chain.STEPS_PER_EPOCH


def test_show_prints_the_act_the_copy_and_the_state(capsys):
    from beatloop.cli.cmd_show import _show_state

    schedule = _chain().DqnChain().schedule().describe()
    assert "act fn=DqnChain.collect" in schedule and "Copy source=q target=target" in schedule
    _show_state(_chain().DqnChain())
    out = capsys.readouterr().out
    assert "  observation: (64, 5) float32" in out and "  position: () int32" in out


def run_worker(spec: dict) -> tuple[int, str, str]:
    process = start_python(WORKER, json.dumps(spec))
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


@pytest.mark.slow
def test_a_dqn_run_killed_mid_epoch_resumes_bit_identical_buffer_and_env_included(tmp_path):
    spec = {"epochs": EPOCHS, "seed": SEED, "checkpoint_every": 16, "steps_per_execution": 4}
    killed_dir = str(tmp_path / "killed")
    code, _, err = run_worker({**spec, "run_dir": killed_dir, "kill_at": 70, "out": "unused"})
    assert code == -signal.SIGKILL, err
    code, out, err = run_worker({**spec, "run_dir": killed_dir, "out": str(tmp_path / "r.npz")})
    assert code == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["resumed_from"] is not None and summary["steps"] == EPOCHS * 40

    whole = beatloop.fit(
        _chain().DqnChain, epochs=EPOCHS, seed=SEED, steps_per_execution=4, progress=False
    )
    expected = all_weights(whole.models)
    expected |= {f"state/{k}": v.numpy() for k, v in whole.engine.bound.state.items()}
    assert_same_weights(load_npz(tmp_path / "r.npz"), expected)
