"""Evaluation: a run's validation step over a data set, without training. The figures
equal the ``val_`` figures ``fit`` logged for the same weights and data, and nothing
(weights, optimizers, counters, the run dir) changes."""

import hashlib
import json
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    all_weights,
    assert_same_weights,
    dict_batches,
    gan_data,
    history_records,
    tuple_batches,
)
from PIL import Image

import beatloop
from beatloop.cli import main

SMALL = {"hidden": 24, "batch_size": 128}  # supervised, on its built-in digits


def unprefixed(history, prefix="val_"):
    """The last epoch's figures under ``prefix``, by name without it."""
    return {k.removeprefix(prefix): v[-1] for k, v in history.items() if k.startswith(prefix)}


def snapshot(run_dir):
    """Every file in a run dir: its bytes' digest and its modification time."""
    return {
        str(path.relative_to(run_dir)): (
            hashlib.sha256(path.read_bytes()).hexdigest(),
            path.stat().st_mtime_ns,
        )
        for path in sorted(run_dir.rglob("*"))
        if path.is_file()
    }


def by_hand(model, arrays):
    """Supervised's loss (mean cross-entropy) and accuracy over every row, computed here."""
    logits = model(arrays["x"], training=False)
    losses = keras.losses.sparse_categorical_crossentropy(arrays["y"], logits, from_logits=True)
    accuracy = np.mean(np.argmax(logits, axis=-1) == arrays["y"])
    return {"loss": float(np.mean(losses)), "accuracy": float(accuracy)}


@pytest.fixture(scope="module")
def supervised_run(small_digits, tmp_path_factory):
    """A 2-epoch supervised run with validation data, and its run dir: one for the tests
    below, as evaluating changes nothing in it (the first test checks that)."""
    train, validation = small_digits
    data = (tuple_batches(train, 50), tuple_batches(validation, 30))
    run_dir = tmp_path_factory.mktemp("supervised_run") / "run"
    result = beatloop.fit("supervised", data=data, epochs=2, seed=0, run_dir=run_dir)
    return result, run_dir


def test_supervised_figures_equal_the_last_val_figures(supervised_run):
    result, run_dir = supervised_run
    engine = result.engine
    weights, files = all_weights(result.models), snapshot(run_dir)
    iterations = int(result.optimizers["optimizer"].iterations)
    counters = engine.counters.checkpointed()
    before = {name: int(variable) for name, variable in counters.items()}

    figures = result.evaluate()

    assert set(figures) == {"loss", "accuracy"}  # names without the val_ prefix
    assert figures == unprefixed(result.history)  # exactly
    assert figures["loss"] != result.history["loss"][-1]  # not the training figures
    assert_same_weights(all_weights(result.models), weights)
    assert int(result.optimizers["optimizer"].iterations) == iterations == result.steps
    assert {name: int(variable) for name, variable in counters.items()} == before
    assert snapshot(run_dir) == files
    assert result.evaluate(steps_per_execution=3) == pytest.approx(figures, rel=1e-6, abs=0)


def test_other_data_gives_the_hand_computed_figures(supervised_run, small_digits):
    result, _ = supervised_run
    train, validation = small_digits
    expected = by_hand(result.models["model"], train)
    figures = result.evaluate(tuple_batches(train, 64))
    assert figures == pytest.approx(expected, rel=1e-5, abs=0)
    assert figures["loss"] != pytest.approx(result.history["val_loss"][-1], rel=1e-3)
    # Dicts, and several steps per compiled call (the last call short): the same figures.
    as_dicts = result.evaluate(dict_batches(train, 32), steps_per_execution=4)
    assert as_dicts == pytest.approx(expected, rel=1e-5, abs=0)
    # The run's own validation data, passed in: its val_ figures.
    again = result.evaluate(tuple_batches(validation, 30))
    assert again == pytest.approx(unprefixed(result.history), rel=1e-6, abs=0)
    assert by_hand(result.models["model"], validation) == pytest.approx(again, rel=1e-5)


