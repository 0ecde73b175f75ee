"""Exporting a run's inference models as SavedModels that reload and give the same
outputs."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import dict_batches, gan_data, tuple_batches

import beatloop


def test_supervised_classifier_exports_and_reloads(small_digits, tmp_path):
    train, validation = small_digits
    result = beatloop.fit("supervised", data=tuple_batches(train, 50), epochs=1, seed=0)
    paths = result.export(tmp_path / "export")
    assert set(paths) == {"model"}
    loaded = tf.saved_model.load(str(paths["model"]))  # keep it: it owns the variables
    served = loaded.serve(validation["x"])
    expected = result.models["model"](validation["x"], training=False)
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(beatloop.BeatloopError, match="not empty"):
        result.export(tmp_path / "export")


def test_gan_exports_its_generator(tmp_path):
    result = beatloop.fit("gan", data=gan_data(64), epochs=1, seed=0)
    paths = result.export(tmp_path)
    noise = np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32)
    loaded = tf.saved_model.load(str(paths["generator"]))
    served = loaded.serve(noise)
    expected = result.models["generator"](noise, training=False)
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)


def test_multitask_exports_one_model_with_every_head(small_digits, tmp_path):
    train, validation = small_digits
    result = beatloop.fit("multitask", data=dict_batches(train, 50), epochs=1, seed=0)
    loaded = tf.saved_model.load(str(result.export(tmp_path)["multitask"]))
    served = loaded.serve(validation["x"])
    models = result.models
    features = models["backbone"](validation["x"])
    digit, ink = models["head_digit"](features), models["head_ink"](features)
    np.testing.assert_allclose(served["digit"], digit, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(served["ink"], ink, rtol=1e-5, atol=1e-6)


def test_image_mode_style_transfer_has_nothing_to_export(tmp_path):
    result = beatloop.fit("style_transfer", config={"image_size": 16, "steps_per_epoch": 2})
    with pytest.raises(beatloop.BeatloopError, match="no inference model to export"):
        result.export(tmp_path)


def test_cli_export_restores_the_run_dir_and_writes_the_classifier(tmp_path, capsys):
    from beatloop.cli import main

    run_dir = tmp_path / "run"
    config = {"hidden": 24, "batch_size": 128}
    result = beatloop.fit("supervised", config=config, epochs=1, seed=2, run_dir=run_dir)
    assert main(["export", str(run_dir), str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert f"restored {result.checkpoint} (step {result.steps})" in printed
    x = np.random.default_rng(0).uniform(size=(7, 64)).astype(np.float32)
    loaded = tf.saved_model.load(str(tmp_path / "out" / "model"))
    expected = result.models["model"](x, training=False)
    np.testing.assert_allclose(loaded.serve(x), expected, rtol=1e-5, atol=1e-6)
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out2")]) == 5  # run dir
    assert "holds no readable checkpoint" in capsys.readouterr().err
