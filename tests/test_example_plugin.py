"""The example plugin package, installed with pip as a user would, then uninstalled."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "beatloop-example-plugin"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow  # pip and the plugin's runs are other processes


def pip(*args):
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)


def beatloop_list():
    out = subprocess.run(
        [str(BIN / "beatloop"), "list", "--verbose"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def example_installed():
    pip("install", "--no-deps", "-e", str(EXAMPLE))
    yield
    pip("uninstall", "-y", "beatloop-example-plugin")


def test_list_shows_the_plugin_with_its_origin(example_installed):
    out = beatloop_list()
    line = next(line for line in out.splitlines() if line.startswith("wgan_gp"))
    assert "Wasserstein GAN with gradient penalty" in line
    assert line.endswith("[beatloop-example-plugin]")
    assert "module: beatloop_example_plugin.wgan_gp  plugin: example" in out
    assert "callback epoch_timer: beatloop_example_plugin.timer.EpochTimer" in out


def test_wgan_gp_trains_and_its_critic_loss_behaves(example_installed):
    script = textwrap.dedent(
        """
        import json, beatloop
        from beatloop.plugins.registry import registry
        timer = registry().callback("epoch_timer").cls()
        result = beatloop.fit("wgan_gp", epochs=5, seed=0, callbacks=[timer])
        print(json.dumps({"history": result.history, "timed": len(timer.seconds),
                          "critic_applies": int(result.optimizers["critic_opt"].iterations),
                          "generator_applies": int(result.optimizers["generator_opt"].iterations),
                          "steps": result.steps}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout.strip().splitlines()[-1])
    history = record["history"]
    assert record["timed"] == 5
    # n_critic = 5: the critic's optimizer applies five updates per step, the generator's one.
    assert record["critic_applies"] == 5 * record["steps"] == 5 * record["generator_applies"]
    # A Wasserstein estimate: the critic learns to separate real from generated (its loss,
    # -W + penalty, falls from where it started) while the penalty keeps it near 1-Lipschitz.
    critic = history["critic_loss"]
    assert min(critic[1:]) < critic[0] - 1.0
    assert max(history["penalty"]) < 0.5
    assert history["wasserstein"][0] > 0 and history["val_wasserstein"][-1] > 0


def test_uninstalling_removes_it(example_installed):
    pip("uninstall", "-y", "beatloop-example-plugin")
    out = beatloop_list()
    assert "wgan_gp" not in out and "epoch_timer" not in out
