"""The code of the README and the docs pages is run, not just read: these tests run the
blocks whose results say more than that they ran (``test_docs.py`` runs the others)."""

import tempfile

import pytest
import tensorflow as tf
from helpers import ROOT, find_block

import beatloop
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry

README = ROOT / "README.md"


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Blocks run with the current directory, and ``tempfile``'s, in ``tmp_path``: what
    they write never lands in the checkout."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_write_your_own_recipe_block_runs(monkeypatch, capsys):
    block = find_block("class Autoencoder")
    assert len([line for line in block.code.splitlines() if line.strip()]) < 40
    monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))
    namespace = {}
    block.run(namespace)
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
    block = find_block("class Distill")
    assert len([line for line in block.code.splitlines() if line.strip()]) < 45
    monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))
    namespace = {}
    block.run(namespace)
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
    namespace = {}
    find_block("class CodeAndClass").run(namespace)
    history = namespace["result"].history
    assert history["val_reconstruction"][1] < history["val_reconstruction"][0]
    assert history["val_cross_entropy"][1] < history["val_cross_entropy"][0]
    (group,) = namespace["result"].bound.groups
    updates = {beat.name: beat.updated_models for beat in group.beats}
    assert updates == {"reconstruction": ("encoder", "decoder"), "cross_entropy": ("classifier",)}
    printed = f"{history['val_reconstruction']} {history['val_cross_entropy']}\n"
    assert capsys.readouterr().out == printed


def test_the_nan_guard_block_prints_what_the_page_shows(capsys):
    """A learning rate that really gives a NaN with the default optimizer, and one that
    only the divergence guard stops: the messages the page shows are the real ones."""
    block = find_block("divergence=divergence")
    block.run({})
    printed = capsys.readouterr().out
    assert printed == block.shown_output
    assert "produced a non-finite loss (nan) at step 2" in printed
    assert "diverged: loss 2.204e+20 is above 10 times its running median 2.34" in printed
