"""Issue 51's environment, recipe and config cases: each bad input fails early with an
error naming the culprit (the environment and its method, the recipe and its method,
the config field), before anything is written, or warns where it only wastes a run.

Real recipes on real TensorFlow, at small sizes; the plugin environments are defined
here and registered for one test at a time."""

from __future__ import annotations

import warnings

import attrs
import keras
import pytest
import tensorflow as tf

import beatloop
from beatloop.core.data.batches import DataSplit
from beatloop.core.failures.errors import IgnoredSettingWarning, UserCodeError
from beatloop.ignored_settings import refuse_unread_data
from beatloop.plugins.registry import registry
from beatloop.recipes.ppo import PpoConfig, annealing_outlasted

PPO = {"envs": 2, "rollout_steps": 4, "minibatches": 1, "update_epochs": 1,
       "rollouts_per_epoch": 1, "anneal_rollouts": 0, "hidden": 8}  # fmt: skip
DQN = {"steps_per_epoch": 2, "learning_starts": 1, "buffer_size": 8, "batch_size": 2,
       "hidden": 8}  # fmt: skip


def cli(argv, capsys) -> tuple[int, str]:
    """``beatloop ARGV`` in this process: its exit code and standard error."""
    from beatloop.cli import main

    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.fixture
def register(monkeypatch):
    """``register(cls)``: the environment registered in this process for this test only;
    returns its name."""
    table = registry()
    monkeypatch.setattr(table, "environments", dict(table.environments))
    monkeypatch.setattr(table, "_origins", dict(table._origins))

    def registered(cls) -> str:
        beatloop.register_environment(cls)
        return cls.name

    return registered


# --- 1. an environment that does not fit its declared spec ---------------------------------


class Walk(beatloop.Environment):
    """Step right 4 times from the first of 5 cells to be paid 1 (test environment)."""

    name = "walk_faults"
    observation_size = 5
    action_count = 2
    horizon = 10

    def initial_state(self):
        return {"cell": tf.constant(0)}

    def observe(self, state):
        return tf.one_hot(state["cell"], 5)

    def step(self, state, action, random):
        cell = tf.clip_by_value(state["cell"] + 2 * action - 1, 0, 4)
        arrived = tf.equal(cell, 4)
        return {"cell": cell}, tf.cast(arrived, tf.float32), arrived


class DoubleReward(Walk):
    """Pays a float64 reward (test environment)."""

    name = "double_reward_faults"

    def step(self, state, action, random):
        after, reward, terminal = super().step(state, action, random)
        return after, tf.cast(reward, tf.float64), terminal


class Branching(Walk):
    """Branches in Python on a tensor (test environment)."""

    name = "branching_faults"

    def step(self, state, action, random):
        after, reward, terminal = super().step(state, action, random)
        if terminal:  # a tensor's value in Python: tf.where is meant
            reward = reward + 1.0
        return after, reward, terminal


class Wide(Walk):
    """Observes 6 numbers where it declares 5 (test environment)."""

    name = "wide_faults"

    def observe(self, state):
        return tf.one_hot(state["cell"], 6)


class Forgetful(Walk):
    """Reads a state entry it does not have (test environment)."""

    name = "forgetful_faults"

    def step(self, state, action, random):
        return {"cell": state["position"]}, 0.0, False


def fit_on(recipe: str, env: str, tmp_path):
    config = {**(PPO if recipe == "ppo" else DQN), "env": env}
    run_dir = tmp_path / "run"
    with pytest.raises(beatloop.BeatloopError) as raised:
        beatloop.fit(recipe, config=config, epochs=1, seed=0, run_dir=run_dir, progress=False)
    assert not run_dir.exists()  # refused before anything was written
    return raised.value


@pytest.mark.parametrize("recipe", ["ppo", "dqn"])
def test_a_float64_reward_is_refused_before_the_first_step_naming_the_environment(
    recipe, register, tmp_path
):
    error = fit_on(recipe, register(DoubleReward), tmp_path)
    assert type(error) is beatloop.ConfigError
    assert str(error) == (
        "environment 'double_reward_faults' (test_faults_config.DoubleReward): "
        "step(state, action, random) returns a reward of float64, shape (); expected a "
        "float32 scalar, shape () (tf.cast it to float32)"
    )