def test_multitask_figures_equal_the_last_val_figures(small_digits):
    train, validation = small_digits
    data = (dict_batches(train, 50), dict_batches(validation, 40))
    config = {"schedule": "alternating"}
    result = beatloop.fit("multitask", data=data, config=config, epochs=1, seed=0)
    beats = [beat.name for beat in result.bound.beats]
    figures = result.evaluate()
    assert len(beats) > 1 and set(beats) <= set(figures)
    assert figures == unprefixed(result.history)


def test_gan_figures_equal_the_last_val_figures_noise_and_all():
    """The GAN's losses draw noise: validation draws it from the run's seed afresh each
    pass, so the same weights on the same data give the same figures."""
    result = beatloop.fit("gan", data=(gan_data(64), gan_data(48, 16)), epochs=2, seed=0)
    weights = all_weights(result.models)
    figures = result.evaluate()
    assert {"d_loss", "g_loss", "d_real", "d_fake"} <= set(figures)
    assert figures == unprefixed(result.history)
    assert result.evaluate() == figures
    assert_same_weights(all_weights(result.models), weights)


def test_validation_draws_nothing_from_the_runs_generator():
    """Training goes the same with or without validation data: validating does not move
    the generator the training losses draw their noise from."""
    with_validation = beatloop.fit("gan", data=(gan_data(64), gan_data(32)), epochs=2, seed=3)
    without = beatloop.fit("gan", data=gan_data(64), epochs=2, seed=3)
    assert_same_weights(all_weights(with_validation.models), all_weights(without.models))
    assert with_validation.history["d_loss"] == without.history["d_loss"]


def test_evaluate_a_run_dir_like_the_run_itself(tmp_path, capsys, small_digits):
    run_dir = tmp_path / "run"
    result = beatloop.fit("supervised", config=SMALL, epochs=1, seed=2, run_dir=run_dir)
    files = snapshot(run_dir)
    figures = result.evaluate()
    assert figures == unprefixed(result.history)

    assert beatloop.evaluate(run_dir) == figures
    assert beatloop.evaluate(str(run_dir), steps_per_execution=5) == pytest.approx(
        figures, rel=1e-6, abs=0
    )
    _, validation = small_digits
    other = tuple_batches(validation, 25)
    from_dir = beatloop.evaluate(run_dir, other)
    assert from_dir == result.evaluate(tuple_batches(validation, 25))
    assert from_dir == pytest.approx(by_hand(result.models["model"], validation), rel=1e-5)
    assert from_dir != figures

    assert main(["evaluate", str(run_dir)]) == 0
    lines = capsys.readouterr().out.split("\n")
    printed = dict(line.split() for line in lines if line.strip())
    assert printed == shown(figures)  # as `run` prints figures: 4 significant digits
    assert snapshot(run_dir) == files  # nothing written by any of them


def test_a_run_on_its_own_data_evaluates_on_data_like_it(supervised_run, small_digits):
    result, run_dir = supervised_run
    _, validation = small_digits
    files = snapshot(run_dir)
    data = tuple_batches(validation, 30)
    assert beatloop.evaluate(run_dir, data) == result.evaluate(data)
    assert snapshot(run_dir) == files


def test_a_run_on_other_batches_than_the_built_in_data_needs_data(small_digits, tmp_path):
    train, validation = small_digits
    run_dir = tmp_path / "weighted"
    weights = np.linspace(0.5, 1.5, 200).astype(np.float32)
    data = dict_batches(train, 50, sample_weight=weights)
    result = beatloop.fit("supervised", data=data, epochs=1, seed=0, run_dir=run_dir)
    with pytest.raises(beatloop.DataError, match=r"other batches .*'sample_weight'.*pass data="):
        beatloop.evaluate(run_dir)
    rows = dict_batches(validation, 30, sample_weight=np.ones(100, np.float32))
    figures = beatloop.evaluate(run_dir, rows)
    assert figures == result.evaluate(rows)
    assert figures == pytest.approx(by_hand(result.models["model"], validation), rel=1e-5)


