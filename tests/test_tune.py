"""`beatloop tune`: search spaces checked against a recipe's config before any trial,
studies whose trials are replayable run dirs, several commands on one study, and a
killed study that resumes with no trial lost or repeated."""

from __future__ import annotations

import json
import math
import os
import signal
import time
import tomllib

import numpy as np
import optuna
import pytest
from helpers import find_block, model_variables, start_python

from beatloop.cli import main
from beatloop.core.failures.errors import ConfigError
from beatloop.recipes.supervised import SupervisedConfig
from beatloop.tuning.report import format_trials, write_best_toml
from beatloop.tuning.space import parse_space
from beatloop.tuning.spec import Objective, StudySpec, parse_objective

SMALL = ["--set", "batch_size=256", "--epochs", "2"]
SPACE = ["--space", "learning_rate=log:1e-3:1e-1", "--space", "hidden=int:4:16"]


def space_error(*texts: str, fixed=None) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_space(texts, SupervisedConfig, "recipe 'supervised'", fixed)
    return str(caught.value)


def test_a_space_is_parsed_into_optuna_distributions_and_back_into_config_values():
    space = parse_space(
        ["learning_rate=log:1e-4:0.1", "hidden=int:8:64", "dropout=float:0:0.5",
         "optimizer=choice:adam,sgd"], SupervisedConfig, "recipe 'supervised'",
    )  # fmt: skip
    found = space.distributions()
    assert found["learning_rate"] == optuna.distributions.FloatDistribution(1e-4, 0.1, log=True)
    assert found["hidden"] == optuna.distributions.IntDistribution(8, 64)
    assert found["dropout"] == optuna.distributions.FloatDistribution(0.0, 0.5)
    assert found["optimizer"] == optuna.distributions.CategoricalDistribution(["adam", "sgd"])
    params = {"learning_rate": 0.01, "hidden": 9, "dropout": 0.25, "optimizer": "sgd"}
    assert space.overrides(params, SupervisedConfig, "x") == params
    assert space.texts[0] == "learning_rate=log:0.0001:0.1"


def test_a_bad_space_names_the_field_and_what_is_wrong():
    assert "no config field 'lerning_rate' (did you mean 'learning_rate'?)" in space_error(
        "lerning_rate=log:1e-4:1e-1"
    )
    assert "unknown kind 'lg' (did you mean 'log'?)" in space_error("learning_rate=lg:1:2")
    assert "hidden is int: use int:LOW:HIGH" in space_error("hidden=float:1:5").replace("'", "")
    assert "'hidden' must be > 0" in space_error("hidden=int:0:5")  # the field's validator
    assert "'dropout' must be < 1" in space_error("dropout=float:0:1")
    assert "both ends must be above 0" in space_error("dropout=log:0:0.5")
    assert "LOW must be below HIGH" in space_error("hidden=int:9:3")
    assert "'sgdd' is not a valid value" in space_error("optimizer=choice:adam,sgdd")
    assert "expects FIELD=KIND:" in space_error("hidden")
    assert "given twice" in space_error("hidden=int:1:4", "hidden=int:2:8")
    assert "also fixed by --set hidden" in space_error("hidden=int:1:4", fixed={"hidden": 3})
    # Every problem at once, each named.
    both = space_error("hiden=int:1:4", "dropout=float:0:2")
    assert "'hiden'" in both and "'dropout' must be < 1" in both


def test_the_objective_is_the_recipes_quality_figure_unless_named():
    assert parse_objective(None, ("val_accuracy", "max"), "supervised") == Objective(
        "val_accuracy", "max"
    )
    assert parse_objective("val_loss:min", None, "x") == Objective("val_loss", "min")
    with pytest.raises(ConfigError, match="declares no quality figure"):
        parse_objective(None, None, "style_transfer")
    with pytest.raises(ConfigError, match="FIGURE:min or FIGURE:max"):
        parse_objective("val_loss:lowest", None, "x")


