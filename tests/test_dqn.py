"""The built-in dqn recipe: bit-identical to a hand-written TensorFlow DQN
(tests/dqn_hand.py) at K=1 and K>1, validation and evaluation leaving everything as it
was, a SIGKILLed run resuming bit-identical, the same run on two replicas as on one
device (acts once a step, the buffer sample split), the greedy policy reaching the
chain's optimal return, environments found by name (plugins' too), and clear config
errors."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import attrs
import keras
import numpy as np
import pytest
import tensorflow as tf
from dqn_hand import HandWrittenDqn
from helpers import (
    all_weights,
    assert_same_weights,
    run_python,
    same_weights,
    start_python,
    worker,
)

import beatloop
from beatloop.callbacks.standard import History
from beatloop.core.data.batches import DataSplit
from beatloop.core.running.engine import Engine, EngineOptions

SEED, EPOCHS = 5, 3
WORKER = Path(__file__).parent / "workers" / "dqn_run.py"
dqn_run = worker("dqn_run")
#: A small DQN: 40 steps an epoch, a 64-transition buffer filled with 16 at the start.
SMALL = {
    "steps_per_epoch": 40, "hidden": 16, "batch_size": 8, "buffer_size": 64,
    "learning_starts": 16, "epsilon_decay_steps": 60, "target_every": 8,
    "validation_batches": 2, "env_settings": ("length=5", "horizon=12"),
}  # fmt: skip


def recipe_of(**overrides) -> beatloop.Recipe:
    return beatloop.make_recipe("dqn", {**SMALL, **overrides})


def engine_and_hand_loop(recipe, data=None, steps_per_execution=1):
    """An engine of ``recipe`` (a History among its callbacks) and the hand-written loop
    on copies of its initial weights."""
    keras.utils.set_random_seed(SEED)  # as fit does: the same initial weights each time
    history = History()
    options = EngineOptions(steps_per_execution=steps_per_execution)
    split = data or DataSplit(beatloop.loop_data().train)
    engine = Engine(recipe, split, options=options, seed=SEED, callbacks=[history])
    copies = {name: recipe.q_network(name) for name in ("q", "target")}
    for name, model in copies.items():
        model.set_weights(engine.bound.models[name].get_weights())
    hand = HandWrittenDqn(recipe.environment, recipe.config, copies["q"], copies["target"], SEED)
    return engine, hand, history


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


@pytest.fixture(scope="module")
def hand_written_runs() -> dict:
    """The hand-written DQN's runs, by config, shared by the K that config runs at."""
    return {}


def fitted_hand(runs: dict, key: str, hand: HandWrittenDqn):
    """``hand`` fitted ``EPOCHS`` epochs and its returns, once per config ``key``: a
    later ``hand`` of the same config must start from the same weights as the fitted
    one did, and the fitted one stands in for it."""
    start = all_weights({"q": hand.q, "target": hand.target})
    if key not in runs:
        runs[key] = start, hand, hand.fit(EPOCHS)
    initial, fitted, returns = runs[key]
    assert_same_weights(start, initial)
    return fitted, returns


