"""Bad input reads as a sentence naming what was expected and found, never a
TensorFlow traceback."""

import ctypes
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import attrs
import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import classifier, tuple_batches

import beatloop
from beatloop import ConfigError, DataError
from beatloop.terminal import START_UP_NOISE


def test_unknown_config_field_names_the_closest():
    with pytest.raises(ConfigError, match=r"no config field 'hiden' \(did you mean 'hidden'\?\)"):
        beatloop.fit("supervised", config={"hiden": 8})


def test_several_unknown_config_fields_list_the_fields_once():
    from beatloop.recipes.supervised import Supervised

    with pytest.raises(ConfigError) as caught:
        beatloop.fit("supervised", config={"hiden": 1, "lerning_rate": 0.1, "epochz": 2})
    message = str(caught.value)
    for wrong in ("'hiden'", "'lerning_rate'", "'epochz'"):
        assert f"no config field {wrong}" in message
    fields = [field.name for field in attrs.fields(Supervised.Config)]
    assert message.count("fields: ") == 1 and message.endswith(", ".join(fields))


@pytest.mark.parametrize(
    "config, message",
    [
        ({"hidden": "128"}, "'hidden' expects int, got str '128'"),
        ({"hidden": 1.5}, "'hidden' expects int, got float"),
        ({"hidden": True}, "'hidden' expects int, got bool"),
        ({"hidden": 0}, "hidden"),
        ({"optimizer": "adamax"}, "'optimizer' expects 'adam' | 'adamw' | 'sgd' | 'rmsprop'"),
        ({"learning_rate": -1.0}, "learning_rate"),
    ],
)
def test_config_values_are_checked(config, message):
    with pytest.raises(ConfigError, match=message.replace("|", r"\|")):
        beatloop.make_recipe("supervised", config)


def test_ints_widen_to_float_fields():
    recipe = beatloop.make_recipe("supervised", {"learning_rate": 1})
    assert recipe.config.learning_rate == 1.0 and isinstance(recipe.config.learning_rate, float)


@pytest.mark.parametrize("epochs", [0, -2, 1.5, "3", True])
def test_epochs_must_be_a_positive_integer(epochs):
    with pytest.raises(ConfigError, match="epochs must be an integer >= 1"):
        beatloop.fit("supervised", epochs=epochs)


def test_steps_per_execution_must_be_positive():
    with pytest.raises(ConfigError, match="steps_per_execution"):
        beatloop.fit("supervised", steps_per_execution=0)


def test_wrong_batch_keys(small_digits):
    train, _ = small_digits
    data = tf.data.Dataset.from_tensor_slices({"image": train["x"], "label": train["y"]}).batch(8)
    with pytest.raises(
        DataError, match=r"expects training batches with keys \['x', 'y'\].*\['image', 'label'\]"
    ):
        beatloop.fit("supervised", data=data)


def test_unbatched_data_is_recognised(small_digits):
    train, _ = small_digits
    data = tf.data.Dataset.from_tensor_slices((train["x"], train["y"]))
    with pytest.raises(DataError, match=r"'y' with at least 1 dimension.*Call \.batch\(n\)"):
        beatloop.fit("supervised", data=data)


def test_empty_data_set():
    data = tf.data.Dataset.from_tensor_slices(
        (np.zeros((0, 64), np.float32), np.zeros(0, np.int32))
    )
    with pytest.raises(DataError, match="training data set is empty"):
        beatloop.fit("supervised", data=data.batch(8))


def test_data_that_empties_at_run_time(small_digits):
    train, _ = small_digits
    data = tuple_batches(train, 8).filter(lambda x, y: tf.reduce_all(y > 100))  # length unknown
    with pytest.raises(DataError, match="gave no batches in epoch 0"):
        beatloop.fit("supervised", data=data)