def test_the_table_and_best_toml_come_from_the_best_finished_trial(tmp_path):
    spec = StudySpec("supervised", ("learning_rate=log:1e-4:1e-1",), Objective("val_loss", "min"),
                     tmp_path, fixed=("batch_size=256",), epochs=2, seed=5)  # fmt: skip
    study = optuna.create_study(direction="minimize")
    distribution = {"learning_rate": optuna.distributions.FloatDistribution(1e-4, 0.1, log=True)}
    for value, rate in [(0.9, 0.01), (0.3, 0.0123456789012345), (0.5, 0.001)]:
        study.add_trial(
            optuna.trial.create_trial(
                params={"learning_rate": rate},
                distributions=distribution,
                value=value,
                intermediate_values={0: value + 0.1, 1: value},
            )
        )
    table = format_trials(study, spec)
    assert "3 complete" in table
    assert [line.split()[0] for line in table.splitlines()[3:]] == ["1", "2", "0"]
    best = tomllib.loads(write_best_toml(study, spec, tmp_path / "best.toml").read_text())
    assert best["recipe"] == "supervised" and (best["epochs"], best["seed"]) == (2, 5)
    # The float round-trips exactly: a replay trains the very same config.
    assert best["config"] == {"batch_size": 256, "learning_rate": 0.0123456789012345}


def test_a_bad_space_on_the_command_line_is_a_usage_error_before_any_trial(tmp_path, capsys):
    out = tmp_path / "study"
    code = main(["tune", "supervised", "--space", "hiden=int:4:16", "--out", str(out)])
    assert code == 2
    assert "--space hiden" in capsys.readouterr().err
    assert not out.exists()
    (tmp_path / "tune.toml").write_text(
        'recipe = "supervised"\ntrails = 3\n[space]\nhidden = "int:4:8"\n'
    )
    assert main(["tune", "--config", str(tmp_path / "tune.toml"), "--out", str(out)]) == 2
    assert "unknown key(s) 'trails' (did you mean 'trials'?)" in capsys.readouterr().err
    # A file's [space] and [config] are checked as the flags are.
    (tmp_path / "tune.toml").write_text(
        'recipe = "supervised"\ntrials = 3\n[space]\nhidden = "int:4:8"\n[config]\nhidden = 5\n'
    )
    assert main(["tune", "--config", str(tmp_path / "tune.toml"), "--out", str(out)]) == 2
    assert "--space hidden is also fixed by --set hidden" in capsys.readouterr().err
    assert not out.exists()


def trials_of(out) -> list:
    study = optuna.load_study(study_name="supervised", storage=f"sqlite:///{out / 'study.db'}")
    return study.get_trials(deepcopy=False)


@pytest.mark.slow
def test_a_four_trial_study_on_two_jobs_finishes_and_its_best_trial_replays_bit_for_bit(
    tmp_path, monkeypatch, capsys
):
    """The "Tune and compare" page's block: four trials, two at once."""
    monkeypatch.chdir(tmp_path)
    namespace = {}
    find_block("beatloop.tune(").run(namespace)
    result, out = namespace["result"], tmp_path / "runs" / "tune-supervised"
    printed = capsys.readouterr().out
    trials = trials_of(out)
    assert sorted(t.number for t in trials) == [0, 1, 2, 3]
    assert all(t.state.is_finished() and t.state.name != "FAIL" for t in trials), printed
    assert len({t.params["learning_rate"] for t in trials}) == 4  # four points, not one
    best = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert f"trial {best.number}: val_accuracy {best.value:.6g}" in printed
    log = (out / "logs" / f"trial-{best.number:04d}.log").read_text()
    assert "epoch 1/" in log and "val_accuracy" in log  # the trial's own lines
    assert result.best_config == {"batch_size": 256, **best.params}
    # Importances need two finished trials that fANOVA can tell apart; pruning decides.
    assert result.plots[0].resolve() == out / "history.png"
    assert all(p.is_file() for p in result.plots)
    assert result.best_toml.resolve() == out / "best.toml"
    table = format_trials(result.study, result.spec).splitlines()
    assert table[3].split()[:2] == [str(best.number), f"{best.value:.6g}"]

    # The best trial's run dir replays bit for bit, from its run.json and from best.toml.
    trained = model_variables(out / f"trial-{best.number:04d}")
    for config in (out / f"trial-{best.number:04d}" / "run.json", out / "best.toml"):
        replay = tmp_path / f"replay-{config.stem}"
        assert main(["run", "--config", str(config), "--run-dir", str(replay), "--quiet"]) == 0
        again = model_variables(replay)
        assert again.keys() == trained.keys()
        for name, value in trained.items():
            np.testing.assert_array_equal(again[name], value, err_msg=name)
    # Its objective is the figure the run logged last.
    history = (out / f"trial-{best.number:04d}" / "history.jsonl").read_text().splitlines()
    assert math.isclose(json.loads(history[-1])["val_accuracy"], best.value)