def test_a_python_branch_on_a_tensor_names_the_method_its_line_and_tf_where(register, tmp_path):
    error = fit_on("ppo", register(Branching), tmp_path)
    assert type(error) is beatloop.ConfigError
    first, at = str(error).split("\n")
    assert first.startswith(
        "environment 'branching_faults' (test_faults_config.Branching): step(state, action, "
        "random) uses a tensor in Python control flow (Using a symbolic `tf.Tensor` as a "
        "Python `bool` is not allowed): environments are traced without AutoGraph"
    )
    assert first.endswith("write it with tf.where or tf.cond (a loop: tf.while_loop)")
    assert at.strip().startswith("at ") and at.endswith(
        "in step: if terminal:  # a tensor's value in Python: tf.where is meant"
    )
    assert "test_faults_config.py:" in at
    assert isinstance(error.__cause__, tf.errors.OperatorNotAllowedInGraphError)  # kept


def test_an_observation_of_another_size_names_the_environment_not_the_data(register, tmp_path):
    error = fit_on("ppo", register(Wide), tmp_path)
    message = str(error)
    assert message == (
        "environment 'wide_faults' (test_faults_config.Wide): observe(state) returns an "
        "observation of float32, shape (6,); expected a float32 vector of observation_size "
        "5, shape (5,)"
    )
    assert "training data" not in message and "ppo.py" not in message


def test_an_exception_in_an_environment_method_is_user_code_with_its_cause(register, tmp_path):
    error = fit_on("dqn", register(Forgetful), tmp_path)
    assert type(error) is UserCodeError and isinstance(error.__cause__, KeyError)
    first, at = str(error).split("\n")
    assert first == (
        "environment 'forgetful_faults' (test_faults_config.Forgetful): step(state, action, "
        "random) failed: KeyError: 'position'"
    )
    assert "test_faults_config.py:" in at and at.endswith(
        'in step: return {"cell": state["position"]}, 0.0, False'
    )


def test_the_command_line_says_a_wrong_environment_in_one_line(register, tmp_path, capsys):
    env = register(DoubleReward)
    settings = [item for key, value in PPO.items() for item in ("--set", f"{key}={value}")]
    argv = ["run", "ppo", "--set", f"env={env}", *settings, "--run-dir", tmp_path / "run"]
    code, err = cli([*argv, "--quiet"], capsys)
    assert code == 2 and err.startswith("beatloop: error: environment 'double_reward_faults' ")
    assert "float64" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_the_built_in_environments_pass_their_check():
    for name in ("chain", "cartpole"):
        beatloop.make_environment(name).check(copies=3)  # nothing raised


# --- 2. an exception from a recipe's building methods ---------------------------------------


class Building(beatloop.Recipe):
    """One Dense model on x; a method raises what ``fail`` names (test recipe)."""

    name = "building_faults"
    steps_per_epoch = 2

    def __init__(self, fail: str = "", error: Exception | None = None):
        super().__init__()
        self.fail, self.error = fail, error or ValueError("a width of -1")

    def raise_if(self, method: str) -> None:
        if self.fail == method:
            raise self.error

    def default_data(self, seed):
        self.raise_if("default_data")
        return beatloop.loop_data()

    def build_models(self, batch_spec):
        self.raise_if("build_models")
        return {"m": keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])}

    def build_state(self):
        self.raise_if("build_state")
        return {}

    def epoch_figures(self, run):
        self.raise_if("epoch_figures")
        return {}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.1)}

    def losses(self):
        return {"one": lambda models, batch: tf.reduce_mean(models["m"](tf.ones([1, 1])))}

    def schedule(self):
        return beatloop.Schedule(beatloop.Beat(loss="one", optimizer="sgd", updates="m"))


