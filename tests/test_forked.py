"""The tests' forked children (``forked.py``, ``zygote.py``) behave as ``python ARGS``
started afresh would, in every way the tests that start them rely on: arguments, working
dir, environment, standard streams, exit statuses, signals, what runs at exit, and a
random state of their own."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from forked import ForkedProcess
from helpers import run_python, start_python

SHOW = """
import json, os, random, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                  "cluster": os.environ.get("TF_CONFIG"), "name": __name__,
                  "random": random.random()}))
print("to stderr", file=sys.stderr)
"""

AT_EXIT = """
import atexit, threading, time
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished"))).start()
"""


@pytest.mark.slow
def test_a_forked_child_is_python_args_with_its_own_argv_cwd_env_streams_and_random(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    first = start_python(script, "a", "b", TF_CONFIG='{"task": {}}')
    assert isinstance(first, ForkedProcess)  # else this test checks nothing of forked.py
    out, err = first.communicate(timeout=120)
    shown = json.loads(out)
    assert shown["argv"] == [str(script), "a", "b"] and shown["name"] == "__main__"
    assert shown["cwd"] == str(tmp_path) and shown["path0"] == str(tmp_path)
    assert shown["cluster"] == '{"task": {}}' and err == "to stderr\n"
    again = json.loads(run_python("-c", SHOW, "x"))
    assert again["argv"] == ["-c", "x"] and again["path0"] == "" and again["cluster"] is None
    assert again["random"] != shown["random"]  # reseeded, not the zygote's state


@pytest.mark.slow
def test_a_forked_child_exits_signals_and_finishes_as_a_fresh_interpreter():
    assert start_python("-c", "import sys; sys.exit(3)").wait(60) == 3
    assert start_python("-c", "import sys; sys.exit('no')").communicate(60)[1] == "no\n"
    raised = start_python("-c", "raise ValueError('boom')")
    assert raised.communicate(60)[1].endswith("ValueError: boom\n") and raised.returncode == 1
    assert run_python("-c", AT_EXIT).splitlines() == ["thread finished", "atexit ran"]
    asleep = start_python("-c", "import time; print('up', flush=True); time.sleep(60)")
    time.sleep(1)
    started = time.monotonic()
    asleep.send_signal(signal.SIGKILL)
    assert asleep.wait(10) == -signal.SIGKILL and time.monotonic() - started < 5
    asleep = start_python("-c", "import time; time.sleep(60)")
    with pytest.raises(subprocess.TimeoutExpired):
        asleep.wait(0.2)
    asleep.kill()
    assert asleep.wait(10) == -signal.SIGKILL


@pytest.mark.slow
def test_a_child_that_must_start_afresh_is_not_forked():
    fresh = start_python("-c", "import sys; print('tensorflow' in sys.modules)", fresh=True)
    assert isinstance(fresh, subprocess.Popen) and fresh.communicate(120)[0] == "False\n"
    forked = start_python("-c", "import sys; print('tensorflow' in sys.modules)")
    assert forked.communicate(120)[0] == "True\n"  # the zygote's import
    other = start_python("-c", "pass", TF_ENABLE_ONEDNN_OPTS="0")  # read at import
    assert isinstance(other, subprocess.Popen) and other.wait(120) == 0


@pytest.mark.slow
def test_the_workers_of_one_cluster_differ_in_hash_seed_as_separate_interpreters_do():
    def hashed(**env) -> str:
        return run_python("-c", "print(hash('beatloop'))", **env)

    def cluster(index: int) -> str:
        return json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"index": index}})

    assert hashed(TF_CONFIG=cluster(0)) != hashed(TF_CONFIG=cluster(1))
    assert hashed(TF_CONFIG=cluster(1)) == hashed(TF_CONFIG=cluster(1))  # one zygote's
