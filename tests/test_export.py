"""Exporting a run's inference models as SavedModels that reload and give the same
outputs."""

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, dict_batches, gan_data, tuple_batches

import beatloop


def test_supervised_classifier_exports_and_reloads(small_digits, tmp_path):
    train, validation = small_digits
    result = beatloop.fit("supervised", data=tuple_batches(train, 50), epochs=1, seed=0)
    afile = tmp_path / "afile"
    afile.write_text("notes")
    with pytest.raises(beatloop.RunDirError, match=f"export OUT {afile} is a file, not a folder"):
        result.export(afile)  # refused before Keras writes anything
    assert afile.read_text() == "notes"
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


class ExportAtTheEnd(beatloop.Callback):
    """At the run's end, exports the best epoch's models as the run's own process can
    (``Run.export`` with the best checkpoint's weights), after a checkpoint it lacks."""

    def __init__(self, out):
        self.out, self.paths, self.refused = out, None, None

    def on_fit_end(self, run, logs):
        before = all_weights(run.models)
        with pytest.raises(beatloop.CheckpointError) as refused:
            run.export(self.out, checkpoint="ckpt-99")
        self.refused = str(refused.value)
        assert_same_weights(all_weights(run.models), before)
        best = json.loads((Path(run.run_dir) / "run.json").read_text())["best"]
        self.paths = run.export(self.out, checkpoint=best["checkpoint"])


def test_a_run_exports_a_checkpoints_weights_and_keeps_its_own(tmp_path):
    """``Run.export(out, checkpoint=...)`` writes what ``restore(best=True).export``
    writes, the evaluated average included, and leaves the run's weights as they were."""
    at_end = ExportAtTheEnd(tmp_path / "at_end")
    run_dir = tmp_path / "run"
    result = beatloop.fit("supervised", epochs=3, seed=0, run_dir=run_dir, progress=False,
                          config={"batch_size": 256, "ema_decay": 0.9}, callbacks=[at_end],
                          keep_best="val_loss:max")  # fmt: skip
    assert "ckpt-99 could not be read" in at_end.refused
    assert_same_weights(all_weights(result.models), all_weights(beatloop.restore(run_dir).models))
    reference = beatloop.restore(run_dir, best=True).export(tmp_path / "reference")
    x = tf.random.stateless_normal((6, 64), seed=(3, 4))
    written = tf.saved_model.load(str(at_end.paths["model"]))
    expected = tf.saved_model.load(str(reference["model"]))
    np.testing.assert_allclose(written.serve(x), expected.serve(x), rtol=1e-6, atol=1e-6)
    latest = tf.saved_model.load(str(result.export(tmp_path / "latest")["model"]))
    assert not np.allclose(written.serve(x), latest.serve(x))  # another epoch's weights


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
    assert f"the run dir {tmp_path / 'nothing'} does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), str(tmp_path / "out2")]) == 5
    assert "holds no readable checkpoint" in capsys.readouterr().err


def test_cli_export_to_a_file_is_refused_before_the_run_is_rebuilt(tmp_path, capsys):
    from beatloop.cli import main

    afile = tmp_path / "afile"
    afile.write_text("notes")
    advice = "name a new or empty folder as OUT (beatloop export RUN_DIR OUT; .export(out))"
    expected = {
        afile: f"export OUT {afile} is a file, not a folder: {advice}",
        afile / "sub": f"export OUT {afile / 'sub'} cannot be created: {afile} is a file, not "
        f"a folder; {advice}",
    }
    for out, message in expected.items():
        assert main(["export", str(tmp_path / "no-run"), str(out)]) == 5  # OUT, not the run
        assert capsys.readouterr().err == f"beatloop: error: {message}\n"
        assert afile.read_text() == "notes"


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    """A run dir trained with --data on a CSV of 16 features (the built-in digits have
    64), and the CSV."""
    from beatloop.cli import main

    folder = tmp_path_factory.mktemp("csv_run")
    rng = np.random.default_rng(0)
    rows = [",".join([*(f"f{i}" for i in range(16)), "label"])]
    rows += [",".join([*(f"{v:.4f}" for v in rng.uniform(size=16)), str(i % 3)]) for i in range(60)]
    (folder / "table.csv").write_text("\n".join(rows) + "\n")
    argv = ["run", "supervised", "--data", f"csv:{folder / 'table.csv'}", "--data-set",
            "label=label", "--set", "hidden=4", "--seed", "0", "--quiet"]  # fmt: skip
    assert main([*argv, "--run-dir", str(folder / "run")]) == 0
    return folder / "run", folder / "table.csv"


def test_cli_export_rebuilds_a_data_run_on_the_data_its_run_json_names(csv_run, tmp_path, capsys):
    from beatloop.cli import main
    from beatloop.named_data.load import NamedData

    run_dir, table = csv_run
    assert main(["export", str(run_dir), str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert "supervised: restored " in capsys.readouterr().out
    x = np.random.default_rng(1).uniform(size=(5, 16)).astype(np.float32)
    restored = beatloop.restore(run_dir, NamedData(f"csv:{table}", ("label=label",)))
    loaded = tf.saved_model.load(str(tmp_path / "out" / "model"))
    expected = restored.models["model"](x, training=False)
    np.testing.assert_allclose(loaded.serve(x), expected, rtol=1e-5, atol=1e-6)
    assert expected.shape == (5, 10)


def test_cli_export_says_what_to_do_when_the_data_is_gone(csv_run, tmp_path, capsys):
    import json
    import shutil

    from beatloop.cli import main

    run_dir, table = shutil.copytree(csv_run[0], tmp_path / "run"), csv_run[1]
    recorded = json.loads((run_dir / "run.json").read_text())
    recorded["data_source"]["data"] = f"csv:{tmp_path / 'moved.csv'}"
    (run_dir / "run.json").write_text(json.dumps(recorded))
    assert main(["export", str(run_dir), str(tmp_path / "a")]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        f"beatloop: error: {run_dir / 'run.json'} records that the run trained on --data "
        f"csv:{tmp_path / 'moved.csv'}, which cannot be read now: "
    )
    assert line.endswith(
        "name its data as it is now with --data KIND:PATH (and --data-set NAME=VALUE; data= "
        "in Python)"
    )
    argv = ["export", str(run_dir), str(tmp_path / "b"), "--data", f"csv:{table}"]
    assert main([*argv, "--data-set", "label=label"]) == 0  # named anew
    assert (tmp_path / "b" / "model").is_dir() and not (tmp_path / "a").exists()
    # A run dir that names no data (trained from Python): rebuilt on a placeholder batch
    # of the batch spec its record holds, enough to export the same model.
    del recorded["data_source"]
    (run_dir / "run.json").write_text(json.dumps(recorded))
    assert main(["export", str(run_dir), str(tmp_path / "c")]) == 0
    x = np.random.default_rng(1).uniform(size=(5, 16)).astype(np.float32)
    named, unnamed = (tf.saved_model.load(str(tmp_path / d / "model")) for d in "bc")
    np.testing.assert_array_equal(named.serve(x), unnamed.serve(x))