@pytest.mark.parametrize("method", ["default_data", "build_models", "build_state"])
def test_an_exception_from_a_building_method_names_the_recipe_and_method(method, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(UserCodeError) as raised:
        beatloop.fit(Building(method), epochs=1, seed=0, run_dir=run_dir, progress=False)
    first, at = str(raised.value).split("\n")
    assert first == f"recipe 'building_faults': {method}() failed: ValueError: a width of -1"
    assert "test_faults_config.py:" in at and at.endswith("in raise_if: raise self.error")
    assert isinstance(raised.value.__cause__, ValueError)  # the recipe's own, kept
    assert raised.value.exit_code == 2
    assert not run_dir.exists()


def test_an_exception_from_the_recipes_epoch_figures_names_the_recipe_not_a_callback():
    with pytest.raises(UserCodeError) as raised:
        beatloop.fit(Building("epoch_figures"), epochs=1, seed=0, progress=False)
    first = str(raised.value).split("\n")[0]
    assert first == "recipe 'building_faults': epoch_figures() failed: ValueError: a width of -1"


def test_a_recipes_own_config_error_passes_through_its_building_method():
    error = beatloop.ConfigError("hidden must be even, got 3")
    with pytest.raises(beatloop.ConfigError) as raised:
        beatloop.fit(Building("build_models", error), epochs=1, seed=0, progress=False)
    assert raised.value is error


# --- 3. data given to a recipe that makes its own -------------------------------------------


def test_run_ppo_with_data_is_refused_before_the_csv_is_read_or_recorded(tmp_path, capsys):
    rows = tmp_path / "rows.csv"
    rows.write_text("x,y\n1,2\n3,4\n")
    argv = ["run", "ppo", "--data", f"csv:{rows}", "--run-dir", tmp_path / "run", "--quiet"]
    code, err = cli(argv, capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(
        "beatloop: error: recipe 'ppo' makes its own data (its default_data is "
        "beatloop.loop_data()'s ticks"
    )
    assert f"--data csv:{rows} would be ignored, yet recorded in run.json" in err
    assert not (tmp_path / "run").exists()


def test_batches_for_dqn_are_refused_and_its_own_ticks_are_not(tmp_path):
    rows = tf.data.Dataset.from_tensor_slices({"x": tf.zeros([4, 2])}).batch(2)
    with pytest.raises(beatloop.ConfigError, match=r"data= gives batches \('x'\) it would never"):
        beatloop.fit("dqn", data=rows, config=DQN, run_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    ticks = beatloop.loop_data().train
    for recipe in ("dqn", "ppo"):
        made = beatloop.make_recipe(recipe)
        refuse_unread_data(made, DataSplit(ticks, validation=ticks.take(2)))  # accepted
        refuse_unread_data(made, ticks.take(5))
    for recipe in ("meta", "style_transfer", "supervised"):  # they read the data they are given
        refuse_unread_data(beatloop.make_recipe(recipe), rows)


# --- 4. recommender settings that make its figures or loss meaningless ----------------------

RECOMMENDER = {"users": 20, "items": 30, "ratings_per_user": 10, "batch_size": 32,
               "embedding": 4, "rating_layers": (8,)}  # fmt: skip


def test_a_top_k_not_below_the_items_is_refused_naming_both(tmp_path):
    config = {**RECOMMENDER, "top_k": 1000}
    run_dir = tmp_path / "run"
    with pytest.raises(beatloop.ConfigError) as raised:
        beatloop.fit("recommender", config=config, seed=0, run_dir=run_dir, progress=False)
    message = str(raised.value)
    assert message.startswith("recipe 'recommender': top_k=1000 is not below the ")
    assert "items of the training data, so recall@1000 would count every row as a hit" in message
    assert "(--set top_k=10)" in message
    assert not run_dir.exists()


@pytest.mark.parametrize("recipe", ["recommender", "multitask"])
def test_a_negative_loss_weight_is_refused_by_the_config_naming_the_field(recipe, capsys):
    code, err = cli(["run", recipe, "--set", "weights=-1,1", "--quiet"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"invalid config for recipe '{recipe}': weights takes finite loss weights of at " in err
    assert "least 0, got [-1.0, 1.0]: a negative weight makes each step maximise" in err
    beatloop.make_recipe(recipe, {"weights": (1.0, 0.0)})  # a task weighed 0 is fine


# --- 5. ppo epochs past the learning rate's annealing ---------------------------------------


def test_ppo_epochs_past_the_annealing_warn_at_the_start_naming_the_field():
    config = {**PPO, "anneal_rollouts": 2, "rollouts_per_epoch": 2, "env": "chain",
              "env_settings": ("length=3",)}  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        beatloop.fit("ppo", config=config, epochs=2, seed=0, progress=False)
    (message,) = [str(w.message) for w in caught if w.category is IgnoredSettingWarning]
    assert message == (
        "recipe 'ppo': the learning rate falls linearly to 0 over anneal_rollouts=2 rollouts "
        "(2 updates), reached in epoch 1 of the 2 this run asks for: the steps after it "
        "train nothing. To anneal over the whole run set anneal_rollouts=4 (--set "
        "anneal_rollouts=4: 2 epochs of 2 updates), or 0 to keep the rate"
    )


def test_the_annealing_rule_at_the_defaults():
    defaults = PpoConfig()
    epoch = 80 * 16  # rollouts_per_epoch x update_epochs x minibatches
    assert annealing_outlasted(defaults, 1, epoch) is None
    assert "set anneal_rollouts=160 (--set anneal_rollouts=160: 2 epochs of 1280 updates)" in (
        annealing_outlasted(defaults, 2, epoch)
    )
    assert annealing_outlasted(attrs.evolve(defaults, anneal_rollouts=0), 5, epoch) is None
    assert annealing_outlasted(attrs.evolve(defaults, anneal_rollouts=160), 2, epoch) is None
    kl = annealing_outlasted(attrs.evolve(defaults, target_kl=0.01), 3, epoch)
    assert "(target_kl's stopped updates delay it), reached in epoch 1 of the 3" in kl
