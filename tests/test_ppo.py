"""The built-in ppo recipe: bit-identical to a hand-written TensorFlow PPO
(tests/ppo_hand.py) at K=1 and K>1, separate or shared actor and critic; validation and
evaluation leaving everything as it was; a run SIGKILLed while collecting or while
updating resuming bit-identical; batched environments (the built-ins' vectorised ops
equal to the generic per-copy ones, plugins' stepped by the generic ones); a short run
learning what a random policy does not; and clear config errors. With ``target_kl``,
CleanRL's early stop on the approximate KL: bit-identical to the hand-written loop
stopping as CleanRL does, printed as the beat's ``only_if``, resumed after a SIGKILL
while a rollout is stopped."""

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
from helpers import all_weights, assert_same_weights, start_python, worker
from ppo_hand import HandWrittenPpo

import beatloop
from beatloop.callbacks.standard import History
from beatloop.core.data.batches import DataSplit
from beatloop.core.data.environment import Environment
from beatloop.core.running.engine import Engine, EngineOptions
from beatloop.plugins.registry import registry

SEED, EPOCHS = 3, 3
WORKER = Path(__file__).parent / "workers" / "ppo_run.py"
ppo_run = worker("ppo_run")
#: A small PPO: 4 cart-poles of 20 steps, rollouts of 16 steps, 2 x 2 minibatches of 16
#: rows: 2 rollouts, 8 updates an epoch, the learning rate falling to 0 over 8 rollouts.
SMALL = {
    "envs": 4, "rollout_steps": 16, "update_epochs": 2, "minibatches": 2,
    "rollouts_per_epoch": 2, "anneal_rollouts": 8, "hidden": 16,
    "env_settings": ("horizon=20",),
}  # fmt: skip


def recipe_of(**overrides) -> beatloop.Recipe:
    return beatloop.make_recipe("ppo", {**SMALL, **overrides})


def engine_and_hand_loop(recipe, data=None, steps_per_execution=1):
    """An engine of ``recipe`` (a History among its callbacks) and the hand-written loop
    on copies of its initial weights."""
    keras.utils.set_random_seed(SEED)  # as fit does: the same initial weights each time
    history = History()
    options = EngineOptions(steps_per_execution=steps_per_execution)
    split = data or DataSplit(beatloop.loop_data().train)
    engine = Engine(recipe, split, options=options, seed=SEED, callbacks=[history])
    copies = recipe.networks()
    for name, model in copies.items():
        model.set_weights(engine.bound.models[name].get_weights())
    hand = HandWrittenPpo(recipe.environment, recipe.config, copies, SEED)
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


