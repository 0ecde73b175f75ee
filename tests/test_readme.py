"""The README's code is run, not just read."""

import re
from pathlib import Path

import pytest
import tensorflow as tf

import beatloop
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry

README = Path(__file__).resolve().parents[1] / "README.md"
PLUGINS = README.parent / "docs" / "plugins.md"


def python_blocks(document: Path = README):
    return re.findall(r"```python\n(.*?)```", document.read_text(), flags=re.S)


def run_block(block: str, document: Path, namespace: dict) -> None:
    """Run a code block with its lines numbered as in ``document``, so tracebacks, and
    AutoGraph reading a loss's source, find the document's own lines."""
    text = document.read_text()
    padding = "\n" * text[: text.index(block)].count("\n")
    exec(compile(padding + block, str(document), "exec"), namespace)


def test_write_your_own_recipe_block_runs(monkeypatch, capsys):
    (block,) = [b for b in python_blocks() if "class Autoencoder" in b]
    assert len([line for line in block.splitlines() if line.strip()]) < 40
    monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))
    namespace = {}
    run_block(block, README, namespace)
    history = namespace["result"].history
    assert history["reconstruction"][1] < history["reconstruction"][0]
    assert history["val_reconstruction"][1] < history["val_reconstruction"][0]
    assert "autoencoder" in namespace["beatloop"].recipes()
    # What the block prints: the two figures of the run it trained, one per epoch.
    printed = f"{history['reconstruction']} {history['val_reconstruction']}\n"
    assert capsys.readouterr().out == printed


def test_setup_commands_come_first():
    lines = README.read_text().splitlines()
    commands = [line for line in lines[:12] if line.startswith("python3 -m venv")]
    assert len(commands) == 2
    assert "beatloop run supervised" in commands[0] and "pytest" in commands[1]


def test_models_the_user_supplies_block_runs(monkeypatch, capsys):
    (block,) = [b for b in python_blocks() if "class Distill" in b]
    assert len([line for line in block.splitlines() if line.strip()]) < 45
    monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))
    namespace = {}
    run_block(block, README, namespace)
    result = namespace["result"]
    losses = result.history["val_distillation"]
    assert losses[-1] < losses[0]
    assert capsys.readouterr().out.endswith(f"{losses}\n")
    # The student learnt the digits from the teacher and the labels, the teacher untouched.
    data = namespace["digits"](0, 64).validation
    x, y = (tf.concat([batch[key] for batch in data], 0) for key in ("x", "y"))

    def accuracy(model):
        predicted = tf.argmax(model(x), 1, output_type=tf.int32)
        return float(tf.reduce_mean(tf.cast(predicted == y, tf.float32)))

    assert accuracy(result.models["student"]) > max(0.85, accuracy(namespace["teacher"]) - 0.05)
    assert result.models["teacher"] is namespace["teacher"]
    # Without the teacher, the run stops at once and says what to pass.
    with pytest.raises(beatloop.ConfigError) as caught:
        beatloop.fit("distill", data=data, models={"student": namespace["student"]})
    message = str(caught.value)
    assert message.startswith("recipe 'distill'") and "needs model(s) you supply:" in message
    assert "'teacher': a trained classifier of the same inputs" in message
    assert (
        "models={'teacher': model_or_path}" in message and "--model teacher=PATH.keras" in message
    )
    with pytest.raises(beatloop.ConfigError, match=r"'distill' has no built-in data .* pass data="):
        beatloop.fit("distill", models={"student": namespace["student"]})


def test_the_plugin_guides_group_block_runs(capsys):
    """One encoder pass feeds two beats: the classifier learns from the code while only
    the reconstruction beat moves the encoder."""
    (block,) = [b for b in python_blocks(PLUGINS) if "class CodeAndClass" in b]
    namespace = {}
    run_block(block, PLUGINS, namespace)
    history = namespace["result"].history
    assert history["val_reconstruction"][1] < history["val_reconstruction"][0]
    assert history["val_cross_entropy"][1] < history["val_cross_entropy"][0]
    (group,) = namespace["result"].bound.groups
    updates = {beat.name: beat.updated_models for beat in group.beats}
    assert updates == {"reconstruction": ("encoder", "decoder"), "cross_entropy": ("classifier",)}
    printed = f"{history['val_reconstruction']} {history['val_cross_entropy']}\n"
    assert capsys.readouterr().out == printed


def test_the_nan_guard_block_prints_what_the_readme_shows(capsys):
    """A learning rate that really gives a NaN with the default optimizer, and one that
    only the divergence guard stops: the messages the README shows are the real ones."""
    (block,) = [b for b in python_blocks() if "divergence=divergence" in b]
    text = README.read_text()
    shown = re.match(r"```\n\n```text\n(.*?)```", text[text.index(block) + len(block) :], re.S)[1]
    exec(compile(block, str(README), "exec"), {})
    printed = capsys.readouterr().out
    assert printed == shown
    assert "produced a non-finite loss (nan) at step 2" in printed
    assert "diverged: loss 2.204e+20 is above 10 times its running median 2.34" in printed
