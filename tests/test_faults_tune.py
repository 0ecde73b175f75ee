"""``beatloop tune``'s faults: a continued or shared study proposes what one command would
(no point trained twice), a study's storage that is deleted, damaged, full or read-only
and a space with endless ends are said in one line naming the file or the field, with
beatloop's exit codes, and nothing the user had is lost.

Studies are filled with Optuna's own ask and tell (no training) where the fault is the
storage's, so the cases run in a second each."""

import contextlib
import math
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from helpers import finish, start_python

import beatloop
from beatloop.cli import main
from beatloop.tuning.processes import _ending
from beatloop.tuning.report import format_trials, write_plots
from beatloop.tuning.spec import Objective, StudySpec
from beatloop.tuning.study import (
    StudyFailed,
    _distributions,
    ask_within_budget,
    load_study,
    refuse_if_none_finished,
    run_study,
)

SPACE = ("learning_rate=log:1e-4:1e-1",)


def spec_in(out: Path, trials: int = 12, **fields) -> StudySpec:
    """A study of the supervised recipe's learning rate in ``out`` (made, as
    ``run_study`` makes it)."""
    out.mkdir(parents=True, exist_ok=True)
    return StudySpec("supervised", SPACE, Objective("val_loss", "min"), out, trials=trials,
                     **fields)  # fmt: skip


def score(params) -> float:
    """A made-up objective with its minimum inside the range."""
    return (math.log10(params["learning_rate"]) + 2.5) ** 2


def ask_and_tell(study, spec, count: int) -> list[float]:
    """``count`` trials asked as ``run_study`` asks them and told their score."""
    points = []
    for _ in range(count):
        trial = ask_within_budget(study, spec, _distributions(spec))
        study.tell(trial, score(trial.params))
        points.append(trial.params["learning_rate"])
    return points


def test_a_continued_or_shared_study_proposes_what_one_command_would(tmp_path):
    """12 trials (the last two past TPE's 10 random start-up trials, so from the scores):
    one command; a command stopped after 5 and another going on; two commands taking
    turns on one storage. All three propose the same 12 points, none twice."""
    one = ask_and_tell(
        load_study(spec_in(tmp_path / "one"), create=True), spec_in(tmp_path / "one"), 12
    )
    assert len(set(one)) == 12

    spec = spec_in(tmp_path / "continued")
    first = ask_and_tell(load_study(spec, create=True), spec, 5)
    again = ask_and_tell(load_study(spec, create=True), spec, 7)  # a new command, same seed
    assert first + again == one

    spec = spec_in(tmp_path / "shared")
    a, b = load_study(spec, create=True), load_study(spec, create=True)
    shared = [ask_and_tell(study, spec, 1)[0] for _ in range(6) for study in (a, b)]
    assert shared == one

    other_seed = spec_in(tmp_path / "seed", seed=1)
    assert ask_and_tell(load_study(other_seed, create=True), other_seed, 3) != one[:3]


def test_trial_dirs_the_study_does_not_hold_are_refused_before_any_trial(tmp_path):
    """study.db deleted (or emptied) with its trials' dirs left: refused, naming them."""
    spec = spec_in(tmp_path / "study", trials=2)
    (spec.out / "trial-0000" / "checkpoints").mkdir(parents=True)
    (spec.out / "trial-0001").mkdir()
    with pytest.raises(beatloop.RunDirError, match=r"2 trial dir\(s\) \(trial-0000, trial-0001\)"):
        run_study(spec, echo=lambda line: None)
    assert (spec.out / "trial-0000" / "checkpoints").is_dir()  # nothing of theirs touched
    assert not (spec.out / "logs").exists()  # no trial started


def _filled(out: Path, trials: int = 6) -> StudySpec:
    spec = spec_in(out, trials=trials)
    ask_and_tell(load_study(spec, create=True), spec, trials)
    return spec


