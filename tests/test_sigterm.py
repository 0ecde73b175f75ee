"""SIGTERM (what kill, Slurm, Docker and Kubernetes send) is taken like Ctrl-C: a
checkpoint at the next call boundary, then ``RunInterrupted`` with exit code 143; the
same run again resumes and ends bit-identical to an uninterrupted one. A second signal
stops at once."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from helpers import (
    all_weights,
    assert_same_weights,
    history_records,
    model_weights,
    start_python,
    worker,
)

import beatloop

WORKER = Path(__file__).parent / "workers" / "run_dir_run.py"
run_dir_run = worker("run_dir_run")
CONFIG = {"hidden": 8, "batch_size": 256}  # 6 steps an epoch on the built-in digits


class Terminate(beatloop.Callback):
    """Sends this process SIGTERM ``times`` times once a call ends at ``step`` (steps
    run one per call)."""

    def __init__(self, step: int, times: int = 1):
        self.step, self.times = step, times

    def on_execution_end(self, run, steps, logs):
        if run.step == self.step:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGTERM)


def tiny_run(run_dir: Path, epochs: int = 2, callbacks=()):
    return beatloop.fit(
        "supervised", epochs=epochs, seed=1, config=CONFIG, run_dir=run_dir, progress=False,
        steps_per_execution=1, callbacks=list(callbacks),
    )  # fmt: skip


def test_sigterm_checkpoints_stops_with_143_and_the_run_resumes_exactly(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(beatloop.RunInterrupted) as stopped:
        tiny_run(tmp_path / "run", callbacks=[Terminate(8)])
    error = stopped.value
    assert error.exit_code == 143 and error.signal == signal.SIGTERM
    assert str(error).startswith("stopped by SIGTERM at step 8, in epoch 2; checkpoint saved")
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    restored = beatloop.restore(tmp_path / "run")
    assert restored.steps == 8 and restored.checkpoint == error.checkpoint
    # A resume describes where it is in the same words as the stop did.
    assert restored.engine.counters.where() == "step 8, in epoch 2"

    resumed = tiny_run(tmp_path / "run")
    straight = tiny_run(tmp_path / "straight")
    assert resumed.resumed_from == error.checkpoint and resumed.steps == 12
    assert_same_weights(
        model_weights(resumed.models["model"]), model_weights(straight.models["model"])
    )
    assert history_records(tmp_path / "run") == history_records(tmp_path / "straight")


def test_a_second_sigterm_stops_at_once_without_a_checkpoint(tmp_path):
    with pytest.raises(beatloop.RunInterrupted) as stopped:
        tiny_run(tmp_path / "run", callbacks=[Terminate(3, times=2)])
    assert stopped.value.checkpoint is None and stopped.value.exit_code == 143
    assert "stopped at once by a second SIGTERM" in str(stopped.value)
    assert beatloop.restore(tmp_path / "run").steps == 0  # the start's checkpoint only


def test_ctrl_c_keeps_its_exit_code():
    from beatloop.core.failures.errors import EXIT_CODES, RunInterrupted

    assert RunInterrupted("interrupted", None).exit_code == 130
    assert RunInterrupted("stopped", None, signal.SIGTERM).exit_code == 143
    assert "SIGTERM" in EXIT_CODES[143] and "Ctrl-C" in EXIT_CODES[130]


@pytest.mark.slow
def test_a_process_sent_sigterm_mid_epoch_exits_143_and_resumes_bit_identical(tmp_path):
    spec = {"recipe": "supervised", "config": {"batch_size": 64, "dropout": 0.3}, "epochs": 2}
    spec |= {"seed": 3, "checkpoint_every": 8}  # 23 steps an epoch
    run = {**spec, "run_dir": str(tmp_path / "run"), "out": str(tmp_path / "run.npz")}
    stopped = start_python(WORKER, json.dumps({**run, "signal_at": [30, "SIGTERM"]}))
    try:  # the uninterrupted run is fitted here meanwhile: no process needed
        full = run_dir_run.fit({**spec, "run_dir": str(tmp_path / "full")})
    finally:
        out, err = stopped.communicate(timeout=300)
    assert stopped.returncode == 143, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["interrupted"].startswith("stopped by SIGTERM at step 30, in epoch 2")
    assert summary["checkpoint"].endswith("ckpt-6")  # steps 0, 8, 16, 23, 24, then 30
    assert not (tmp_path / "run.npz").exists()

    again = run_dir_run.fit(run)  # the same run again, fitted here
    assert {"steps": again.steps, "resumed_from": again.resumed_from} == {
        "steps": 46, "resumed_from": summary["checkpoint"]}  # fmt: skip
    assert_same_weights(all_weights(again.models), all_weights(full.models))
    assert history_records(tmp_path / "run") == history_records(tmp_path / "full")


@pytest.mark.slow
def test_beatloop_run_sent_sigterm_exits_143_with_a_checkpoint(tmp_path):
    import time

    run_dir = tmp_path / "run"
    command = ["-m", "beatloop", "run", "supervised", "--epochs", "200", "--seed", "0"]
    command += ["--run-dir", str(run_dir), "--quiet", "--set", "batch_size=64"]
    process = start_python(*command)
    deadline = time.monotonic() + 180
    while not (run_dir / "history.jsonl").exists():  # training is under way
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=180)
    assert "stopped by SIGTERM at step" in err and "Traceback" not in err, err
    step = int(err.split("stopped by SIGTERM at step ")[1].split(",")[0])
    assert beatloop.restore(run_dir).steps == step  # the checkpoint holds that moment
    assert process.returncode == 143, err