def test_bad_evaluation_data_is_a_data_error(supervised_run, small_digits):
    result, run_dir = supervised_run
    train, _ = small_digits
    with pytest.raises(beatloop.DataError, match=r"evaluation batches with keys .*missing \['y'\]"):
        result.evaluate(dict_batches({"x": train["x"]}, 50))
    with pytest.raises(beatloop.DataError, match=r"evaluation batch 'x' is .* but training batch"):
        result.evaluate(tuple_batches({"x": train["x"][:, :10], "y": train["y"]}, 50))
    unbatched = tf.data.Dataset.from_tensor_slices((train["x"], train["y"]))
    with pytest.raises(beatloop.DataError, match=r"is the data set batched\?"):
        result.evaluate(unbatched)
    with pytest.raises(beatloop.DataError, match=r"must be a tf\.data\.Dataset"):
        result.evaluate((train["x"], train["y"]))
    with pytest.raises(beatloop.DataError, match="evaluation data set is empty"):
        result.evaluate(tuple_batches(train, 50).take(0))
    with pytest.raises(beatloop.DataError, match="evaluation data set repeats forever"):
        result.evaluate(tuple_batches(train, 50).repeat())
    with pytest.raises(beatloop.DataError, match=r"evaluation batches with keys .*missing \['y'\]"):
        beatloop.evaluate(run_dir, dict_batches({"x": train["x"]}, 50))
    with pytest.raises(beatloop.ConfigError, match="steps_per_execution"):
        result.evaluate(steps_per_execution=0)


def test_a_run_without_validation_data_asks_for_data(small_digits):
    train, _ = small_digits
    result = beatloop.fit("supervised", data=tuple_batches(train, 50), epochs=1, seed=0)
    with pytest.raises(beatloop.DataError, match="no validation data to evaluate on: pass data="):
        result.evaluate()
    assert result.evaluate(tuple_batches(train, 50)) == pytest.approx(
        by_hand(result.models["model"], train), rel=1e-5
    )


def test_evaluate_and_restore_of_a_missing_or_file_path_say_so_in_python(tmp_path):
    missing = tmp_path / "nope"
    for call, verb in ((beatloop.evaluate, "evaluate"), (beatloop.restore, "restore")):
        with pytest.raises(beatloop.RunDirError) as refused:
            call(missing)
        assert str(refused.value) == (
            f"the run dir {missing} does not exist: give the run dir a run wrote "
            f"(fit's run_dir=) to {verb}"
        )
        assert refused.value.exit_code == 5
    (tmp_path / "notes").write_text("a file")
    with pytest.raises(beatloop.RunDirError, match="notes is a file, not a folder: give the"):
        beatloop.restore(tmp_path / "notes")
    assert not missing.exists() and (tmp_path / "notes").read_text() == "a file"


def test_a_run_dir_without_checkpoint_is_a_checkpoint_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(beatloop.CheckpointError, match="holds no readable checkpoint to evaluate"):
        beatloop.evaluate(tmp_path / "empty")
    assert main(["evaluate", str(tmp_path / "empty")]) == 5
    assert "holds no readable checkpoint to evaluate" in capsys.readouterr().err
    assert list((tmp_path / "empty").iterdir()) == []


def test_the_evaluate_pages_block_runs(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "mkdtemp", lambda: str(tmp_path))  # the block's run dir
    page = Path(__file__).parent.parent / "docs" / "evaluate.md"
    (block,) = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    exec(compile(block, str(page), "exec"), {})
    assert capsys.readouterr().out == "['accuracy', 'loss']\n"


def test_a_recipe_without_built_in_data_evaluates_on_the_data_given(
    small_digits, tmp_path, monkeypatch
):
    from beatloop.plugins import registry as registry_module

    class Unbundled(beatloop.get_recipe("supervised")):
        """Supervised, without built-in data (test recipe)."""

        name = "unbundled_test"
        default_data = beatloop.Recipe.default_data

    registry = registry_module.Registry(load_entry_points=False)
    registry.register(Unbundled)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    train, validation = small_digits
    run_dir = tmp_path / "run"
    result = beatloop.fit(
        "unbundled_test", data=tuple_batches(train, 50), epochs=1, seed=0, run_dir=run_dir
    )
    with pytest.raises(beatloop.DataError, match=r"'unbundled_test' has no built-in data .*data="):
        beatloop.evaluate(run_dir)
    rows = tuple_batches(validation, 40)
    assert beatloop.evaluate(run_dir, rows) == result.evaluate(rows)
    assert result.evaluate(rows) == pytest.approx(
        by_hand(result.models["model"], validation), rel=1e-5
    )


