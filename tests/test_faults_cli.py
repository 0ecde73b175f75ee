"""Issue 51's "unclear" cases in the command line, compare, history and the suite, each
now a clear message naming what was expected and what was found, with the right exit
code, and nothing the user had lost: a comparison with a failing entry, its progress
lines, `show`'s variables and quality figure, `list --verbose`'s quality figures,
`evaluate` of a missing path and its figures, history rows deleted or torn on a resume,
a quiet resume's result, and the suite's own checks (an empty folder left in the
checkout, beatloop's warnings pointing at the caller)."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import pytest
import tensorflow as tf
from conftest import _untracked_files
from helpers import history_records

import beatloop
from beatloop import compare as compare_module
from beatloop.callbacks.standard import JsonLinesLogger, format_figure
from beatloop.cli import main
from beatloop.compare import Entry, RunFailure
from beatloop.core.devices.workers import Worker

#: A learning rate that makes `supervised`'s loss NaN at its second step: a NumericsError.
DIVERGING = "learning_rate=1e30"
SMALL = "batch_size=256"  # 6 steps an epoch on the built-in digits


def in_process(monkeypatch) -> list[dict]:
    """Each compared run in this process, through what its own process would do
    (``compare.ran``: its figures, or its failure as the parent reads it); returns the
    specs run."""
    specs = []

    def run(spec, timeout):
        specs.append(spec)
        return compare_module._collected(spec, *compare_module.ran(dict(spec)), "")

    monkeypatch.setattr(compare_module, "_run_isolated", run)
    return specs


# --- 1 and 2. compare: the finished entries' table, then the failure with its own code ----


def test_compare_prints_the_finished_entries_then_the_failure_and_exits_with_its_code(
    tmp_path, monkeypatch, capsys
):
    in_process(monkeypatch)
    out = tmp_path / "cmp"
    argv = ["compare", "supervised", "--set", DIVERGING, "--set", SMALL, "supervised"]
    assert main([*argv, "--set", SMALL, "--epochs", "1", "--out", str(out)]) == 4  # numerics
    printed, err = capsys.readouterr()
    failed = f"supervised {DIVERGING} {SMALL}"
    failed_dir = out / "supervised-learning_rate_1e30-batch_size_256" / "seed0"
    lines = printed.splitlines()
    # What runs, which of all the runs it is, and where its run dir is.
    assert lines[:2] == [
        f"run 1/2: {failed}, seed 0, in {failed_dir} ...",
        f"run 2/2: supervised {SMALL}, seed 0, in {out / 'supervised-batch_size_256'}/seed0 ...",
    ]
    table = printed[printed.index("\nrun ") :]
    assert f"\nsupervised {SMALL} " in table and failed not in table
    assert f"figures: {out / 'compare.json'}\nloss curves: {out / 'loss_curves.png'}" in table
    # The failure in beatloop's one-line form: what failed, where, and why; no class path.
    (line,) = err.splitlines()
    assert line.startswith(
        f"beatloop: error: {failed} (seed 0, run dir {failed_dir}) failed: beat 'loss' produced "
        "a non-finite loss (nan) at step "
    )
    assert "NumericsError" not in err and "beatloop.core" not in err
    record = json.loads((out / "compare.json").read_text())
    assert [row["label"] for row in record["rows"]] == [f"supervised {SMALL}"]
    (recorded,) = record["failed"]
    assert (recorded["label"], recorded["seed"], recorded["exit_code"]) == (failed, 0, 4)
    assert (out / "loss_curves.png").is_file()


def test_several_failures_exit_with_the_first_entrys_code_and_end_only_their_entries(
    tmp_path, monkeypatch, capsys
):
    """Entry by entry in the order given: its first failure's code wins, whatever the
    others' (here 3 before 4 and 1); a failed entry's other seeds are not run."""
    codes = {"hidden=8": 3, "hidden=9": 4, "hidden=10": 1}
    run = []

    def fake(spec, timeout):
        run.append((spec["label"], spec["seed"]))
        code = codes[spec["settings"][0]]
        internal = {"internal": True, "detail": "Traceback ...\nKeyError: 'x'"} if code == 1 else {}
        message = "KeyError: 'x'" if code == 1 else f"failure {code}: pass data=..."
        return compare_module._failure(spec, {"message": message, "exit_code": code, **internal})

    monkeypatch.setattr(compare_module, "_run_isolated", fake)
    entries = [Entry("supervised", (setting,)) for setting in codes]
    with pytest.raises(compare_module.ComparisonFailed) as caught:
        compare_module.compare(entries, epochs=1, out=tmp_path, seeds=2, echo=lambda line: None)
    assert caught.value.exit_code == 3 and caught.value.rows == []
    assert run == [(f"supervised {setting}", 0) for setting in codes]  # no seed 1
    assert "loss_curves.png" not in {p.name for p in tmp_path.iterdir()}

    argv = ["compare", "supervised", "--set", "hidden=9", "supervised", "--set", "hidden=10"]
    assert main([*argv, "supervised", "--set", "hidden=8", "--out", str(tmp_path)]) == 4
    printed, err = capsys.readouterr()
    assert "loss curves" not in printed and f"figures: {tmp_path / 'compare.json'}" in printed
    lines = err.splitlines()
    assert lines[0] == (
        f"beatloop: error: supervised hidden=9 (seed 0, run dir "
        f"{tmp_path / 'supervised-hidden_9' / 'seed0'}) failed: failure 4: pass --data "
        "KIND:PATH (data= in Python)"
    )  # in the command line's words
    assert lines[1:3] == ["Traceback ...", "KeyError: 'x'"]  # a bug's: its traceback
    assert lines[3].startswith("beatloop: internal error: supervised hidden=10 (seed 0")
    assert lines[4].startswith("beatloop: this is a bug in beatloop")
    assert lines[5].startswith("beatloop: error: supervised hidden=8 (seed 0,")


@pytest.mark.slow
def test_compare_in_its_processes_reports_the_failure_without_its_class_path(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "supervised", "--set", DIVERGING, "--set", SMALL, "supervised"]
    argv += ["--set", SMALL, "--epochs", "1", "--jobs", "2", "--out", str(out)]
    assert main(argv) == 4
    printed, err = capsys.readouterr()
    assert f"\nsupervised {SMALL} " in printed
    (line,) = err.splitlines()
    assert line.startswith(f"beatloop: error: supervised {DIVERGING} {SMALL} (seed 0, run dir ")
    assert "failed: beat 'loss' produced a non-finite loss (nan)" in line
    assert "Error:" not in line  # no "beatloop.core.failures.errors.NumericsError: "


# --- 3 and 7. show and list: each variable once with its model; the quality figure ---------


def test_show_names_each_variable_once_with_its_model_and_the_quality_figure(capsys):
    assert main(["show", "ppo"]) == 0
    out = capsys.readouterr().out
    assert (
        "\nquality figure (tune's default objective, run --keep-best quality): "
        "greedy_return:max (higher is better)\n" in out
    )
    variables = out[out.index("variables each beat updates") :].splitlines()[2:]
    paths = [line.split()[0] for line in variables]
    assert len(paths) == 12 and len(set(paths)) == 12  # policy's and value's hidden_1/kernel
    assert {path.split("/")[0] for path in paths} == {"policy", "value"}
    assert "policy/hidden_1/kernel" in paths and "value/hidden_1/kernel" in paths


def test_list_verbose_prints_each_recipes_quality_figure_never_from_an_older_cache(
    monkeypatch, tmp_path, capsys
):
    import beatloop.plugins.registry as registry_module
    from beatloop import listing

    monkeypatch.setenv(listing.CACHE_DIR, str(tmp_path))
    monkeypatch.setattr(registry_module, "_REGISTRY", None)
    assert main(["list", "--verbose"]) == 0  # a miss: loaded, then cached
    computed = capsys.readouterr().out
    at = computed.index("\nsupervised ")
    assert "quality figure: val_accuracy:max (higher is better)" in computed[at:].splitlines()[3]
    assert computed.count("quality figure: ") == computed.count("    module: ")
    registry_module.reset_registry()
    assert main(["list", "--verbose"]) == 0  # a hit: the same, from the file
    assert capsys.readouterr().out == computed
    # A file of the former layout (its recipes without "quality") is a miss, never a
    # listing that would print no quality figures.
    (path,) = tmp_path.glob("list-*.json")
    data = json.loads(path.read_text())
    for recipe in data["listing"]["recipes"]:
        del recipe["quality"]
    path.write_text(json.dumps(data))
    assert listing.read_cache(data["key"]) is None
    assert data["key"]["format"] == listing.FORMAT == 2
    bare = listing.Listed("bare", "m", "Bare", "built-in", "p", "A recipe.", None)
    assert listing.Listing((bare,), (), (), ()).lines(True)[2] == (
        " " * 8
        + "quality figure: none declared (tune needs --objective, --keep-best a FIGURE:MODE)"
    )


# --- 4. evaluate: a path that does not exist; figures as `run` prints them -----------------


def test_evaluate_says_a_missing_run_dir_does_not_exist_and_prints_figures_as_run(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert main(["evaluate", str(missing)]) == 5  # as any run dir that cannot be used
    assert capsys.readouterr().err == (
        f"beatloop: error: the run dir {missing} does not exist: give the run dir a run wrote "
        "(beatloop run --run-dir) to evaluate\n"
    )
    (tmp_path / "notes").write_text("a file")
    assert main(["evaluate", str(tmp_path / "notes")]) == 5
    assert "notes is a file, not a folder: give the run dir" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()  # a folder without checkpoints says so, as before
    assert main(["evaluate", str(tmp_path / "empty")]) == 5
    assert "holds no readable checkpoint to evaluate" in capsys.readouterr().err

    run_dir = tmp_path / "run"
    beatloop.fit("supervised", config={"batch_size": 256, "hidden": 8}, epochs=1, seed=0,
                 run_dir=run_dir, progress=False)  # fmt: skip
    figures = beatloop.evaluate(run_dir)
    assert main(["evaluate", str(run_dir)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{name:<8}  {format_figure(value)}" for name, value in figures.items()
    ]
    assert format_figure(0.28055554) == "0.2806" and format_figure(2.1346778) == "2.135"


# --- 5. history rows deleted, or torn, on a resume ----------------------------------------


@pytest.fixture
def small_run(tmp_path, small_digits):
    """``fit(epochs)`` on 200 digits in batches of 100, in one run dir, the warnings it
    gives recorded (every one, as text)."""
    train, _ = small_digits
    data = (tf.data.Dataset.from_tensor_slices((train["x"], train["y"])).batch(100), None)
    run_dir = tmp_path / "run"

    def fit(epochs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = beatloop.fit("supervised", data=data, epochs=epochs, run_dir=run_dir,
                                  seed=1, progress=False)  # fmt: skip
        return result, [str(w.message) for w in caught]

    return run_dir, fit


def test_a_resume_writes_back_history_rows_deleted_and_a_deleted_history(small_run):
    run_dir, fit = small_run
    path = run_dir / "history.jsonl"
    fit(3)
    rows = path.read_bytes()
    path.write_bytes(rows.splitlines(keepends=True)[2])  # rows 1 and 2 deleted
    result, said = fit(4)
    assert said == [
        f"{path}: the rows of epochs 1-2 were missing (deleted, or the file cut short); they "
        "are written back from the checkpoint"
    ]
    assert path.read_bytes().startswith(rows)  # as first written, byte for byte
    assert [row["epoch"] for row in history_records(run_dir)] == [1, 2, 3, 4]
    assert result.history["loss"] == [row["loss"] for row in history_records(run_dir)]
    path.unlink()
    _, said = fit(5)
    assert said == [
        f"{path}: the file was missing (deleted, or moved); the rows of epochs 1-4 are written "
        "back from the checkpoint"
    ]
    assert [row["epoch"] for row in history_records(run_dir)] == [1, 2, 3, 4, 5]


def test_a_torn_row_with_nothing_to_train_is_named_once_and_agrees_nothing_is_written(
    tmp_path, capsys
):
    run_dir = tmp_path / "run"
    command = ["run", "supervised", "--set", "hidden=8", "--set", SMALL, "--seed", "0"]
    command += ["--quiet", "--run-dir", str(run_dir), "--epochs", "2"]
    assert main(command) == 0
    path = run_dir / "history.jsonl"
    rows = path.read_bytes()
    torn = rows[: rows.rindex(b"\n", 0, -1) + 20]  # epoch 2's row cut short
    path.write_bytes(torn)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # shown as the command shows them, one line each
        assert main(command) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert said == [
        f"beatloop: warning: the run dir {run_dir} holds 2 finished epoch(s) already, as many "
        "as epochs=2 asks for: nothing to train, nothing written (a higher --epochs trains it "
        f"further); {path} holds 1 torn line(s) (a run killed while writing them) and lacks "
        "epoch 2's row; a run with a higher --epochs (epochs=) drops the torn line(s) and "
        "writes epoch 2's row back from the checkpoint"
    ]
    assert path.read_bytes() == torn  # nothing written, as the line says
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*command[:-1], "3"]) == 0  # what the advice says
    assert path.read_bytes().startswith(rows)
    assert [row["epoch"] for row in history_records(run_dir)] == [1, 2, 3]


def test_a_checkpoint_that_kept_the_last_row_only_names_the_rows_it_cannot_write_back(tmp_path):
    """A checkpoint of an earlier version (``last_row`` only): the rows it lacks are named
    as not written back, once; those the file holds are kept from then on."""
    path = tmp_path / "history.jsonl"
    line = {e: json.dumps({"epoch": e, "step": e, "loss": 1.0 / e}) + "\n" for e in (1, 2, 3)}
    path.write_text(line[2])  # rows 1 and 3 deleted
    logger = JsonLinesLogger(path)
    logger.restore_state({"last_row": {"epoch": 3, "line": line[3]}})
    run = type("Run", (), {"run_dir": None, "resumed_from": "ckpt-3", "epoch": 3, "epochs": 4,
                           "worker": Worker()})()  # fmt: skip
    with pytest.warns(RuntimeWarning) as warned:
        logger.on_fit_start(run)
    assert [str(w.message) for w in warned] == [
        f"{path}: the rows of epochs 1, 3 were missing (deleted, or the file cut short); "
        "epoch 3's row is written back from the checkpoint, and epoch 1's row cannot be written "
        "back: the checkpoint, written by an earlier version of beatloop, keeps only the last "
        "row (epoch 3's), so the file goes on without it"
    ]
    assert path.read_text() == line[2] + line[3]
    assert logger.checkpoint_state()["rows"] == {"2": line[2], "3": line[3]}


# --- 6. a resumed fit without progress says where it resumed in its result ----------------


def test_a_quiet_resumed_fit_names_its_checkpoint_in_the_result(small_run, capsys):
    run_dir, fit = small_run
    first, _ = fit(1)
    assert first.resumed_from is None
    resumed, _ = fit(2)
    assert capsys.readouterr().out == ""  # progress=False prints nothing
    assert Path(resumed.resumed_from).parent == run_dir / "checkpoints"
    assert resumed.resumed_from == first.checkpoint
    page = (Path(__file__).parents[1] / "docs" / "checkpoints.md").read_text()
    resume = page[page.index("## Resume") : page.index("## The data it trained on")]
    assert "`result.resumed_from` is the checkpoint's path" in " ".join(resume.split())


# --- 8. the suite: an empty folder left in the checkout; beatloop's warnings ---------------


def test_the_checkout_check_sees_an_empty_folder(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    before = _untracked_files(tmp_path)
    (tmp_path / "runs" / "gone").mkdir(parents=True)  # a run dir put back, its parent left
    (tmp_path / "__pycache__").mkdir()  # skipped, as Python's caches are
    assert _untracked_files(tmp_path) - before == {"runs/gone/"}
    (tmp_path / "runs" / "gone").rmdir()
    assert _untracked_files(tmp_path) - before == {"runs/"}


def test_each_test_names_keras_objects_from_zero():
    """``conftest.keras_names_from_zero``: whether a run warns of ``models=`` built in a
    test (``ReproducibilityWarning``) depends on that test alone, not on the tests run
    before it in the worker."""
    import keras

    assert [keras.layers.Dense(1).name for _ in range(2)] == ["dense", "dense_1"]


@pytest.mark.parametrize(
    "category",
    ["ResumeWarning", "ReproducibilityWarning", "RunawayLossWarning", "IgnoredSettingWarning",
     "DataChangedWarning"],
)  # fmt: skip
def test_beatloops_warnings_fail_a_test_that_did_not_expect_them_wherever_they_point(category):
    """``pyproject.toml``'s filters: beatloop's own warning classes are errors even when
    their stacklevel points out of beatloop (here, at this test's line)."""
    with pytest.raises(getattr(beatloop, category), match="unexpected"):
        warnings.warn(getattr(beatloop, category)("unexpected"), stacklevel=1)


def test_a_run_failure_reads_as_one_line():
    failure = RunFailure("gan n_critic=5", 2, "out/gan/seed2", "pass data=...", 3)
    assert failure.text() == "gan n_critic=5 (seed 2, run dir out/gan/seed2) failed: pass data=..."
    own = RunFailure("x", 0, "d", "pass data=... as I wrote", 2, own_words=True)
    assert (
        own.text(lambda text: "translated")
        == "x (seed 0, run dir d) failed: pass data=... as I wrote"
    )