@pytest.mark.parametrize(
    "steps_per_execution, overrides",
    [
        (1, {}),
        (4, {}),
        (5, {"target": "polyak", "double": True, "loss": "mse"}),
        (4, {"env": "cartpole", "env_settings": ("horizon=20",)}),
    ],
    ids=["copy-K1", "copy-K4", "polyak-double-mse-K5", "cartpole-K4"],
)
def test_the_recipe_equals_the_hand_written_dqn_bit_for_bit(
    steps_per_execution, overrides, hand_written_runs
):
    """The hand-written DQN is run once per config (copy-K1 and copy-K4 share it), from
    the same initial weights (checked)."""
    recipe = recipe_of(**overrides)
    engine, hand, history = engine_and_hand_loop(recipe, steps_per_execution=steps_per_execution)
    engine.fit(EPOCHS)
    hand, hand_returns = fitted_hand(hand_written_runs, repr(sorted(overrides.items())), hand)
    steps = EPOCHS * SMALL["steps_per_epoch"]
    assert int(engine.counters.step) == steps
    models = engine.bound.models
    assert_same_weights(all_weights(models), all_weights({"q": hand.q, "target": hand.target}))
    for name, variable in engine.bound.state.items():
        np.testing.assert_array_equal(variable.numpy(), hand.state[name].numpy(), err_msg=name)
    np.testing.assert_array_equal(engine.bound.random.state.numpy(), hand.random.state.numpy())
    optimizers = engine.bound.optimizers["adam"].variables, hand.optimizer.variables
    for ours, theirs in zip(*optimizers, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert history.history["train_return"] == hand_returns
    state = engine.bound.state
    assert int(state["stored"].numpy()) == steps + SMALL["learning_starts"]  # warm-up + 1 a step
    assert int(state["agent_steps"].numpy()) == steps
    assert history.history["epsilon"][-1] == pytest.approx(0.05)
    if recipe.config.target == "copy":  # steps 113-119 came after the last copy (step 112)
        target, q = (all_weights({"m": models[name]}) for name in ("target", "q"))
        assert not same_weights(target, q)


def ticks(count: int) -> tf.data.Dataset:
    return beatloop.loop_data().train.take(count)


def test_validation_greedy_roll_outs_and_evaluate_change_nothing():
    recipe = recipe_of()
    with_validation = DataSplit(beatloop.loop_data().train, validation=ticks(3))
    validated, _, history = engine_and_hand_loop(recipe, with_validation, 4)
    plain, _, _ = engine_and_hand_loop(recipe_of(), None, 4)
    validated.fit(2)
    plain.fit(2)
    after_training = snapshot(validated)
    assert_same_weights(after_training, snapshot(plain))  # validating changed nothing
    assert np.isfinite(history.history["val_td"]).all()
    figures = validated.evaluate(ticks(4))
    assert np.isfinite(figures["td"])
    validated.validate()
    q = validated.bound.models["q"]
    returns = {recipe.greedy_return(q, SEED) for _ in range(2)}
    assert len(returns) == 1  # the same start every time
    assert_same_weights(snapshot(validated), after_training)


def test_the_greedy_policy_reaches_the_chains_optimal_return():
    config = {"steps_per_epoch": 200, "epsilon_decay_steps": 400, "learning_starts": 50}
    config["env_settings"] = ("length=6", "horizon=18")
    result = beatloop.fit("dqn", epochs=3, seed=0, config=config, progress=False)
    greedy = result.history["greedy_return"]
    assert greedy[-1] == result.recipe.environment.optimal_return == 1.0, greedy
    assert result.history["train_return"][-1] > result.history["train_return"][0]


def test_show_prints_the_act_the_update_the_target_and_the_state(capsys):
    from beatloop.cli.cmd_show import _show_state

    schedule = recipe_of().schedule().describe()
    assert "act: act fn=Dqn.act every=1" in schedule
    assert "td: loss=td optimizer=adam updates=q" in schedule
    assert "target: Copy source=q target=target every=8" in schedule
    polyak = recipe_of(target="polyak", target_decay=0.9).schedule().describe()
    assert "target: EMA source=q target=target decay=0.9 every=1" in polyak
    _show_state(recipe_of())
    out = capsys.readouterr().out
    assert "  observation: (64, 5) float32" in out and "  env_position: () int32" in out


def test_bad_settings_are_config_errors_that_say_what_to_do():
    unknown = r"no environment 'chian' \(did you mean 'chain'\?\); known environments: cartpole"
    with pytest.raises(beatloop.ConfigError, match=unknown):
        beatloop.make_recipe("dqn", {"env": "chian"})
    misspelt = (
        r"environment 'chain' \(its parameters set by env_settings\) has no config field 'lenght'"
    )
    with pytest.raises(beatloop.ConfigError, match=misspelt):
        beatloop.make_recipe("dqn", {"env_settings": ("lenght=4",)})
    with pytest.raises(beatloop.ConfigError, match="expects int, got str 'x'"):
        beatloop.make_recipe("dqn", {"env_settings": ("length=x",)})
    with pytest.raises(beatloop.ConfigError, match="env_settings takes NAME=VALUE items"):
        beatloop.make_recipe("dqn", {"env_settings": ("length",)})
    with pytest.raises(beatloop.ConfigError, match=r"learning_starts \(200\) must not exceed"):
        beatloop.make_recipe("dqn", {"learning_starts": 200, "buffer_size": 100})
    wrong = r"config field 'target' expects 'copy' \| 'polyak', got str 'hard'"
    with pytest.raises(beatloop.ConfigError, match=wrong):
        beatloop.make_recipe("dqn", {"target": "hard"})


def test_cartpole_follows_the_classic_equations():
    env = beatloop.make_recipe("dqn", {"env": "cartpole"}).environment
    x, x_dot, theta, theta_dot = 0.01, -0.02, 0.03, 0.04
    state = {"physics": tf.constant([x, x_dot, theta, theta_dot])}
    after, reward, terminal = env.step(state, tf.constant(1), None)
    # Gym's CartPole-v1 step, Euler integration, in float64.
    total, moment = 1.1, 0.05
    temp = (10.0 + moment * theta_dot**2 * math.sin(theta)) / total
    theta_acc = (9.8 * math.sin(theta) - math.cos(theta) * temp) / (
        0.5 * (4.0 / 3.0 - 0.1 * math.cos(theta) ** 2 / total)
    )
    x_acc = temp - moment * theta_acc * math.cos(theta) / total
    expected = [x + 0.02 * x_dot, x_dot + 0.02 * x_acc, theta + 0.02 * theta_dot,
                theta_dot + 0.02 * theta_acc]  # fmt: skip
    np.testing.assert_allclose(after["physics"].numpy(), expected, rtol=1e-6)
    assert float(reward) == 1.0 and not bool(terminal)
    leaning = {"physics": tf.constant([0.0, 0.0, 0.21, 0.0])}
    assert bool(env.step(leaning, tf.constant(0), None)[2])  # past 12 degrees: it fell
    start = env.reset(tf.random.Generator.from_seed(0))["physics"].numpy()
    assert start.shape == (4,) and np.abs(start).max() <= 0.05 and np.abs(start).min() > 0


class Bandit(beatloop.Environment):
    """One step: action 1 pays 1, action 0 pays the config's consolation."""

    name = "bandit_test"

    @attrs.frozen
    class Config:
        consolation: float = 0.25

    observation_size = action_count = 2
    horizon = 1

    def initial_state(self):
        return {"t": tf.constant(0)}

    def observe(self, state):
        return tf.ones([2])

    def step(self, state, action, random):
        pay = tf.where(tf.equal(action, 1), 1.0, self.config.consolation)
        return state, pay, tf.constant(True)


def test_an_environment_registered_at_run_time_is_found_by_name_and_trained_on():
    from beatloop.plugins.registry import registry

    beatloop.register_environment(Bandit)
    assert registry().environment("bandit_test").origin == f"registered in {__name__}"
    assert {"chain", "cartpole", "bandit_test"} <= set(registry().environment_names())
    config = {**SMALL, "env": "bandit_test", "env_settings": ("consolation=0.5",)}
    config |= {"steps_per_epoch": 60, "gamma": 0.0}
    result = beatloop.fit("dqn", epochs=2, seed=0, config=config, progress=False)
    assert result.recipe.environment.config.consolation == 0.5
    assert result.history["greedy_return"][-1] == 1.0
    with pytest.raises(beatloop.ConfigError, match=r"\(did you mean 'bandit_test'\?\); known"):
        registry().environment("bandt_test")


def test_an_environment_class_that_cannot_work_is_refused_with_every_problem():
    class Broken(beatloop.Environment):
        name = "not an identifier"

    with pytest.raises(beatloop.RegistrationError) as error:
        beatloop.register_environment(Broken)
    assert "lacks a `name`" in str(error.value) and "observe" in str(error.value)


def test_evaluate_on_the_run_dir_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    beatloop.fit("dqn", epochs=1, seed=1, config=SMALL, run_dir=run_dir, progress=False)
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    first, second = beatloop.evaluate(run_dir), beatloop.evaluate(run_dir)
    assert first == second and set(first) == {"td"} and np.isfinite(first["td"])
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == files


@pytest.mark.slow
def test_a_dqn_run_killed_mid_epoch_resumes_bit_identical_buffer_and_env_included(tmp_path):
    spec = {"epochs": EPOCHS, "seed": SEED, "checkpoint_every": 16, "steps_per_execution": 4}
    spec["config"] = {**SMALL, "target": "polyak"}
    killed_dir, full_dir = str(tmp_path / "killed"), str(tmp_path / "full")
    killed = start_python(WORKER, json.dumps({**spec, "run_dir": killed_dir, "kill_at": 70}))
    try:  # the uninterrupted run and the resume are fitted here: no process needed
        full = dqn_run.fit({**spec, "run_dir": full_dir})
    finally:
        _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    resumed = dqn_run.fit({**spec, "run_dir": killed_dir})
    assert resumed.resumed_from is not None and resumed.steps == EPOCHS * 40
    assert_same_weights(dqn_run.final(resumed), dqn_run.final(full))
    history = [Path(d, "history.jsonl").read_text() for d in (killed_dir, full_dir)]
    assert history[0] == history[1]  # train_return and greedy_return included


@pytest.mark.slow
def test_on_two_replicas_dqn_is_one_agent_the_same_run_as_on_one_device(tmp_path):
    """dqn at its defaults (48 steps, after 100 warm-up moves) on a MirroredStrategy
    over two CPUs, K=1 and K=4, each against one device's run (at K=4; it does not
    depend on K): the act moves the one agent once a step, the buffer sample is split
    across the replicas. A test recipe's acts count once a step on the global batch; a
    scalar draw in a loss is refused in words."""
    out = tmp_path / "mirrored.json"
    run_python(WORKER, "mirrored", str(out), timeout=600)
    report = json.loads(out.read_text())
    assert report["replicas"] == 2
    for k in (1, 4):
        found = report[f"dqn_k{k}"]
        assert found["steps"] == [48, 48]
        assert found["weights"] < 1e-6 and found["slots"] < 1e-6, found
        assert found["q_from_target"] > 1e-3  # training moved q far beyond round-off
        assert set(found["state"].values()) == {0.0}, found["state"]  # buffer, env: equal
        assert found["random"] == 0.0  # the same draws, in the same order
        figures = found["figures"]
        assert figures["td"] < 1e-6 and figures["val_td"] < 1e-6, figures
        assert figures["train_return"] == figures["epsilon"] == 0.0
        counted = report[f"counted_k{k}"]
        assert counted["steps"] == 6
        assert counted["one_device"] | {"ring": None} == {
            "acts": 6, "rows": 24, "evens": 3, "ring": None,
        }  # fmt: skip
        for name, copies in counted["per_replica"].items():
            assert copies == [counted["one_device"][name]] * 2, name
    said = report["scalar_draw"]
    assert "models.random.uniform([]) in a loss draws no rows" in said
    assert "models.own_batch(n)" in said and "in an Act" in said