def test_model_that_does_not_fit_the_data(small_digits):
    train, _ = small_digits
    wrong = keras.Sequential([keras.Input((32,)), keras.layers.Dense(10)])
    with pytest.raises(DataError) as caught:
        beatloop.fit("supervised", data=tuple_batches(train, 8), models={"model": wrong})
    message = str(caught.value)
    # found before the first step, from the model's declared input: no Keras text
    assert message.startswith(
        "recipe 'supervised': model 'model' expects input 0 of shape (None, 32) float32, "
        "but the training data gives (None, 64) float32 (batch key 'x') — called from "
    )
    assert "supervised.py:" in message  # the line of the loss that called the model
    assert "\x1b" not in message and "Arguments received" not in message


def test_unknown_part_names_are_refused(small_digits):
    train, _ = small_digits
    with pytest.raises(ConfigError, match=r"no model named 'modle' \(did you mean 'model'\?\)"):
        beatloop.fit("supervised", data=tuple_batches(train, 8), models={"modle": classifier()})
    with pytest.raises(ConfigError, match=r"optimizer .optimizer. must be a keras"):
        beatloop.fit("supervised", data=tuple_batches(train, 8), optimizers={"optimizer": "adam"})


def test_data_that_is_not_a_dataset(small_digits):
    train, _ = small_digits
    with pytest.raises(DataError, match=r"the training entry is ndarray.*from_tensor_slices"):
        beatloop.fit("supervised", data=(train["x"], train["y"]))


def test_validation_shape_must_match_training(small_digits):
    train, validation = small_digits
    narrow = tf.data.Dataset.from_tensor_slices((validation["x"][:, :32], validation["y"])).batch(8)
    with pytest.raises(DataError, match="validation batch 'x'"):
        beatloop.fit("supervised", data=(tuple_batches(train, 8), narrow))


def test_endless_data_needs_steps_per_epoch(small_digits):
    train, _ = small_digits
    endless = tuple_batches(train, 50).repeat()
    with pytest.raises(DataError, match=r"repeats forever.*steps_per_epoch"):
        beatloop.fit("supervised", data=endless)
    result = beatloop.fit("supervised", data=endless, steps_per_epoch=3, epochs=3, seed=0)
    assert result.steps == 9 and len(result.history["loss"]) == 3


def test_label_out_of_range_is_a_data_error(small_digits):
    train, _ = small_digits
    labels = train["y"].copy()
    labels[5] = 12  # the default model has 10 classes
    data = tf.data.Dataset.from_tensor_slices((train["x"], labels)).batch(50)
    # TensorFlow words it differently once op determinism is on (any seeded fit before);
    # the message is beatloop's either way (tests/test_mismatch.py tries both).
    message = (
        "recipe 'supervised': the training data has label 12 in 'y', outside [0, 10) — the "
        "config field classes is 10; fix the labels or set classes (--set classes=13)"
    )
    with pytest.raises(DataError) as caught:
        beatloop.fit("supervised", data=data)
    assert str(caught.value) == message