@pytest.mark.parametrize(
    "steps_per_execution, overrides",
    [
        (1, {}),
        (3, {"shared_torso": True, "clip_value": False}),
        (4, {"env": "chain", "env_settings": ("length=5", "horizon=12"), "anneal_rollouts": 0}),
    ],
    ids=["cartpole-K1", "shared-unclipped-K3", "chain-constant-rate-K4"],
)
def test_the_recipe_equals_the_hand_written_ppo_bit_for_bit(steps_per_execution, overrides):
    recipe = recipe_of(**overrides)
    engine, hand, history = engine_and_hand_loop(recipe, steps_per_execution=steps_per_execution)
    engine.fit(EPOCHS)
    hand_returns = hand.fit(EPOCHS)
    assert int(engine.counters.step) == EPOCHS * 8
    assert_same_weights(all_weights(engine.bound.models), all_weights(hand.networks))
    for name, variable in engine.bound.state.items():
        np.testing.assert_array_equal(variable.numpy(), hand.state[name].numpy(), err_msg=name)
    np.testing.assert_array_equal(engine.bound.random.state.numpy(), hand.random.state.numpy())
    optimizers = engine.bound.optimizers["adam"].variables, hand.optimizer.variables
    for ours, theirs in zip(*optimizers, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_array_equal(history.history["train_return"], hand_returns)
    state = engine.bound.state
    assert int(state["updates"].numpy()) == EPOCHS * 8
    order = state["order"].numpy()  # each pass a permutation of the rollout's 64 rows
    assert (np.sort(order, axis=1) == np.arange(64)).all() and (order[0] != order[1]).any()
    for figure in ("approx_kl", "clip_fraction", "entropy", "value_loss"):
        assert np.isfinite(history.history[figure]).all(), figure
    assert 0 < history.history["entropy"][-1] < math.log(2)
    assert history.history["approx_kl"][0] > 0  # the policy moved within each rollout
    rate = float(engine.bound.optimizers["adam"].learning_rate.numpy())
    falling = recipe.config.anneal_rollouts  # 8 rollouts of 4 updates: 24 of 32 taken
    assert rate == pytest.approx(1e-3 * (1 - 24 / 32) if falling else 1e-3, rel=1e-6)


#: Updates big enough for the approximate KL to pass a small target: four passes over each
#: rollout at a learning rate of 1e-2 (SMALL's 2 rollouts an epoch, 8 steps each).
KL_STOP = {"update_epochs": 4, "learning_rate": 1e-2, "target_kl": 1e-3}


@pytest.mark.parametrize(
    "steps_per_execution, overrides",
    [
        (1, KL_STOP),
        (3, {**KL_STOP, "shared_torso": True, "clip_value": False}),
        (4, {**KL_STOP, "minibatches": 1, "target_kl": 5e-4}),
    ],
    ids=["cartpole-K1", "shared-unclipped-K3", "one-minibatch-K4"],
)
def test_target_kl_stops_a_rollouts_passes_as_the_hand_written_cleanrl_rule_does(
    steps_per_execution, overrides
):
    """After each pass over a rollout's minibatches, the approximate KL its last
    minibatch's loss computed (before that update) above ``target_kl`` ends the
    rollout's passes: their steps run, their updates are not taken."""
    recipe = recipe_of(**overrides)
    engine, hand, history = engine_and_hand_loop(recipe, steps_per_execution=steps_per_execution)
    engine.fit(EPOCHS)
    hand_returns = hand.fit(EPOCHS)
    per_epoch, per_pass = recipe.steps_per_epoch, recipe.config.minibatches
    assert int(engine.counters.step) == EPOCHS * per_epoch
    assert_same_weights(all_weights(engine.bound.models), all_weights(hand.networks))
    for name, variable in engine.bound.state.items():  # kl_stopped and last_approx_kl too
        np.testing.assert_array_equal(variable.numpy(), hand.state[name].numpy(), err_msg=name)
    assert set(engine.bound.state) == set(hand.state)
    np.testing.assert_array_equal(engine.bound.random.state.numpy(), hand.random.state.numpy())
    adam = engine.bound.optimizers["adam"]
    for ours, theirs in zip(adam.variables, hand.optimizer.variables, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_array_equal(history.history["train_return"], hand_returns)
    updates = history.history["ppo_updates"]
    assert sum(updates) == int(adam.iterations) == int(hand.optimizer.iterations)
    assert updates[0] < per_epoch and sum(updates) < EPOCHS * per_epoch  # it stopped early
    first_passes = recipe.config.rollouts_per_epoch * per_pass  # every rollout takes its first
    assert all(first_passes <= u <= per_epoch and u % per_pass == 0 for u in updates), updates
    assert np.isfinite(history.history["approx_kl"]).all()


def test_target_kl_is_the_beats_only_if_and_without_it_nothing_changes(capsys):
    from beatloop.cli.cmd_show import _show_state

    gated = recipe_of(target_kl=0.01).schedule().describe()
    assert "ppo: loss=ppo optimizer=adam updates=policy,value only_if=within_target_kl" in gated
    plain = recipe_of().schedule().describe()
    assert "only_if" not in plain and plain == recipe_of(target_kl=None).schedule().describe()
    assert gated.replace(" only_if=within_target_kl", "") == plain
    _show_state(recipe_of(target_kl=0.01))
    out = capsys.readouterr().out
    assert "  kl_stopped: () int32" in out and "  last_approx_kl: () float32" in out
    _show_state(recipe_of())
    assert "kl" not in capsys.readouterr().out


def test_a_target_kl_that_is_not_positive_is_a_config_error():
    for bad in (0, 0.0, -0.01):
        with pytest.raises(beatloop.ConfigError, match=r"'target_kl' must be > 0"):
            beatloop.make_recipe("ppo", {"target_kl": bad})
    with pytest.raises(beatloop.ConfigError, match=r"'target_kl' expects float \| None"):
        beatloop.make_recipe("ppo", {"target_kl": "small"})
    assert beatloop.make_recipe("ppo", {"target_kl": 1}).config.target_kl == 1.0


def test_gae_follows_its_definition():
    """Two copies over three steps: the first ends (done) after step 2, the second
    never; GAE from the definition, in float64, beside the recipe's."""
    from beatloop.recipes.ppo_rollout import advantages

    gamma, lam = 0.9, 0.8
    rewards = np.array([[1.0, 0.5], [2.0, 0.0], [0.0, 1.0]])
    values = np.array([[0.3, 0.1], [0.2, -0.4], [0.6, 0.7]])
    dones = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    last = np.array([0.9, -0.2])
    expected, running = np.zeros((3, 2)), np.zeros(2)
    for t in (2, 1, 0):
        following = last if t == 2 else values[t + 1]
        delta = rewards[t] + gamma * (1 - dones[t]) * following - values[t]
        running = delta + gamma * lam * (1 - dones[t]) * running
        expected[t] = running
    records = {"reward": rewards, "value": values, "done": dones}
    records = {k: tf.constant(v, tf.float32) for k, v in records.items()}
    found = advantages(records, tf.constant(last, tf.float32), gamma, lam).numpy()
    np.testing.assert_allclose(found, expected, rtol=1e-6)
    assert expected[1, 0] == pytest.approx(2.0 - 0.2)  # done: no bootstrap, no carry


def ticks(count: int) -> tf.data.Dataset:
    return beatloop.loop_data().train.take(count)


def test_validation_greedy_roll_outs_and_evaluate_change_nothing():
    recipe = recipe_of()
    with_validation = DataSplit(beatloop.loop_data().train, validation=ticks(2))
    validated, _, history = engine_and_hand_loop(recipe, with_validation, 4)
    plain, _, _ = engine_and_hand_loop(recipe_of(), None, 4)
    validated.fit(2)
    plain.fit(2)
    after_training = snapshot(validated)
    assert_same_weights(after_training, snapshot(plain))  # validating changed nothing
    assert np.isfinite(history.history["val_ppo"]).all()
    figures = validated.evaluate(ticks(3))
    assert np.isfinite(figures["ppo"]) and {"approx_kl", "entropy"} <= set(figures)
    validated.validate()
    models = validated.bound.models
    returns = {recipe.greedy_return(models, SEED) for _ in range(2)}
    assert len(returns) == 1  # the same start every time
    assert_same_weights(snapshot(validated), after_training)


@pytest.fixture(scope="module")
def learned():
    """A short cart-pole run at the default sizes but 12 rollouts in 3 epochs, the
    learning rate falling to 0 over them."""
    config = {"rollouts_per_epoch": 4, "anneal_rollouts": 12}
    return beatloop.fit("ppo", epochs=3, seed=0, config=config, progress=False)


def test_a_short_cartpole_run_learns_what_a_random_policy_does_not(learned):
    train, greedy = learned.history["train_return"], learned.history["greedy_return"]
    assert train[-1] > 100 > train[0], train  # a random policy lasts about 22 steps
    assert greedy[-1] == 200.0, greedy
    entropy = learned.history["entropy"]
    assert entropy[-1] < entropy[0] < math.log(2)
    assert set(learned.history) >= {"approx_kl", "clip_fraction", "value_loss", "val_ppo"}
    assert learned.steps == 3 * 4 * 16


def test_show_prints_the_act_the_clipped_update_and_the_state(capsys):
    from beatloop.cli.cmd_show import _show_state

    schedule = recipe_of().schedule().describe()
    assert "act: act fn=Ppo.act every=1" in schedule
    assert "ppo: loss=ppo optimizer=adam updates=policy,value" in schedule
    assert "clip by global norm 0.5" in schedule
    assert "updates=agent" in recipe_of(shared_torso=True).schedule().describe()
    _show_state(recipe_of())
    out = capsys.readouterr().out
    assert "  observation: (16, 4, 4) float32" in out and "  env_physics: (4, 4) float32" in out
    assert "  order: (2, 64) int32" in out


def test_bad_settings_are_config_errors_that_say_what_to_do():
    split = r"envs x rollout_steps \(3 x 5 = 15 rows\) must split into minibatches \(4\)"
    with pytest.raises(beatloop.ConfigError, match=split):
        beatloop.make_recipe("ppo", {"envs": 3, "rollout_steps": 5})
    with pytest.raises(beatloop.ConfigError, match=r"no environment 'cartpol' \(did you mean"):
        beatloop.make_recipe("ppo", {"env": "cartpol"})
    with pytest.raises(beatloop.ConfigError, match="gae_lambda"):
        beatloop.make_recipe("ppo", {"gae_lambda": 1.5})


def test_batched_cartpole_and_chain_equal_their_copies_stepped_one_by_one():
    random = tf.random.Generator.from_seed(1)
    for env in (recipe_of().environment, recipe_of(env="chain").environment):
        state = env.reset_batch(random, 5)
        if env.name == "chain":
            state = {"position": tf.constant([0, 3, 8, 9, 1])}
        action = tf.constant([0, 1, 1, 0, 1])
        fast = env.step_batch(state, action, random)
        slow = Environment.step_batch(env, state, action, random)  # the generic default
        for ours, theirs in zip(tf.nest.flatten(fast), tf.nest.flatten(slow), strict=True):
            np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
        np.testing.assert_array_equal(
            env.observe_batch(state).numpy(), Environment.observe_batch(env, state).numpy()
        )
    starts = recipe_of().environment.reset_batch(random, 6)["physics"].numpy()
    assert starts.shape == (6, 4) and np.abs(starts).max() <= 0.05 and len(set(starts[:, 0])) == 6


class Corridor(beatloop.Environment):
    """Step right 4 times to be paid 1; the copies start on a random one of 2 cells."""

    name = "corridor_test"

    @attrs.frozen
    class Config:
        length: int = 4

    observation_size = 5
    action_count = 2
    horizon = 10

    def initial_state(self):
        return {"cell": tf.constant(0)}

    def reset(self, random):
        return {"cell": tf.cast(random.uniform([], 0, 2, dtype=tf.int32), tf.int32)}

    def observe(self, state):
        return tf.one_hot(state["cell"], 5)

    def step(self, state, action, random):
        cell = tf.clip_by_value(state["cell"] + 2 * action - 1, 0, self.config.length)
        arrived = tf.equal(cell, self.config.length)
        return {"cell": cell}, tf.cast(arrived, tf.float32), arrived


def test_a_plugin_environment_is_stepped_by_the_generic_batched_methods():
    beatloop.register_environment(Corridor)
    config = {**SMALL, "env": "corridor_test", "env_settings": (), "rollouts_per_epoch": 6}
    config |= {"learning_rate": 1e-2, "anneal_rollouts": 0}
    result = beatloop.fit("ppo", epochs=2, seed=0, config=config, progress=False)
    assert result.history["greedy_return"][-1] == 1.0, result.history
    train = result.history["train_return"]
    assert train[-1] > 0.9 > train[0], train  # the random walk's first episodes fail often


def register_killable_cartpole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's ``killable_cartpole`` registered in this process until ``monkeypatch``
    is undone."""
    table = registry()
    monkeypatch.setattr(table, "environments", dict(table.environments))
    monkeypatch.setattr(table, "_origins", dict(table._origins))
    beatloop.register_environment(ppo_run.KillableCartPole)


@pytest.fixture
def killable_cartpole(monkeypatch):
    """The worker's ``killable_cartpole`` registered in this process for this test only."""
    register_killable_cartpole(monkeypatch)


#: The run both kills of ``test_a_ppo_run_killed_mid_epoch_resumes_bit_identical`` cut.
KILLED_SPEC = {"epochs": EPOCHS, "seed": SEED, "checkpoint_every": 10, "steps_per_execution": 2,
               "config": {**SMALL, "env": "killable_cartpole"}}  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """``KILLED_SPEC`` fitted without a kill, once for both kills: its final weights and
    state, and its history.jsonl."""
    full_dir = str(tmp_path_factory.mktemp("ppo_full") / "full")
    with pytest.MonkeyPatch.context() as monkeypatch:
        register_killable_cartpole(monkeypatch)
        full = ppo_run.fit({**KILLED_SPEC, "run_dir": full_dir})
    return ppo_run.final(full), Path(full_dir, "history.jsonl").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill, epochs_before",
    [({"kill_at_move": 16 * 5 + 7}, 2), ({"kill_at": 14}, 1)],
    ids=["while-collecting", "while-updating"],
)
def test_a_ppo_run_killed_mid_epoch_resumes_bit_identical(
    tmp_path, kill, epochs_before, uninterrupted, killable_cartpole
):
    """Killed inside the 6th rollout's collection (its 8th environment step, after a
    checkpoint at step 20, mid-epoch) or after step 14 (a checkpoint at 10: the
    resumed run restarts in the middle of a rollout's updates)."""
    killed_dir = str(tmp_path / "killed")
    killed = start_python(WORKER, json.dumps({**KILLED_SPEC, **kill, "run_dir": killed_dir}))
    _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    logged = Path(killed_dir, "history.jsonl").read_text().splitlines()
    assert len(logged) == epochs_before  # killed in the middle of the next epoch
    resumed = ppo_run.fit({**KILLED_SPEC, "run_dir": killed_dir})
    assert resumed.resumed_from is not None and resumed.steps == EPOCHS * 8
    full, full_history = uninterrupted
    assert_same_weights(ppo_run.final(resumed), full)
    # train_return and greedy_return included
    assert Path(killed_dir, "history.jsonl").read_text() == full_history


@pytest.mark.slow
def test_a_ppo_run_killed_while_target_kl_stops_a_rollout_resumes_bit_identical(
    tmp_path, killable_cartpole
):
    """KL_STOP's rollouts of 8 steps take 4, 4, 8, 4, 4, 4 updates: the 4th rollout
    (steps 25 to 32) stops at step 28, where a checkpoint (every 14 steps) is written;
    the kill after step 30 loses two skipped steps, and the resumed run skips steps 29
    to 32 again from the checkpointed ``kl_stopped``."""
    spec = {"epochs": EPOCHS, "seed": SEED, "checkpoint_every": 14, "steps_per_execution": 2}
    spec["config"] = {**SMALL, **KL_STOP, "env": "killable_cartpole"}
    killed_dir, full_dir = str(tmp_path / "killed"), str(tmp_path / "full")
    killed = start_python(WORKER, json.dumps({**spec, "kill_at": 30, "run_dir": killed_dir}))
    try:
        full = ppo_run.fit({**spec, "run_dir": full_dir})
    finally:
        _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    assert full.history["ppo_updates"] == [8.0, 12.0, 8.0]
    assert len(Path(killed_dir, "history.jsonl").read_text().splitlines()) == 1
    first = []  # (step, kl_stopped, Adam's iterations) at the resumed run's first call

    class First(beatloop.Callback):
        def on_execution_end(self, run, steps, logs):
            if not first:
                stopped = int(run.bound.state["kl_stopped"].numpy())
                first.append((run.step, stopped, int(run.bound.optimizers["adam"].iterations)))

    resumed = ppo_run.fit({**spec, "run_dir": killed_dir}, [First()])
    assert resumed.resumed_from is not None and resumed.steps == EPOCHS * 16
    assert first == [(30, 1, 20)]  # from step 28: steps 29 and 30 skipped again
    assert_same_weights(ppo_run.final(resumed), ppo_run.final(full))
    history = [Path(d, "history.jsonl").read_text() for d in (killed_dir, full_dir)]
    assert history[0] == history[1]  # ppo_updates included


def test_evaluate_on_the_run_dir_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    beatloop.fit("ppo", epochs=1, seed=1, config=SMALL, run_dir=run_dir, progress=False)
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    first, second = beatloop.evaluate(run_dir), beatloop.evaluate(run_dir)
    assert first == second and "ppo" in first and np.isfinite(first["ppo"])
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == files


def test_a_rollout_cut_by_the_horizon_bootstraps_its_last_reward():
    """On a chain no copy can finish within the horizon (3 steps, the end 5 cells
    away), every episode is cut, not ended: its last reward is gamma times the critic's
    value of the cell it was cut in (here the critic is the cell's number)."""
    from beatloop.recipes import ppo_rollout

    recipe = recipe_of(env="chain", env_settings=("length=6", "horizon=3"), envs=2,
                       rollout_steps=8, gamma=0.9, normalize_advantages=False)  # fmt: skip
    state = recipe.build_state()

    def heads(observation):  # a uniform policy; the value is the cell's number
        cell = tf.cast(tf.argmax(observation, axis=1), tf.float32)
        return tf.zeros([tf.shape(observation)[0], 2]), cell

    random = tf.random.Generator.from_seed(4)
    ppo_rollout.collect(recipe.environment, recipe.config, heads, state, random)
    cells = np.argmax(state["observation"].numpy(), axis=2)
    cut_in = np.clip(cells + 2 * state["action"].numpy() - 1, 0, 5)
    ends = np.array([(t + 1) % 3 == 0 for t in range(8)])[:, None].repeat(2, 1)
    np.testing.assert_array_equal(state["done"].numpy(), ends.astype(np.float32))
    np.testing.assert_allclose(state["reward"].numpy(), np.where(ends, 0.9 * cut_in, 0.0))
    assert state["epoch_episodes"].numpy() == 4 and state["epoch_return"].numpy() == 0
    np.testing.assert_array_equal(state["episode_step"].numpy(), [2, 2])
    assert (cells[[0, 3, 6]] == 0).all()  # each episode starts in the first cell
    advantage, returns = state["advantage"].numpy(), state["returns"].numpy()
    np.testing.assert_allclose(returns, advantage + cells, rtol=1e-6)