# --- a run trained on --data: evaluated on its recorded source's validation data --------


@pytest.fixture(scope="module")
def digit_pngs(tmp_path_factory, small_digits):
    """40 of the digits as 8x8 grayscale PNGs, one subfolder per class."""
    train, _ = small_digits
    folder = tmp_path_factory.mktemp("pngs") / "images"
    for index, (x, y) in enumerate(zip(train["x"][:40], train["y"][:40], strict=True)):
        (folder / str(y)).mkdir(parents=True, exist_ok=True)
        pixels = np.round(x.reshape(8, 8) * 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / str(y) / f"{index:02d}.png")
    return folder


def cli(argv, capsys) -> tuple[int, str, str]:
    """``beatloop ARGV`` in this process, its warnings shown as a user's terminal shows
    them: the exit code, stdout and stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def last_val_figures(run_dir) -> dict[str, float]:
    """The last epoch's ``val_`` figures in the run's history.jsonl, without the prefix."""
    return {
        name.removeprefix("val_"): value
        for name, value in history_records(run_dir)[-1].items()
        if name.startswith("val_")
    }


def printed_figures(out: str) -> dict[str, str]:
    return dict(line.split() for line in out.splitlines())


def shown(figures: dict[str, float]) -> dict[str, str]:
    """``figures`` as ``beatloop evaluate`` prints them (as ``run`` does)."""
    from beatloop.callbacks.standard import format_figure

    return {name: format_figure(value) for name, value in figures.items()}


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory, digit_pngs):
    """A gan run dir trained with ``--data folder:`` (size and colour mode inferred), a
    quarter of the images held out for validation."""
    run_dir = tmp_path_factory.mktemp("folder_run") / "run"
    argv = ["run", "gan", "--data", f"folder:{digit_pngs}", "--data-set",
            "validation_fraction=0.25", "--data-set", "batch_size=10", "--epochs", "2",
            "--seed", "0", "--quiet", "--run-dir", str(run_dir)]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(argv) == 0
    return run_dir


def test_a_folder_run_evaluates_on_its_recorded_validation_split(folder_run, digit_pngs, capsys):
    """``beatloop run gan --data folder:imgs; beatloop evaluate RUN_DIR``: the figures are
    the run's last val_ figures, exactly, from the command line and from Python."""
    expected = last_val_figures(folder_run)
    assert set(expected) == {"d_loss", "g_loss", "d_real", "d_fake"}
    files = snapshot(folder_run)
    code, out, err = cli(["evaluate", folder_run], capsys)
    assert code == 0, err
    assert printed_figures(out) == shown(expected)
    assert err == (
        f"beatloop: warning: data source 'folder:{digit_pngs}': images are 8x8 grayscale "
        "(inferred: image_size=8,8, color_mode=grayscale; set them with --data-set to change)\n"
    )
    with pytest.warns(beatloop.InferredSettingWarning, match="images are 8x8 grayscale"):
        assert beatloop.evaluate(folder_run) == expected
    assert snapshot(folder_run) == files  # nothing written


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    """A supervised run dir trained with ``--data csv:`` and ``--validation-data csv:``
    (16 features: not the built-in digits' batches)."""
    folder = tmp_path_factory.mktemp("csv_run")
    rng = np.random.default_rng(0)
    for name, rows in (("train.csv", 60), ("valid.csv", 25)):
        lines = [",".join([*(f"f{i}" for i in range(16)), "label"])]
        lines += [
            ",".join([*(f"{v:.4f}" for v in rng.uniform(size=16)), str(i % 3)]) for i in range(rows)
        ]
        (folder / name).write_text("\n".join(lines) + "\n")
    argv = ["run", "supervised", "--data", f"csv:{folder / 'train.csv'}", "--validation-data",
            f"csv:{folder / 'valid.csv'}", "--data-set", "label=label", "--set", "hidden=4",
            "--set", "batch_size=16", "--epochs", "2", "--seed", "0", "--quiet", "--run-dir",
            str(folder / "run")]  # fmt: skip
    assert main(argv) == 0
    return folder / "run"