@pytest.mark.parametrize("damage", ["page", "truncated", "garbage"])
def test_a_damaged_study_db_is_one_line_naming_it_exit_5(tmp_path, capsys, damage):
    spec = _filled(tmp_path / "study")
    db = spec.out / "study.db"
    data = bytearray(db.read_bytes())
    assert len(data) >= 5 * 4096
    if damage == "page":  # one page of a table overwritten
        data[3 * 4096 : 4 * 4096] = b"\xff" * 4096
    elif damage == "truncated":
        data = data[:3000]
    else:
        data = bytearray(b"not a database\n" * 10)
    db.write_bytes(bytes(data))
    code = main(["tune", "supervised", "--space", *SPACE, "--trials", "6",
                 "--objective", "val_loss:min", "--out", str(spec.out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 5, err
    lines = [line for line in err.splitlines() if line.startswith("beatloop:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"the study's storage {db} cannot be read: it is damaged" in lines[0]
    assert "trial-*" in lines[0] and "--storage" not in lines[0]
    assert db.read_bytes() == bytes(data)  # left as it was, for the user to rescue


def test_endless_ends_are_refused_before_the_study_is_made(tmp_path, capsys):
    out = tmp_path / "study"
    for ends in ("1e-3:inf", "-inf:1", "nan:0.1"):
        code = main(["tune", "supervised", "--space", f"learning_rate=float:{ends}",
                     "--out", str(out)])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2, err
        assert "both ends must be finite numbers" in err
    assert not out.exists()


def test_a_study_with_no_finished_trial_fails_with_its_trials_code(tmp_path):
    spec = spec_in(tmp_path / "study", trials=2)
    study = load_study(spec, create=True)
    for _ in range(2):
        trial = ask_within_budget(study, spec, _distributions(spec))
        trial.set_user_attr("error", "the run dir is not writable: the disk is full")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        study.set_user_attr(f"exit_code_{trial.number}", 5)
    with pytest.raises(StudyFailed, match=r"2 of 2 failed \(trial 0: the run dir") as failed:
        refuse_if_none_finished(study, spec)
    assert failed.value.exit_code == 5
    finished = _filled(tmp_path / "fine", trials=2)
    refuse_if_none_finished(load_study(finished), finished)  # one finished: no error


def test_a_study_whose_trials_all_stopped_unfinished_fails_naming_the_first(tmp_path):
    spec = spec_in(tmp_path / "study", trials=3)
    study = load_study(spec, create=True)
    for _ in range(3):  # asked and never told: left running in the study
        ask_within_budget(study, spec, _distributions(spec))
    ending = "ended with status 5 (trial 1: the disk is full)"
    unfinished = {2: (-9, "was killed by SIGKILL"), 1: (5, ending)}
    with pytest.raises(StudyFailed) as failed:
        refuse_if_none_finished(study, spec, unfinished)
    assert str(failed.value) == (
        "study 'supervised' has no finished trial: 2 of its 3 trial(s) stopped unfinished "
        f"(trial 1: its process {ending}); each trial's log is in {spec.out / 'logs'}: put "
        "its cause right, then the same command resumes them"
    )
    assert failed.value.exit_code == 5
    with pytest.raises(StudyFailed) as failed:
        refuse_if_none_finished(study, spec, {0: (-9, "was killed by SIGKILL")})
    assert failed.value.exit_code == 128 + 9
    refuse_if_none_finished(study, spec)  # running elsewhere, not left by this command
    study.tell(0, 1.0)
    refuse_if_none_finished(study, spec, unfinished)  # one finished: shown as it is


@pytest.mark.slow
def test_tune_whose_every_trial_stopped_unfinished_exits_with_its_code(tmp_path, capsys):
    out = tmp_path / "study"
    out.mkdir()
    (out / "trial-0000").touch()  # a file where the trial's run dir goes: exit 5, unfinished
    code = main(["tune", "supervised", "--space", *SPACE, "--trials", "1", "--epochs", "1",
                 "--out", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 5, captured.err
    (line,) = [line for line in captured.err.splitlines() if line.startswith("beatloop:")]
    assert line.startswith(
        "beatloop: error: study 'supervised' has no finished trial: 1 of its 1 trial(s) "
        f"stopped unfinished (trial 0: its process ended with status 5 (trial 0: the run dir "
        f"{out}/trial-0000 is a file, not a folder"
    ), line
    assert line.endswith(f"each trial's log is in {out / 'logs'}: put its cause right, "
                         "then the same command resumes them")  # fmt: skip
    assert "running" not in captured.out  # no table of a study that finished nothing


def test_a_complete_trial_that_reported_no_epoch_is_shown(tmp_path):
    spec = _filled(tmp_path / "study", trials=2)  # told values, never reported a step
    table = format_trials(load_study(spec), spec)
    assert "2 complete" in table and " - " in table


def test_a_trials_end_names_its_signal_not_tensorflows_banner(tmp_path):
    log = tmp_path / "trial.log"
    log.write_text("I0000 00:00:1 port.cc:153] oneDNN custom operations are on.\n"
                   "trial 3: out of memory here\n"
                   "To enable the following instructions: AVX2, rebuild TensorFlow\n")  # fmt: skip
    assert _ending(-signal.SIGKILL, log).startswith("was killed by SIGKILL")
    assert _ending(1, log) == "ended with status 1 (trial 3: out of memory here)"
    assert _ending(1, tmp_path / "missing.log") == "ended with status 1 (no output)"


def test_importances_of_tied_scores_are_not_drawn_and_that_is_said(tmp_path):
    spec = spec_in(tmp_path / "study", trials=3)
    study = load_study(spec, create=True)
    for _ in range(3):
        study.tell(ask_within_budget(study, spec, _distributions(spec)), 1.0)  # all tied
    said = []
    written = write_plots(study, spec.out, said.append)
    assert [p.name for p in written] == ["history.png"]
    assert len(said) == 1 and said[0].startswith("importances.png not written")


#: The child's start: as root, drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its
#: effective and permitted sets (root then obeys file modes as any user does); with
#: ``small``, no file may grow past 20 kB (a full disk, as SQLite sees one); then run the
#: ``beatloop`` console script.
AS_USER = """
import ctypes, os, resource, runpy, signal, sys

mode, script, *args = sys.argv[1:]
if os.geteuid() == 0:
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    kept = ~((1 << 1) | (1 << 2))
    data[0].effective &= kept
    data[0].permitted &= kept
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
if mode == "small":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
"""


def _as_user(*args: str, cwd: Path, small: bool = False) -> subprocess.CompletedProcess:
    """The ``beatloop`` command without root's permission override (file modes hold),
    forked with TensorFlow imported (``start_python``); ``small``: on a full disk."""
    script = Path(sys.executable).parent / "beatloop"
    with contextlib.chdir(cwd):
        process = start_python("-c", AS_USER, "small" if small else "-", script, *args)
    return finish(process, 300, args)


@pytest.mark.slow
def test_a_read_only_study_dir_shows_a_finished_study_and_refuses_the_rest(tmp_path):
    spec = _filled(tmp_path / "study", trials=2)
    locked = tmp_path / "locked"
    locked.mkdir()
    args = ["tune", "supervised", "--space", *SPACE, "--objective", "val_loss:min"]
    for path in (spec.out, *spec.out.iterdir(), locked):
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        before = {p.name: p.read_bytes() for p in spec.out.iterdir()}
        shown = _as_user(*args, "--trials", "2", "--out", str(spec.out), cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert "study 'supervised': 2 complete" in shown.stdout
        assert "is read-only: best.toml and the plots are not written" in shown.stdout
        more = _as_user(*args, "--trials", "3", "--out", str(spec.out), cwd=tmp_path)
        assert more.returncode == 5, more.stderr
        assert "is not writable, and study 'supervised' has 1 of its 3 trials" in more.stderr
        assert {p.name: p.read_bytes() for p in spec.out.iterdir()} == before
        new = _as_user(*args, "--out", str(locked / "new"), cwd=tmp_path)
        assert new.returncode == 5, new.stderr
        assert f"cannot be created: its parent {locked} is not writable" in new.stderr
        assert "Traceback" not in more.stderr + new.stderr
    finally:
        for path in (spec.out, *spec.out.iterdir(), locked):
            path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.mark.slow
def test_a_full_disk_when_the_study_is_made_exits_5_and_leaves_nothing(tmp_path):
    out = tmp_path / "study"
    done = _as_user("tune", "supervised", "--space", *SPACE, "--out", str(out), cwd=tmp_path,
                    small=True)  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert f"the study's storage {out / 'study.db'} cannot be" in done.stderr
    assert "Traceback" not in done.stderr and "sqlalche.me" not in done.stderr
    assert not out.exists()  # no empty study.db, no lock, no dir


def test_copies_of_a_study_db_keep_their_trials(tmp_path):
    """The rescue the damaged-file message advises: a copy of study.db restores the
    study, trials and all (SQLite's file is the whole study)."""
    spec = _filled(tmp_path / "study", trials=3)
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(spec.out / "study.db", copy / "study.db")
    with sqlite3.connect(copy / "study.db") as connection:
        (count,) = connection.execute("select count(*) from trials").fetchone()
    assert count == 3