def start_tune(out, *extra: str):
    return start_python("-m", "beatloop", "tune", "supervised", "--space",
                        "learning_rate=log:1e-3:1e-1", "--set", "batch_size=256",
                        "--out", str(out), *extra)  # fmt: skip


#: Imported by every trial of the killed study (``--import``): after a trial saves an
#: epoch's checkpoint (not the step-0 one a run starts with: a resume from it would
#: restore no optimizer state) while ``HOLDS/hold-trial-N`` exists for it, it marks
#: ``held-trial-N`` and waits until that file is removed or it is asked to stop
#: (SIGTERM), so the test kills or stops it at a known point, however fast its epochs run.
HOLD = """
import time
from pathlib import Path

from beatloop.core.running.recovery import Recovery

HOLDS = Path({holds!r})
_save = Recovery.save


def save(self, logs=None):
    _save(self, logs)
    if self.checkpoints is None or logs is None:
        return
    name = self.checkpoints.directory.parent.name
    hold = HOLDS / f"hold-{{name}}"
    if hold.exists():
        (HOLDS / f"held-{{name}}").touch()
        while hold.exists() and self._interrupt.requested is None:
            time.sleep(0.01)


Recovery.save = save
"""


def holding(tmp_path) -> tuple:
    """``HOLD`` written for a test: its ``--import`` file and its ``HOLDS`` folder."""
    holds = tmp_path / "holds"
    holds.mkdir()
    hold = tmp_path / "hold.py"
    hold.write_text(HOLD.format(holds=str(holds)))
    return hold, holds


def wait_until_held(holds, number: int, *processes) -> None:
    """Until trial ``number`` has saved its first epoch's checkpoint and waits (the
    commands still running)."""
    held = holds / f"held-trial-{number:04d}"
    deadline = time.monotonic() + 240
    while not held.exists():
        for process in processes:
            assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"trial {number} made no checkpoint"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_killed_or_interrupted_study_resumes_its_running_trial_exactly_and_loses_or_repeats_none(
    tmp_path,
):
    out = tmp_path / "study"
    hold, holds = holding(tmp_path)
    budget = ["--trials", "3", "--epochs", "3", "--pruner", "none", "--import", str(hold)]
    (holds / "hold-trial-0001").touch()  # trial 1 waits at its epoch 1's checkpoint
    first = start_tune(out, *budget)
    wait_until_held(holds, 1, first)
    assert (out / "trial-0001" / "checkpoints" / "checkpoint").exists()
    os.kill(first.pid, signal.SIGKILL)  # its trial's process dies with it
    first.communicate()
    assert [t.state.name for t in trials_of(out)] == ["COMPLETE", "RUNNING"]
    complete = trials_of(out)[0].value

    (holds / "hold-trial-0001").unlink()
    (holds / "hold-trial-0002").touch()
    second = start_tune(out, *budget)  # resumes trial 1, then starts trial 2: Ctrl-C there
    wait_until_held(holds, 2, second)
    second.send_signal(signal.SIGINT)
    printed, err = second.communicate(timeout=300)
    assert second.returncode == 130, (printed[-2000:], err[-2000:])
    assert "resuming trial(s) 1" in printed
    assert "trial(s) 2 saved a checkpoint and stay running in the study; the same command " \
        "resumes them" in err  # fmt: skip
    assert [t.state.name for t in trials_of(out)] == ["COMPLETE", "COMPLETE", "RUNNING"]
    assert "the same command resumes it" in (out / "logs" / "trial-0002.log").read_text()

    (holds / "hold-trial-0002").unlink()
    third = start_tune(out, *budget)
    printed, err = third.communicate(timeout=300)
    assert third.returncode == 0, err[-3000:]
    assert "resuming trial(s) 2" in printed
    trials = trials_of(out)
    assert [(t.number, t.state.name) for t in trials] == [(n, "COMPLETE") for n in range(3)]
    assert trials[0].value == complete  # the finished trial is kept as it was
    # Trials 1 and 2 resumed from their checkpoints and ended on the weights of
    # uninterrupted runs.
    for number in (1, 2):
        resumed = out / f"trial-{number:04d}"
        assert '"resumed_from": null' not in (resumed / "run.json").read_text()
        replay = tmp_path / f"uninterrupted-{number}"
        assert main(["run", "--config", str(resumed / "run.json"), "--run-dir", str(replay),
                     "--quiet"]) == 0  # fmt: skip
        trained, again = model_variables(resumed), model_variables(replay)
        for name, value in trained.items():
            np.testing.assert_array_equal(again[name], value, err_msg=f"trial {number} {name}")


