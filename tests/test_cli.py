"""The command line: list, show, run, and errors as one line with exit status 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import history_records

from beatloop.cli import main


def test_list_shows_name_description_and_origin(capsys):
    assert main(["list"]) == 0
    line = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("supervised")
    )
    assert "Classification with one model" in line and line.endswith("[built-in]")


def test_list_verbose_shows_modules_and_callbacks(capsys):
    assert main(["list", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "module: beatloop.recipes.supervised" in out
    assert "callback progress: beatloop.plugins.callbacks.ProgressBar [built-in]" in out


def test_show_prints_config_schedule_and_variables(capsys):
    assert main(["show", "supervised", "--set", "hidden=7"]) == 0
    out = capsys.readouterr().out
    assert "hidden: int = 7  (default 64)" in out
    assert "1. loss: loss=loss optimizer=optimizer updates=model" in out
    assert "classifier/dense" in out and "(64, 7)" in out  # the first kernel, 64 inputs


def test_run_trains_and_writes_the_run_dir(tmp_path, capsys):
    run_dir = tmp_path / "demo"
    code = main(
        [
            "run", "supervised", "--epochs", "2", "--seed", "0", "--set", "hidden=16",
            "--set", "batch_size=64", "--run-dir", str(run_dir), "--quiet",
            "--steps-per-execution", "4", "--callback", "csv",
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert f"run dir: {run_dir}" in out and "2 epoch(s), 46 steps, seed 0" in out
    records = history_records(run_dir)
    assert [r["epoch"] for r in records] == [1, 2] and records[1]["step"] == 46
    assert records[1]["loss"] < records[0]["loss"]
    assert (run_dir / "history.csv").read_text().splitlines()[0].startswith("epoch,step,loss")
    run = json.loads((run_dir / "run.json").read_text())
    assert run["recipe"] == "supervised" and run["config"]["hidden"] == 16 and run["seed"] == 0
    assert run["schedule"] == ["1. loss: loss=loss optimizer=optimizer updates=model"]


def test_errors_are_one_line_and_exit_2(capsys):
    assert main(["run", "supervized"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("beatloop: error: no recipe named 'supervized'")
    assert "did you mean 'supervised'" in err and "Traceback" not in err
    assert main(["run", "supervised", "--set", "hidden=wide"]) == 2
    assert "'hidden' expects int, got str 'wide'" in capsys.readouterr().err
    assert main(["run", "supervised", "--set", "colour=red"]) == 2
    assert "no config field 'colour'" in capsys.readouterr().err
    assert main(["run", "supervised", "--callback", "tensorbored"]) == 2
    assert "no callback named 'tensorbored'" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_and_module_entry_point(capsys):
    assert main(["list"]) == 0
    expected = capsys.readouterr().out
    assert expected.splitlines()[0].startswith("gan  ")  # a real list, not an empty one
    script = Path(sys.executable).parent / "beatloop"
    for command in ([str(script), "list"], [sys.executable, "-m", "beatloop", "list"]):
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
        assert out.stdout == expected, command  # both entry points are main()
