"""One writer per run dir: a run holds an flock on ``RUN_DIR/.lock`` for its life; a
second run on the same run dir is refused at once (exit 5), naming the holder, and the
first run goes on as if alone. The lock file is left as it was found."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import (
    all_weights,
    assert_same_weights,
    history_records,
    load_npz,
    start_python,
    worker,
)

WORKER = Path(__file__).parent / "workers" / "run_dir_run.py"
run_dir_run = worker("run_dir_run")


def snapshot(path: Path) -> dict | None:
    """Every file and folder under ``path`` with its bytes (``None``: ``path`` is absent)."""
    if not path.exists():
        return None
    return {
        str(p.relative_to(path)): (p.read_bytes() if p.is_file() else "folder")
        for p in sorted(path.rglob("*"))
    }


def test_a_held_run_dir_is_refused_naming_the_holder_and_the_lock_file_is_put_back(tmp_path):
    from beatloop.core.failures.errors import RunDirError
    from beatloop.core.saving.run_lock import RunDirLock

    run_dir = tmp_path / "new" / "run"
    with RunDirLock.acquire(run_dir) as lock:
        assert lock.created_dir
        held = json.loads((run_dir / ".lock").read_text())
        assert held["pid"] == os.getpid()
        with pytest.raises(RunDirError) as refused:  # a second open file: a second run
            RunDirLock.acquire(run_dir)
        message = str(refused.value)
        assert f"the run dir {run_dir} is in use by another run (pid {os.getpid()} on " in message
        assert f"started {held['started']}" in message and "--run-dir" in message
        assert refused.value.exit_code == 5
    assert not (tmp_path / "new").exists()  # the lock file and the folders made for it go

    run_dir.mkdir(parents=True)
    (run_dir / ".lock").write_bytes(b"left by a killed run\n")  # flock went with it
    with RunDirLock.acquire(run_dir) as lock:
        assert not lock.created_dir
        assert json.loads((run_dir / ".lock").read_text())["pid"] == os.getpid()
    assert (run_dir / ".lock").read_bytes() == b"left by a killed run\n"


def test_fit_is_refused_on_a_held_run_dir_and_leaves_it_as_it_was(tmp_path):
    import beatloop
    from beatloop.core.failures.errors import RunDirError
    from beatloop.core.saving.run_lock import RunDirLock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    with RunDirLock.acquire(run_dir):
        before = snapshot(run_dir)
        with pytest.raises(RunDirError, match=f"pid {os.getpid()}"):
            beatloop.fit("supervised", epochs=1, seed=0, run_dir=run_dir)
        assert snapshot(run_dir) == before
    assert snapshot(run_dir) == {"notes.txt": b"mine"}


def test_a_run_that_fails_at_its_first_step_leaves_no_lock_behind(tmp_path):
    import numpy as np

    import beatloop
    from beatloop.datasets import batches

    # A label out of range: the first step fails.
    data = batches({"x": np.zeros((8, 64), "float32"), "y": np.full(8, 12, "int64")}, 8)
    for run_dir in (tmp_path / "new", tmp_path / "existing"):
        if run_dir.name == "existing":
            run_dir.mkdir()
            (run_dir / "notes.txt").write_text("mine")
        before = snapshot(run_dir)
        with pytest.raises(beatloop.DataError):
            beatloop.fit("supervised", data=data, epochs=1, seed=0, run_dir=run_dir)
        assert snapshot(run_dir) == before


@pytest.mark.slow
def test_a_second_run_on_a_run_dir_in_use_is_refused_and_the_first_goes_on_alone(tmp_path):
    spec = {"recipe": "supervised", "config": {"batch_size": 64}, "epochs": 2, "seed": 3}
    shared, paused, go = tmp_path / "shared", tmp_path / "paused", tmp_path / "go"
    first = start_python(WORKER, json.dumps({
        **spec, "run_dir": str(shared), "out": str(tmp_path / "first.npz"),
        "pause_at": 5, "paused_file": str(paused), "go_file": str(go),
    }))  # fmt: skip
    try:  # the same run alone, fitted here meanwhile: no process needed
        alone = run_dir_run.fit({**spec, "run_dir": str(tmp_path / "alone")})
    except BaseException:
        first.kill()
        raise
    deadline = time.monotonic() + 240
    while not paused.exists():  # the first run holds the run dir, mid-epoch
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.2)
    command = ["-m", "beatloop", "run", "supervised", "--epochs", "2", "--seed", "3"]
    command += ["--set", "batch_size=64", "--run-dir", str(shared), "--quiet"]
    second = start_python(*command)
    _, second_err = second.communicate(timeout=240)
    go.write_text("")

    assert second.returncode == 5, second_err
    (line,) = second_err.strip().splitlines()
    assert line.startswith(f"beatloop: error: the run dir {shared} is in use by another run")
    assert f"(pid {first.pid} on " in line
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    # The first run's files are its own, and it ended as a run alone does.
    assert [row["epoch"] for row in history_records(shared)] == [1, 2]
    assert history_records(shared) == history_records(tmp_path / "alone")
    assert json.loads((shared / "run.json").read_text())["epochs_asked"] == [2]
    assert_same_weights(load_npz(tmp_path / "first.npz"), all_weights(alone.models))
    assert not (shared / ".lock").exists()