MAKE_TOGETHER = """
import sys, time
from pathlib import Path
import optuna.storages
from beatloop.tuning.spec import Objective, StudySpec
from beatloop.tuning.study import ask_within_budget, load_study
out, me, everyone = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def all_at(stage):  # a barrier: go on when every process has reached ``stage``
    (out / f"{stage}-{me}").touch()
    deadline = time.time() + 60
    while len(list(out.glob(f"{stage}-*"))) < everyone and time.time() < deadline:
        time.sleep(0.005)

spec = StudySpec("supervised", ("hidden=int:4:8",), Objective("val_loss", "min"), out,
                 trials=2)
all_at("open")
study = load_study(spec, create=True)
hidden = optuna.distributions.IntDistribution(4, 8)
all_at("ask")
print(ask_within_budget(study, spec, {"hidden": hidden}) is not None)
"""


@pytest.mark.slow
def test_commands_started_together_on_a_new_sqlite_file_share_one_study_and_its_budget(
    tmp_path,
):
    """Three commands open a new study's SQLite file at once (its tables made by one of
    them, not three: else Alembic's version row is inserted twice), then each asks for a
    trial of a 2-trial study: two get one, the third none (counted and asked in turn)."""
    together = [start_python("-c", MAKE_TOGETHER, tmp_path, me, 3) for me in range(3)]
    outputs = [p.communicate(timeout=120) for p in together]
    assert [p.returncode for p in together] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    assert sorted(out.strip() for out, _ in outputs) == ["False", "True", "True"]
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    assert optuna.study.get_all_study_names(storage) == ["supervised"]
    study = optuna.load_study(study_name="supervised", storage=storage)
    assert study.user_attrs["spec"]["space"] == ["hidden=int:4:8"]
    assert sorted(t.number for t in study.trials) == [0, 1]


@pytest.mark.slow
def test_two_commands_on_one_storage_share_the_study(tmp_path):
    """Each trial waits at its checkpoint until the other has one: a command runs one
    trial at a time, so each of the two ran one."""
    out = tmp_path / "study"
    hold, holds = holding(tmp_path)
    budget = ["--trials", "2", "--epochs", "1", "--set", "hidden=8", "--import", str(hold)]
    budget += ["--objective", "val_loss:min", "--pruner", "hyperband"]
    for number in (0, 1):
        (holds / f"hold-trial-{number:04d}").touch()
    both = [start_tune(out, *budget), start_tune(out, *budget)]
    for number in (0, 1):
        wait_until_held(holds, number, *both)
    for number in (0, 1):
        (holds / f"hold-trial-{number:04d}").unlink()
    for process in both:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
    trials = trials_of(out)
    assert sorted(t.number for t in trials) == [0, 1]
    assert all(t.state.name == "COMPLETE" for t in trials)
    assert len({t.user_attrs["pid"] for t in trials}) == 2  # each command ran some
    for trial in trials:  # judged by the figure named, at the last epoch
        last = json.loads((out / f"trial-{trial.number:04d}" / "history.jsonl").read_text())
        assert trial.value == last["val_loss"]
    best = tomllib.loads((out / "best.toml").read_text())["config"]["learning_rate"]
    assert best == min(trials, key=lambda t: t.value).params["learning_rate"]
