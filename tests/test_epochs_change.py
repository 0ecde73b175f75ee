"""``epochs`` against what a run dir holds: fewer is refused and changes nothing, as many
trains nothing and writes nothing, more continues the run exactly as if it had been
started with the higher epochs, and ``run.json`` records every start's epochs."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from helpers import assert_same_weights, history_records, model_weights


def snapshot(path: Path) -> dict:
    """Every file and folder under ``path`` with its bytes."""
    return {
        str(p.relative_to(path)): (p.read_bytes() if p.is_file() else "folder")
        for p in sorted(path.rglob("*"))
    }


#: A small supervised run on its built-in data: 1,437 digits in batches of 256, 6 steps
#: an epoch; the command line's spelling of it.
CONFIG = {"hidden": 8, "batch_size": 256}
TINY = ["--set", "hidden=8", "--set", "batch_size=256", "--seed", "1", "--quiet"]


def tiny_run(run_dir: Path, epochs: int, **overrides):
    """The small supervised run, checkpointing in ``run_dir``."""
    import beatloop

    options = {"seed": 1, "config": CONFIG, "run_dir": run_dir, "progress": False}
    return beatloop.fit("supervised", epochs=epochs, **{**options, **overrides})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-epoch run dir, and the weights a straight three-epoch run ends with
    (copy the run dir before changing it)."""
    base = tmp_path_factory.mktemp("epochs")
    tiny_run(base / "two", 2)
    straight = tiny_run(base / "three", 3)
    return base / "two", model_weights(straight.models["model"]), straight.history


def copied(run_dir: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run"


def test_fewer_epochs_than_the_run_dir_holds_are_refused_and_nothing_changes(finished, tmp_path):
    from beatloop.core.failures.errors import ConfigError

    run_dir = copied(finished[0], tmp_path)
    before = snapshot(run_dir)
    with pytest.raises(ConfigError) as refused:
        tiny_run(run_dir, 1)
    message = str(refused.value)
    assert f"the run dir {run_dir} holds 2 finished epoch(s) (step 12)" in message
    assert "Pass --epochs 3 or more" in message and refused.value.exit_code == 2
    assert snapshot(run_dir) == before  # run.json still says 2 epochs


def test_the_epochs_the_run_dir_holds_train_nothing_and_write_nothing(finished, tmp_path):
    run_dir = copied(finished[0], tmp_path)
    before = snapshot(run_dir)
    with pytest.warns(UserWarning, match=r"holds 2 finished epoch\(s\) already.*nothing to train"):
        result = tiny_run(run_dir, 2)
    assert (result.epochs, result.steps) == (2, 12)
    assert len(result.history["loss"]) == 2  # the run's history, from its checkpoint
    assert snapshot(run_dir) == before


def test_more_epochs_continue_a_finished_run_as_a_longer_run_would_have(finished, tmp_path):
    run_dir = copied(finished[0], tmp_path)
    _, straight_weights, straight_history = finished
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # continuing is not worth a warning
        more = tiny_run(run_dir, 3, seed=None)  # the seed comes from the checkpoint
    assert more.resumed_from is not None and more.steps == 18
    assert_same_weights(model_weights(more.models["model"]), straight_weights)
    assert more.history == straight_history
    assert [row["epoch"] for row in history_records(run_dir)] == [1, 2, 3]
    recorded = json.loads((run_dir / "run.json").read_text())
    assert recorded["epochs"] == 3 and recorded["epochs_asked"] == [2, 3]


def test_the_command_line_refuses_fewer_epochs_with_exit_2(finished, tmp_path, capsys):
    from beatloop.cli import main

    run_dir = copied(finished[0], tmp_path)
    before = snapshot(run_dir)
    code = main(["run", "supervised", "--epochs", "1", "--run-dir", str(run_dir), *TINY])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("beatloop: error: the run dir "), err
    assert len(err.strip().splitlines()) == 1 and "--epochs 3 or more" in err
    assert snapshot(run_dir) == before
