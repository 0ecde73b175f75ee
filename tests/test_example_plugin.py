"""The example plugin package, installed with pip as a user would, then uninstalled:
into a throwaway environment, so neither a passing nor a crashing test changes the
environment the tests run in."""

import json
import sys
from importlib import metadata
from pathlib import Path

import pytest
from helpers import assert_same_weights, load_npz, pip, run_python, same_weights, venv_holding

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "beatloop-example-plugin"
WORKER = Path(__file__).parent / "workers" / "plugin_run.py"

pytestmark = pytest.mark.slow  # a venv, pip and the plugin's runs are other processes


@pytest.fixture(scope="module")
def throwaway(tmp_path_factory) -> Path:
    """The python of a throwaway venv holding the example plugin
    (``helpers.venv_holding``)."""
    return venv_holding(EXAMPLE, tmp_path_factory.mktemp("throwaway"))


@pytest.fixture(scope="module")
def plugin_runs(throwaway, tmp_path_factory) -> tuple[dict, Path]:
    """The worker's four modes (list, train, resume, grid) in one process of the
    throwaway environment: each mode's record, and the folder the resume mode wrote its
    weights to."""
    out = tmp_path_factory.mktemp("plugin_runs")
    printed = run_python(WORKER, "all", out, python=throwaway)
    return json.loads(printed.splitlines()[-1]), out


def beatloop_list(python: Path) -> str:
    return run_python("-m", "beatloop", "list", "--verbose", python=python, timeout=120)


def test_list_shows_the_plugin_with_its_origin(plugin_runs):
    out = plugin_runs[0]["list"]  # ``beatloop list --verbose``, first thing in the worker
    line = next(line for line in out.splitlines() if line.startswith("wgan_gp"))
    assert "Wasserstein GAN with gradient penalty" in line
    assert line.endswith("[beatloop-example-plugin]")
    assert "module: beatloop_example_plugin.wgan_gp  plugin: example" in out
    assert "callback epoch_timer: beatloop_example_plugin.timer.EpochTimer" in out
    assert "environment grid: beatloop_example_plugin.grid.Grid [beatloop-example-plugin]" in out


def test_the_live_environment_never_sees_the_plugin(throwaway):
    # Installed in the throwaway environment (the test above lists it there), it is
    # neither in a new process of the live one nor in this process.
    live = beatloop_list(sys.executable)
    assert "wgan_gp" not in live and "epoch_timer" not in live
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.distribution("beatloop-example-plugin")


def test_wgan_gp_trains_and_its_critic_loss_behaves(plugin_runs):
    record = plugin_runs[0]["train"]
    history = record["history"]
    assert record["timed"] == 2
    # n_critic = 5: the critic's optimizer applies five updates per step, the generator's one.
    assert record["critic_applies"] == 5 * record["steps"] == 5 * record["generator_applies"]
    # A Wasserstein estimate: the critic learns to separate real from generated (its loss,
    # -W + penalty, falls from where it started) while the penalty keeps it near 1-Lipschitz.
    critic = history["critic_loss"]
    assert min(critic[1:]) < critic[0] - 1.0
    assert max(history["penalty"]) < 0.5
    assert history["wasserstein"][0] > 0 and history["val_wasserstein"][-1] > 0


def test_the_plugins_recipe_resumes_bit_identical(plugin_runs):
    runs, out = plugin_runs[0]["resume"], plugin_runs[1]
    first, resumed, whole = runs["first"], runs["resumed"], runs["whole"]
    # 1,437 training digits in batches of 64: 23 steps an epoch.
    assert (first["steps"], resumed["steps"], whole["steps"]) == (23, 46, 46)
    assert first["resumed_from"] is None and whole["resumed_from"] is None
    assert resumed["resumed_from"] == first["checkpoint"]  # the end of epoch 1
    assert resumed["history"] == whole["history"]  # every logged figure, bit for bit
    assert_same_weights(load_npz(out / "resumed.npz"), load_npz(out / "whole.npz"))
    # Epoch 2 trained after the resume: the match is between two trainings.
    assert not same_weights(load_npz(out / "first.npz"), load_npz(out / "resumed.npz"))


def test_the_plugins_environment_trains_the_built_in_dqn(plugin_runs):
    record = plugin_runs[0]["grid"]
    assert record["origin"] == "beatloop-example-plugin"
    # The grid walk from corner to corner: the greedy policy finds the way in 1,000 steps.
    assert record["history"]["greedy_return"][-1] == record["optimal_return"] == 1.0
    import beatloop

    with pytest.raises(beatloop.ConfigError, match="no environment 'grid'"):
        beatloop.make_recipe("dqn", {"env": "grid"})  # the live environment lacks it


def test_uninstalling_removes_it(throwaway):
    pip(throwaway, "uninstall", "-y", "beatloop-example-plugin")
    out = beatloop_list(throwaway)
    assert "wgan_gp" not in out and "epoch_timer" not in out
