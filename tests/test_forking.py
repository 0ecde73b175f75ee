"""Trial and compared-run processes forked from a starter that imported TensorFlow
(``beatloop/forking.py``): the same figures, bit for bit, as spawned ones, a child that
behaves as ``python -m MODULE`` would, and ``subprocess.Popen`` where forking is not safe
(an op ran in the parent) or is switched off (``BEATLOOP_FORK_TRIALS=0``).

A trial or run tells how it started through ``--import PROBE``: a module that writes,
per process, whether the ``beatloop`` command's own modules are there (a forked child
inherits them; ``python -m beatloop.tuning.trial`` never imports the command line)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import numpy as np
import pytest
from helpers import model_variables, start_python

PROBE = """
import os, sys
from pathlib import Path

here = Path({folder!r})
here.mkdir(exist_ok=True)
(here / str(os.getpid())).write_text(str("beatloop.cli.app" in sys.modules))
"""


def probing(tmp_path, name: str):
    """A probe module for one command and the folder it writes its answers in."""
    folder = tmp_path / f"{name}-started"
    probe = tmp_path / f"probe_{name}.py"
    probe.write_text(PROBE.format(folder=str(folder)))
    return probe, folder


def forked_answers(folder, parent_pid: int) -> list[bool]:
    """Per child process (the command's own answer left out): whether it was forked."""
    return [
        path.read_text() == "True"
        for path in sorted(folder.iterdir())
        if path.name != str(parent_pid)
    ]


def finished(process) -> str:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return out


@pytest.mark.slow
def test_a_forked_trial_ends_on_the_weights_of_a_spawned_one(tmp_path):
    results = {}
    for mode, env in (("forked", {}), ("spawned", {"BEATLOOP_FORK_TRIALS": "0"})):
        probe, started = probing(tmp_path, mode)
        out = tmp_path / mode
        process = start_python(
            "-m", "beatloop", "tune", "supervised", "--space", "learning_rate=log:1e-3:1e-1",
            "--set", "batch_size=256", "--trials", "2", "--epochs", "1", "--pruner", "none",
            "--out", str(out), "--import", str(probe), **env,
        )  # fmt: skip
        printed = finished(process)
        assert forked_answers(started, process.pid) == [mode == "forked"] * 2, printed
        results[mode] = [line for line in printed.splitlines() if line.startswith("trial ")]
        for number in (0, 1):
            assert "epoch 1/1" in (out / "logs" / f"trial-{number:04d}.log").read_text()
    assert results["forked"] == results["spawned"]  # the same points and objectives
    for number in (0, 1):
        forked = model_variables(tmp_path / "forked" / f"trial-{number:04d}")
        spawned = model_variables(tmp_path / "spawned" / f"trial-{number:04d}")
        assert forked.keys() == spawned.keys()
        for name, value in forked.items():
            np.testing.assert_array_equal(spawned[name], value, err_msg=f"{number} {name}")


@pytest.mark.slow
def test_compared_runs_forked_give_the_figures_of_spawned_ones(tmp_path):
    """One job (a run after another) and two (runs at once) fork; switched off, spawned."""
    rows = {}
    modes = (("forked-1", "1", {}), ("forked-2", "2", {}),
             ("spawned", "1", {"BEATLOOP_FORK_TRIALS": "0"}))  # fmt: skip
    for mode, jobs, env in modes:
        probe, started = probing(tmp_path, mode)
        process = start_python(
            "-m", "beatloop", "compare", "supervised", "--set", "batch_size=256", "supervised",
            "--set", "batch_size=128", "--epochs", "1", "--jobs", jobs, "--out",
            str(tmp_path / mode), "--import", str(probe), **env,
        )  # fmt: skip
        finished(process)
        assert forked_answers(started, process.pid) == [mode != "spawned"] * 2
        record = json.loads((tmp_path / mode / "compare.json").read_text())
        rows[mode] = [
            (
                row["label"],
                row["steps"],
                row["final_losses"],
                row["loss_curves"],
                row["quality_value"],
            )
            for row in record["rows"]
        ]
    assert rows["forked-1"] == rows["spawned"] == rows["forked-2"]


#: Run in a process forked from the tests' zygote (TensorFlow imported, no op run): its
#: children, forked through ``beatloop.forking`` as ``beatloop tune`` forks its trials,
#: and their ends; then the same after an op ran (spawned) and with another environment.
CHILDREN = r"""
import json, os, signal, subprocess, sys, tempfile, time
from beatloop import forking

CASE = '''
import os, random, sys, time
case = sys.argv[1]
print(json.dumps({"argv": sys.argv[1:], "session": os.getsid(0) == os.getpid(),
                  "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
                  "others": sorted({os.readlink(f"/proc/self/fd/{fd}") for fd in
                                    os.listdir("/proc/self/fd") if int(fd) > 2
                                    and os.path.exists(f"/proc/self/fd/{fd}")}),
                  "extra": os.environ.get("EXTRA"), "cwd": os.getcwd(),
                  "random": random.random(), "main": __name__}), flush=True)
if case == "exit3":
    sys.exit(3)
if case == "raise":
    raise ValueError("boom")
if case == "words":
    sys.exit("gave up")
if case == "interrupt":
    raise KeyboardInterrupt
if case == "wait":
    time.sleep(60)
'''
open("case_child.py", "w").write("import json\n" + CASE)


def start(case, session=True, **env):
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    command = [sys.executable, "-m", "case_child", case]
    process = forking.popen(command, stdout=out, stderr=err, env={**os.environ, **env},
                            start_new_session=session)
    return process, out, err


def ended(started, signal_it=None):
    process, out, err = started
    if signal_it is not None:
        time.sleep(1)
        process.send_signal(signal_it)
    code = process.wait(timeout=120)
    out.seek(0), err.seek(0)
    printed = out.read().strip().splitlines()
    return {"kind": type(process).__name__, "code": code,
            "first": json.loads(printed[0]) if printed else None, "err": err.read()}


os.environ["EXTRA"] = "x"  # before the starter: its environment and its children's
found = {"unsafe_before": forking.unsafe_reason()}
with forking.forked_children():
    cases = [start(case, session=case != "ok-no-session")
             for case in ("ok", "ok-no-session", "exit3", "raise", "words", "interrupt")]
    found.update({case: ended(s) for case, s in zip(
        ("ok", "ok-no-session", "exit3", "raise", "words", "interrupt"), cases)})
    found["term"] = ended(start("wait"), signal.SIGTERM)
    waiting = start("wait")
    try:
        waiting[0].wait(timeout=0.5)
    except subprocess.TimeoutExpired:
        found["timeout"] = True
    found["kill"] = ended(waiting, signal.SIGKILL)
    found["other_env"] = ended(start("ok", TF_ENABLE_ONEDNN_OPTS="0"))
import tensorflow as tf

tf.constant(1.0) + 1.0  # TensorFlow's runtime started: not safe to fork any more
found["unsafe_after"] = forking.unsafe_reason()
with forking.forked_children():
    found["after_op"] = ended(start("ok"))
print(json.dumps(found))
"""


@pytest.mark.slow
def test_a_forked_child_starts_and_ends_as_python_m_would(tmp_path):
    with contextlib.chdir(tmp_path):
        process = start_python("-c", CHILDREN)
    found = json.loads(finished(process).splitlines()[-1])
    assert found["unsafe_before"] is None
    ok = found["ok"]
    assert ok["kind"] == "ForkedChild" and ok["code"] == 0
    first = ok["first"]
    assert first["argv"] == ["ok"] and first["main"] == "__main__" and first["extra"] == "x"
    assert first["session"] and not found["ok-no-session"]["first"]["session"]
    assert first["fds"][:3] == [0, 1, 2] and first["cwd"] == str(tmp_path)
    assert ok["err"] == ""
    assert found["ok"]["first"]["random"] != found["ok-no-session"]["first"]["random"]
    assert found["exit3"]["code"] == 3
    assert found["raise"]["code"] == 1
    assert "Traceback" in found["raise"]["err"] and "ValueError: boom" in found["raise"]["err"]
    assert (found["words"]["code"], found["words"]["err"]) == (1, "gave up\n")
    assert found["interrupt"]["code"] == -signal.SIGINT
    assert "KeyboardInterrupt" in found["interrupt"]["err"]
    assert found["term"]["code"] == -signal.SIGTERM and found["timeout"]
    assert found["kill"]["code"] == -signal.SIGKILL
    assert all(found[case]["kind"] == "ForkedChild" for case in ("exit3", "raise", "term"))
    # Another environment than the starter's (read as TensorFlow was imported): spawned.
    assert found["other_env"]["kind"] == "Popen" and found["other_env"]["code"] == 0
    assert found["unsafe_after"] is not None  # TensorFlow's threads, its context
    assert found["after_op"]["kind"] == "Popen" and found["after_op"]["code"] == 0
    # A forked child keeps no descriptor of its parent's but 0, 1 and 2: any other is
    # /dev/null (or the listing's own, gone when read).
    assert set(first["others"]) <= {"/dev/null"}, first["others"]
    assert found["after_op"]["first"]["fds"][:3] == [0, 1, 2]


def test_forking_is_switched_off_by_its_variable_and_not_safe_after_an_op(monkeypatch):
    import tensorflow as tf

    from beatloop import forking

    tf.constant(1.0) + 1.0
    assert forking.unsafe_reason() is not None  # TensorFlow's threads run, its context
    monkeypatch.setenv(forking.SWITCH, "0")
    assert forking.unsafe_reason() == "BEATLOOP_FORK_TRIALS=0"
    with forking.forked_children():  # none forked: popen spawns
        process = forking.popen([sys.executable, "-c", "pass"])
        assert process.wait(timeout=120) == 0 and type(process).__name__ == "Popen"
    assert os.environ[forking.SWITCH] == "0"