def test_label_advice_covers_the_whole_data_so_following_it_trains(small_digits):
    """The first bad batch holds label 3, later ones 7 and 8: the advice names classes=9
    (the whole data's largest label + 1), and that setting then trains."""
    train, _ = small_digits
    labels = train["y"].copy() % 3
    labels[[5, 70, 160]] = [3, 7, 8]  # batches 1, 2 and 4 of 50
    data = tf.data.Dataset.from_tensor_slices((train["x"], labels)).batch(50)
    with pytest.raises(DataError) as caught:
        beatloop.fit("supervised", data=data, config={"classes": 3}, steps_per_execution=1)
    assert "has label 3 in 'y', outside [0, 3)" in str(caught.value)
    assert str(caught.value).endswith("(--set classes=9)")
    result = beatloop.fit("supervised", data=data, config={"classes": 9}, seed=0)
    assert result.steps == -(-len(labels) // 50)


def test_tuple_fields_read_from_the_command_line():
    from beatloop.core.schedule.config import parse_settings, type_name
    from beatloop.recipes.multitask import MultitaskConfig

    settings = parse_settings(["tasks=digit, ink", "weights=1,0.5"], MultitaskConfig, "multitask")
    assert settings == {"tasks": ("digit", "ink"), "weights": (1.0, 0.5)}
    assert type_name(tuple[str, ...]) == "tuple[str, ...]"


# --- the command line: every failure one line, its exit code, the run dir untouched ----


def snapshot(path: Path) -> dict | None:
    """Every file and folder under ``path`` with its bytes (``None``: ``path`` is absent)."""
    path = Path(path)
    if not path.exists():
        return None
    if path.is_file():
        return {".": path.read_bytes()}
    return {
        str(p.relative_to(path)): (p.read_bytes() if p.is_file() else "folder")
        for p in sorted(path.rglob("*"))
    }


TINY = ["--set", "hidden=8", "--set", "batch_size=256", "--seed", "0", "--quiet"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished one-epoch supervised run dir (copy it before changing it)."""
    from beatloop.cli import main

    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert main(["run", "supervised", "--epochs", "1", "--run-dir", str(run_dir), *TINY]) == 0
    return run_dir


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


def cli(argv, capsys) -> tuple[int, str, str]:
    """``beatloop ARGV`` in this process: exit code, stdout, stderr."""
    from beatloop.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(err: str, fragment: str) -> None:
    assert err.startswith("beatloop: error: ") and fragment in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "argv, code, fragment",
    [
        (["run", "supervized"], 2, "no recipe named 'supervized'"),
        (["run", "supervised", "--set", "hidden=wide"], 2, "'hidden' expects int, got str"),
        (["run", "supervised", "--set", "colour=red"], 2, "no config field 'colour'"),
        (["run", "supervised", "--epochs", "0"], 2, "epochs must be an integer >= 1"),
        (["run", "supervised", "--model", "teacher"], 2, "--model expects NAME=PATH.keras"),
        (["run", "supervised", "--strategy", "multi_worker"], 2, "needs the environment variable"),
    ],
)
def test_usage_errors_exit_2(argv, code, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    run_dir = tmp_path / "run"
    got, _, err = cli([*argv, "--run-dir", run_dir], capsys)
    assert got == code
    assert_one_error_line(err, fragment)
    assert snapshot(run_dir) is None  # nothing was created


def test_multi_worker_names_a_bad_tf_config(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
    code, _, err = cli(["run", "supervised", "--strategy", "multi_worker"], capsys)
    assert code == 2
    assert_one_error_line(err, "TF_CONFIG must name the cluster's workers")


def test_a_file_as_the_run_dir_exits_5_and_is_untouched(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("notes")
    for run_dir in (afile, afile / "sub"):
        code, _, err = cli(["run", "supervised", "--run-dir", run_dir, *TINY], capsys)
        assert code == 5
        assert_one_error_line(err, f"{afile} is a file, not a folder")
        assert afile.read_text() == "notes"


def test_resume_with_another_config_exits_5_and_changes_nothing(trained_run, tmp_path, capsys):
    run_dir = copy_of(trained_run, tmp_path)
    before = snapshot(run_dir)
    argv = ["run", "supervised", "--epochs", "2", "--run-dir", run_dir, *TINY, "--set", "hidden=9"]
    code, _, err = cli(argv, capsys)
    assert code == 5
    assert_one_error_line(err, "config.hidden is 8 in the checkpoint but 9 now")
    assert snapshot(run_dir) == before


def test_data_that_does_not_fit_the_model_exits_3_and_changes_nothing(tmp_path, capsys):
    narrow = keras.Sequential([keras.Input((32,)), keras.layers.Dense(10)])
    narrow.save(tmp_path / "narrow.keras")
    run_dir = tmp_path / "run"
    argv = ["run", "supervised", "--model", f"model={tmp_path / 'narrow.keras'}"]
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # as a user's terminal shows them
        code, _, err = cli([*argv, "--run-dir", run_dir, *TINY], capsys)
    assert code == 3, err
    warned, error = err.strip().splitlines()
    assert warned.startswith("beatloop: warning: config hidden=8 (--set hidden=...) has no ")
    assert error.startswith("beatloop: error: ") and "Traceback" not in err
    assert "(None, 32)" in err and "(None, 64)" in err and "model 'model'" in err
    assert snapshot(run_dir) is None


def test_a_corrupt_latest_checkpoint_is_one_warning_line(trained_run, tmp_path, capsys):
    run_dir = copy_of(trained_run, tmp_path)
    latest = max((run_dir / "checkpoints").glob("ckpt-*.index"), key=lambda p: p.stat().st_mtime)
    data = next((run_dir / "checkpoints").glob(f"{latest.stem}.data-*"))
    data.write_bytes(b"garbage")
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # as a user's terminal shows them
        code, out, err = cli(
            ["run", "supervised", "--epochs", "2", "--run-dir", run_dir, *TINY], capsys
        )
    assert code == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("beatloop: warning: checkpoint "), err
    assert "could not be read" in lines[0] and "RuntimeWarning" not in err
    assert out.startswith("resumed from ckpt-1 (step 0, before epoch 1)")


def test_resume_is_announced_before_training(trained_run, tmp_path, capsys):
    run_dir = copy_of(trained_run, tmp_path)
    code, out, _ = cli(["run", "supervised", "--epochs", "2", "--run-dir", run_dir, *TINY], capsys)
    assert code == 0
    first, *rest = out.splitlines()
    assert first.startswith("resumed from ckpt-2 (step 6, end of epoch 1)"), out
    assert rest[0].startswith("supervised: 2 epoch(s), 12 steps")


def test_a_deleted_checkpoint_index_is_rebuilt_and_max_to_keep_holds(trained_run, tmp_path, capsys):
    run_dir = copy_of(trained_run, tmp_path)
    (run_dir / "checkpoints" / "checkpoint").unlink()
    argv = ["run", "supervised", "--epochs", "4", "--run-dir", run_dir, "--max-to-keep", "2"]
    code, out, err = cli([*argv, *TINY], capsys)
    assert code == 0, err
    assert out.startswith("resumed from ckpt-2 (step 6, end of epoch 1)")
    kept = sorted(p.stem for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    assert kept == ["ckpt-4", "ckpt-5"]
    index = (run_dir / "checkpoints" / "checkpoint").read_text()
    assert 'model_checkpoint_path: "ckpt-5"' in index and "ckpt-2" not in index


def test_an_unexpected_error_exits_1_with_its_traceback(capsys, monkeypatch):
    import beatloop.cli.cmd_list

    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(beatloop.cli.cmd_list, "run", broken)
    code, _, err = cli(["list"], capsys)
    assert code == 1
    assert "Traceback" in err and "ZeroDivisionError: a bug" in err
    assert "please report it" in err


def test_help_shows_every_default_and_the_exit_codes(capsys):
    from beatloop.cli import main

    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    shown = [
        ("--epochs", "1"),
        ("--max-to-keep", "3"),
        ("--on-nan", "raise"),
        ("--run-dir", "runs/RECIPE"),
        ("--divergence", "off"),
    ]
    for option, default in shown:
        assert re.search(rf"{option} .*?\(default: {re.escape(default)}", text), option
    assert "exit codes:" in text and "130 interrupted" in text and "3 a data error" in text
    from beatloop.cli import _parser

    run = _parser()._subparsers._group_actions[0].choices["run"]
    for action in run._actions:  # every option that takes a value says its default
        if action.option_strings and action.nargs != 0 and action.default != []:
            assert "default: " in run.formatter_class("beatloop")._get_help_string(action), (
                action.option_strings
            )


# --- file-system failures: a process without root's override of file permissions ------


def _without_file_permission_override():
    """In the child, before it starts: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from
    the capability bounding set, so root obeys file modes as any user does."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def beatloop_command(*args, cwd) -> subprocess.CompletedProcess:
    """The ``beatloop`` console script, as a user without root's override runs it."""
    script = Path(sys.executable).parent / "beatloop"
    return subprocess.run(
        [str(script), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"},
        preexec_fn=_without_file_permission_override if os.geteuid() == 0 else None,
    )


def read_only(path: Path) -> None:
    for item in [path, *path.rglob("*")]:
        item.chmod(0o555 if item.is_dir() else 0o444)


@pytest.mark.slow
def test_read_only_run_dirs_exit_5_and_are_untouched(trained_run, tmp_path):
    run_dir = copy_of(trained_run, tmp_path)
    parent = tmp_path / "locked"
    parent.mkdir()
    read_only(run_dir)
    read_only(parent)
    try:
        before = snapshot(run_dir)
        done = beatloop_command("run", "supervised", "--epochs", "2", "--run-dir", run_dir, *TINY,
                                cwd=tmp_path)  # fmt: skip
        assert done.returncode == 5, done.stderr
        assert_one_error_line(done.stderr, f"the run dir {run_dir} is not writable")
        assert snapshot(run_dir) == before
        done = beatloop_command("run", "supervised", "--run-dir", parent / "new", *TINY,
                                cwd=tmp_path)  # fmt: skip
        assert done.returncode == 5, done.stderr
        assert_one_error_line(done.stderr, f"its parent {parent} is not writable")
        assert snapshot(parent) == {}
    finally:
        for item in [run_dir, *run_dir.rglob("*"), parent]:
            item.chmod(0o755)


@pytest.mark.slow
def test_a_run_prints_only_beatloop_lines(tmp_path):
    done = beatloop_command("run", "supervised", "--epochs", "1", "--run-dir", tmp_path / "r",
                            *TINY, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no TensorFlow banner, no absl line, no warning
    lines = done.stdout.splitlines()
    assert lines[0].startswith("supervised: 1 epoch(s)") and lines[1].startswith("steps per call: ")
    assert lines[2].startswith("run dir: ")
    # TensorFlow's start-up lines, asked for: those this CPU's TensorFlow prints (the oneDNN
    # banner only where oneDNN is on), as a plain import in the command's environment shows.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    plain = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True,
                           text=True, env=env, timeout=300).stderr.splitlines()  # fmt: skip
    start_up = [line.split("] ", 1)[-1] for line in plain if START_UP_NOISE.search(line)]
    shown = beatloop_command("list", "--verbose", cwd=tmp_path)
    assert shown.returncode == 0 and all(line in shown.stderr for line in start_up), plain


def test_a_full_disk_names_the_file_and_the_reason(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "history.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    code, _, err = cli(["run", "supervised", "--run-dir", run_dir, *TINY], capsys)
    assert code == 5
    assert_one_error_line(err, f"could not write {run_dir / 'history.jsonl'}: the disk is full")
    assert "free some space and run the same command again to resume" in err
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.index")) == ["ckpt-1.index"]


def test_a_nan_exits_4_and_rollback_warnings_are_one_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    nan = ["run", "supervised", "--set", "learning_rate=1e20", "--run-dir", run_dir, *TINY]
    code, _, err = cli(nan, capsys)
    assert code == 4
    assert_one_error_line(err, "beat 'loss' produced a non-finite loss (nan) at step 2")
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # as a user's terminal shows them
        code, _, err = cli([*nan, "--on-nan", "rollback", "--max-rollbacks", "2"], capsys)
    assert code == 4
    *warned, error = err.strip().splitlines()
    assert len(warned) == 2, err
    for number, line in enumerate(warned, 1):
        assert line.startswith("beatloop: warning: beat 'loss' produced a non-finite loss")
        assert f"(rollback {number} of at most 2)" in line
    assert error.startswith("beatloop: error: ") and "already rolled back 2 time(s)" in error
    assert "RuntimeWarning" not in err and "Traceback" not in err


def test_divergence_exits_4_naming_the_beat_value_and_median(tmp_path, capsys):
    blown_up = ["run", "supervised", "--set", "learning_rate=1e9", *TINY]
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # as a user's terminal shows them
        code, out, err = cli([*blown_up, "--run-dir", tmp_path / "free"], capsys)
    assert code == 0  # without the guard the run goes on with a blown-up loss, but says so
    assert float(re.search(r" loss (\S+)", out).group(1)) > 1e6
    (warned,) = err.strip().splitlines()
    assert warned.startswith("beatloop: warning: the loss of beat 'loss' ran away in epoch 1: ")
    assert "pass divergence=10 (--divergence 10) to stop a run whose loss runs away" in warned
    guarded = [*blown_up, "--run-dir", tmp_path / "guarded", "--divergence", "10"]
    code, _, err = cli(guarded, capsys)
    assert code == 4
    assert_one_error_line(err, "beat 'loss' diverged: loss ")
    assert "above 10 times its running median" in err and "at step 2 (epoch 1)" in err


# --- the Python API: the error's type, its words, and a run dir left as it was --------


def _with_label(arrays, label):
    labels = arrays["y"].copy()
    labels[3] = label
    return tf.data.Dataset.from_tensor_slices((arrays["x"], labels)).batch(50)


API_CASES = {
    "label 15": (lambda t: {"data": _with_label(t, 15)}, DataError, "has label 15 in 'y'"),
    "label -1": (lambda t: {"data": _with_label(t, -1)}, DataError, "has label -1 in 'y'"),
    "narrow model": (
        lambda t: {
            "data": tuple_batches(t, 50),
            "models": {"model": keras.Sequential([keras.Input((32,)), keras.layers.Dense(10)])},
        },
        DataError,
        "model 'model' expects input 0 of shape (None, 32) float32, but the training data "
        "gives (None, 64) float32",
    ),
    "unbatched": (
        lambda t: {"data": tf.data.Dataset.from_tensor_slices((t["x"], t["y"]))},
        DataError,
        "Call .batch(n)",
    ),
    "missing keys": (
        lambda t: {"data": tf.data.Dataset.from_tensor_slices({"image": t["x"]}).batch(8)},
        DataError,
        "expects training batches with keys ['x', 'y']",
    ),
    "a NaN": (
        lambda t: {"data": tuple_batches(t, 50), "config": {"learning_rate": 1e20}},
        beatloop.NumericsError,
        "beat 'loss' produced a non-finite loss (nan) at step 2",
    ),
}


@pytest.mark.parametrize("case", list(API_CASES))
def test_api_failures_name_their_cause_and_leave_the_run_dir(case, small_digits, tmp_path):
    arguments, error_type, fragment = API_CASES[case]
    run_dir = tmp_path / "run"
    with pytest.raises(error_type) as caught:
        beatloop.fit("supervised", seed=0, run_dir=run_dir, **arguments(small_digits[0]))
    assert fragment in str(caught.value)
    assert error_type is beatloop.NumericsError or snapshot(run_dir) is None


def test_a_recipe_without_metrics_trains_without_autograph_warnings(small_digits, caplog):
    class NoMetrics(beatloop.Recipe):
        """A recipe that defines no metrics: the base update_metrics runs."""

        name = "no_metrics_test"
        batch_keys = {"x": 2}

        def build_optimizers(self):
            return {"sgd": keras.optimizers.SGD(1e-4)}

        def losses(self):
            return {"square": lambda models, batch: tf.reduce_mean(models["m"](batch["x"]) ** 2)}

        def schedule(self):
            return beatloop.Schedule(beatloop.Beat(loss="square", optimizer="sgd", updates="m"))

    data = tf.data.Dataset.from_tensor_slices({"x": small_digits[0]["x"]}).batch(50)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1)])
    with caplog.at_level("WARNING", logger="tensorflow"):
        result = beatloop.fit(NoMetrics(), data=data, models={"m": model}, seed=0, epochs=2)
    assert result.history["square"][1] < result.history["square"][0]
    assert not [r for r in caplog.records if "AutoGraph" in r.getMessage()]


def test_a_resumed_run_failing_at_its_first_step_leaves_the_run_dir_as_it_was(
    small_digits, tmp_path
):
    run_dir = tmp_path / "run"
    beatloop.fit("supervised", data=tuple_batches(small_digits[0], 50), seed=0, run_dir=run_dir)
    before = snapshot(run_dir)
    with pytest.raises(DataError, match="has label 15 in 'y'"):
        bad = _with_label(small_digits[0], 15)
        beatloop.fit("supervised", data=bad, seed=0, run_dir=run_dir, epochs=2)
    assert snapshot(run_dir) == before  # run.json as it was, no checkpoint added