def test_a_csv_run_evaluates_on_its_recorded_validation_data(csv_run, capsys):
    expected = last_val_figures(csv_run)
    assert set(expected) == {"loss", "accuracy"}
    code, out, err = cli(["evaluate", csv_run], capsys)
    assert code == 0 and err == "", err
    assert printed_figures(out) == shown(expected)
    assert beatloop.evaluate(csv_run) == expected
    assert beatloop.evaluate(csv_run, steps_per_execution=2) == pytest.approx(
        expected, rel=1e-6, abs=0
    )


def rewritten(run_dir, tmp_path, **source) -> Path:
    """A copy of ``run_dir`` whose run.json records the data source changed by ``source``."""
    copy = shutil.copytree(run_dir, tmp_path / f"copy{len(list(tmp_path.glob('copy*')))}")
    recorded = json.loads((copy / "run.json").read_text())
    recorded["data_source"].update(source)
    (copy / "run.json").write_text(json.dumps(recorded))
    return copy


def test_a_recorded_source_that_cannot_be_read_or_no_longer_fits_is_a_data_error(
    folder_run, digit_pngs, tmp_path, capsys
):
    gone = tmp_path / "images"
    shutil.copytree(digit_pngs, gone)
    run_dir = rewritten(folder_run, tmp_path, data=f"folder:{gone}")
    shutil.rmtree(gone)  # the images moved since the run
    start = (
        f"{run_dir / 'run.json'} records that the run trained on --data folder:{gone}, which "
        f"cannot be read now: data source 'folder:{gone}': there is no folder '{gone}'; name "
        "its data as it is now with --data KIND:PATH"
    )
    with pytest.raises(beatloop.DataError) as raised:
        beatloop.evaluate(run_dir)
    assert str(raised.value) == start + " (and --data-set NAME=VALUE; data= in Python)"
    code, out, err = cli(["evaluate", run_dir], capsys)
    assert (code, out) == (3, "") and err == f"beatloop: error: {raised.value}\n"
    # Images of another size where the run's were: the batches no longer fit the run.
    (tmp_path / "big" / "3").mkdir(parents=True)  # one class: x and y, as the run had
    for index in range(8):
        pixels = np.full((16, 16), index * 30, np.uint8)
        Image.fromarray(pixels).save(tmp_path / "big" / "3" / f"{index}.png")
    run_dir = rewritten(run_dir, tmp_path, data=f"folder:{tmp_path / 'big'}")
    with pytest.raises(beatloop.DataError) as raised, pytest.warns(beatloop.InferredSettingWarning):
        beatloop.evaluate(run_dir)
    assert str(raised.value) == (
        f"{run_dir / 'run.json'} records that the run trained on --data folder:"
        f"{tmp_path / 'big'}, which now gives other batches ('x' is TensorSpec(shape=(None, "
        "8, 8, 1), dtype=tf.float32, name=None) in the run, TensorSpec(shape=(None, 16, 16, "
        "1), dtype=tf.float32, name=None) now): pass data= (a batched tf.data.Dataset like "
        "its training data)"
    )


def test_a_recorded_source_without_validation_data_asks_for_data(csv_run, tmp_path, capsys):
    run_dir = rewritten(csv_run, tmp_path, validation_data=None)
    recorded = json.loads((run_dir / "run.json").read_text())["data_source"]["data"]
    words = (
        f"{run_dir / 'run.json'} records that the run trained on --data {recorded}, which "
        "holds out no validation data to evaluate on (it was given no validation_fraction "
        "and no --validation-data): pass "
    )
    with pytest.raises(beatloop.DataError) as raised:
        beatloop.evaluate(run_dir)
    assert str(raised.value) == words + ("data= (a batched tf.data.Dataset like its training data)")
    code, _, err = cli(["evaluate", run_dir], capsys)
    assert code == 3
    assert err == f"beatloop: error: {words}--data KIND:PATH (data= in Python)\n"
    # Named anew, the data is evaluated whole.
    valid = csv_run.parent / "valid.csv"
    code, out, err = cli(["evaluate", run_dir, "--data", f"csv:{valid}", "--data-set",
                          "label=label"], capsys)  # fmt: skip
    assert code == 0, err
    assert printed_figures(out) == shown(last_val_figures(csv_run))
