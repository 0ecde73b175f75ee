"""Checkpoints and resume: a run killed mid-epoch (a real SIGKILL) and resumed ends
bit-identical to one never interrupted; resumes of a different run are refused; a full
disk, a corrupt checkpoint, a torn history line, a save's leftovers and Ctrl-C leave a
run that can go on."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
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

WORKER = Path(__file__).parent / "workers" / "resumable_run.py"
BEATLOOP = Path(sys.executable).parent / "beatloop"
resumable_run = worker("resumable_run")

# 1,437 training digits in batches of 64: 23 steps an epoch. Checkpoints every 8 steps
# (8, 16, the epoch end at 23, 24, 32, ...); the kill at step 30 loses 6 steps.
RUNS = {
    "supervised": {"config": {"batch_size": 64, "dropout": 0.3}},
    "gan": {"config": {"batch_size": 64, "n_critic": 2, "quality_samples": 64}},
    # BYOL: the kill falls in the pretraining, with the EMA targets moving every step
    "contrastive": {"config": {"batch_size": 64, "target": "ema", "pretrain_epochs": 2}},
    # 92 sinusoid tasks in batches of 4: 23 steps an epoch too.
    "meta": {"config": {"batch_size": 4, "train_tasks": 92, "validation_tasks": 8}},
}
BASE = {"epochs": 2, "seed": 3, "checkpoint_every": 8}


def start_worker(spec: dict) -> subprocess.Popen:
    return start_python(WORKER, json.dumps(spec))


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(RUNS))
def test_a_run_killed_mid_epoch_resumes_bit_identical(tmp_path, recipe):
    spec = {**BASE, **RUNS[recipe], "recipe": recipe}
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    # The run to be killed has a process of its own; while it runs, the uninterrupted
    # one and then the resume are fitted here (the same bits as in a fresh process).
    killed = start_worker({**spec, "run_dir": str(killed_dir), "kill_at": 30, "out": "unused"})
    try:
        full = resumable_run.fit({**spec, "run_dir": str(full_dir)})
    finally:
        code, _, err = finish(killed)
    assert code == -signal.SIGKILL, err
    assert not (killed_dir / "unused").exists()
    assert len(history_records(killed_dir)) == 1  # epoch 1 finished, epoch 2 was cut short

    resumed = resumable_run.fit({**spec, "run_dir": str(killed_dir)})
    assert resumed.resumed_from.endswith("ckpt-5")  # steps 0, 8, 16, 23, 24
    assert resumed.steps == 46

    assert_same_weights(all_weights(resumed.models), all_weights(full.models))
    # Every logged figure, bit for bit.
    assert history_records(killed_dir) == history_records(full_dir)


def small_run(tmp_path, **overrides):
    """Two quick epochs of supervised on 320 digits, checkpointing into tmp_path/run."""
    import keras

    import beatloop
    from beatloop.datasets import batches, digits_arrays

    # A seeded shuffle's order also depends on TensorFlow's global seed when the data
    # set is built: set it first, as fit does before it builds a recipe's own data.
    keras.utils.set_random_seed(1)
    train, validation = digits_arrays(seed=0)
    data = (
        batches({k: v[:320] for k, v in train.items()}, 32, shuffle_seed=1),
        batches({k: v[:64] for k, v in validation.items()}, 32),
    )
    options = {"epochs": 2, "seed": 1, "checkpoint_every": 4, "run_dir": tmp_path / "run"}
    return beatloop.fit("supervised", data=data, **{**options, **overrides})


def test_a_finished_run_continues_and_a_different_one_is_refused(tmp_path):
    from beatloop.core.failures.errors import CheckpointError

    first = small_run(tmp_path)
    assert first.steps == 20 and first.resumed_from is None
    # What saves and rewrites killed half-way leave behind goes when the next run starts.
    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / "ckpt-9_temp").mkdir()
    (checkpoints / "ckpt-9_temp" / "part-00000-of-00001.index").write_bytes(b"")
    (checkpoints / "checkpoint.partial").write_text("model_checkpoint_path: ")
    (tmp_path / "run" / "run.json.tmp").write_text("{")
    more = small_run(tmp_path, epochs=3, seed=None)  # the seed comes from the checkpoint
    assert not list(checkpoints.glob("*_temp")) and not list(checkpoints.glob("*.partial"))
    assert not (tmp_path / "run" / "run.json.tmp").exists()
    assert more.seed == 1 and more.steps == 30 and more.epochs == 3
    assert more.resumed_from == first.checkpoint
    assert len(more.history["loss"]) == 3
    assert more.history["loss"][:2] == first.history["loss"]
    assert [row["epoch"] for row in history_records(tmp_path / "run")] == [1, 2, 3]

    with pytest.raises(CheckpointError, match=r"config\.hidden is 64 in the checkpoint but 32"):
        small_run(tmp_path, epochs=4, config={"hidden": 32})
    with pytest.raises(CheckpointError, match="seed is 1 in the checkpoint but 2 now"):
        small_run(tmp_path, epochs=4, seed=2)
    import beatloop

    with pytest.raises(CheckpointError) as refused:
        beatloop.fit("risk_weighted", epochs=4, seed=1, run_dir=tmp_path / "run")
    message = str(refused.value)  # one line, naming the recipes and nothing else
    assert message.startswith("this run dir holds a 'supervised' run; you asked for 'risk_w")
    assert "\n" not in message and "config" not in message and "seed" not in message
    # Nothing was touched by the refusals: the run still resumes where it was.
    assert beatloop.restore(tmp_path / "run").steps == 30


def test_a_corrupt_latest_checkpoint_falls_back_to_the_one_before(tmp_path):
    import beatloop

    first = small_run(tmp_path, epochs=1)
    directory = tmp_path / "run" / "checkpoints"
    latest = Path(first.checkpoint)
    data_file = next(directory.glob(latest.name + ".data-*"))
    blob = bytearray(data_file.read_bytes())
    blob[: len(blob) // 2] = b"\xff" * (len(blob) // 2)
    data_file.write_bytes(bytes(blob))

    with pytest.warns(RuntimeWarning, match=f"{latest.name} could not be read"):
        restored = beatloop.restore(tmp_path / "run")
    assert restored.checkpoint == str(latest)  # the index still lists it; it was skipped
    assert restored.steps == 8  # the checkpoint before the epoch's end (step 10)
    with pytest.warns(RuntimeWarning, match="could not be read"):
        resumed = small_run(tmp_path, epochs=1)
    assert resumed.resumed_from.endswith("ckpt-3") and resumed.steps == 10
    # The damaged ckpt-4 does not count toward the three kept: ckpt-2 stays.
    assert checkpoint_names(directory) == ["ckpt-2", "ckpt-3", "ckpt-4", "ckpt-5"]
    longer = small_run(tmp_path, epochs=2)  # once three good ones are newer, it goes
    assert longer.steps == 20
    assert checkpoint_names(directory) == ["ckpt-6", "ckpt-7", "ckpt-8"]


def checkpoint_names(directory: Path) -> list[str]:
    """The checkpoints on disk and in the index, which must agree."""
    import tensorflow as tf

    on_disk = sorted(p.stem for p in directory.glob("ckpt-*.index"))
    listed = tf.train.get_checkpoint_state(str(directory)).all_model_checkpoint_paths
    assert [Path(p).name for p in listed] == on_disk
    return on_disk


def test_a_torn_last_history_line_is_dropped_and_the_resume_is_exact(tmp_path):
    import beatloop

    straight = small_run(tmp_path, callbacks=[beatloop.CsvLogger()])
    run_dir = tmp_path / "run"
    jsonl, csv = run_dir / "history.jsonl", run_dir / "history.csv"
    rows, table = jsonl.read_bytes(), csv.read_bytes()
    # As if killed while writing epoch 2's rows: its end-of-epoch checkpoint (ckpt-7,
    # step 20) was never written, and the last line of each file is cut short.
    for leftover in (run_dir / "checkpoints").glob("ckpt-7.*"):
        leftover.unlink()
    (run_dir / "checkpoints" / "checkpoint").unlink()
    jsonl.write_bytes(rows[: rows.rindex(b"\n", 0, -1) + 30])
    csv.write_bytes(table[:-9])
    with pytest.warns(RuntimeWarning) as warned:
        resumed = small_run(tmp_path, callbacks=[beatloop.CsvLogger()])
    notices = sorted(str(warning.message) for warning in warned)
    assert [notice.split(": ")[0] for notice in notices] == [str(csv), str(jsonl)]
    assert all("dropped 1 torn line(s)" in notice for notice in notices)
    assert resumed.resumed_from.endswith("ckpt-6") and resumed.steps == 20  # from step 16
    assert jsonl.read_bytes() == rows and csv.read_bytes() == table
    assert_same_weights(
        model_weights(resumed.models["model"]), model_weights(straight.models["model"])
    )


@pytest.mark.slow
def test_a_full_disk_fails_clearly_and_keeps_the_checkpoints_before(tmp_path):
    import beatloop

    spec = {**BASE, **RUNS["supervised"], "recipe": "supervised", "full_disk_at": 26}
    run_dir = tmp_path / "run"
    code, out, _ = finish(start_worker({**spec, "run_dir": str(run_dir), "out": "unused"}))
    assert code == 2
    assert "CheckpointError: could not write checkpoint ckpt-6" in out
    assert "earlier checkpoints are intact (ckpt-3, ckpt-4, ckpt-5)" in out
    assert not list((run_dir / "checkpoints").glob("ckpt-6*"))  # no partial files left
    restored = beatloop.restore(run_dir)  # the newest good checkpoint still loads
    assert restored.steps == 24 and restored.checkpoint.endswith("ckpt-5")


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    import beatloop

    run_dir = tmp_path / "run"
    command = [str(BEATLOOP), "run", "supervised", "--epochs", "200", "--seed", "0"]
    command += ["--run-dir", str(run_dir), "--quiet", "--set", "batch_size=64"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run_dir / "history.jsonl").exists():  # training is under way
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "interrupted at step" in err and "Traceback" not in err
    step = int(err.split("interrupted at step ")[1].split(",")[0])
    restored = beatloop.restore(run_dir)
    assert restored.steps == step  # the checkpoint holds the moment it stopped
    assert restored.checkpoint in err


def test_learning_rate_schedules_and_optimizer_state_resume(tmp_path):
    import keras

    def adam():
        rate = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=3, decay_rate=0.5)
        return {"optimizer": keras.optimizers.Adam(rate)}

    straight = small_run(tmp_path / "straight", optimizers=adam())
    small_run(tmp_path / "split", optimizers=adam(), epochs=1)
    resumed = small_run(tmp_path / "split", optimizers=adam())
    assert resumed.resumed_from is not None and resumed.steps == straight.steps == 20
    optimizer = resumed.optimizers["optimizer"]
    assert int(optimizer.iterations) == 20
    assert float(optimizer.learning_rate) == pytest.approx(0.01 * 0.5 ** (20 / 3))
    assert_same_weights(
        model_weights(resumed.models["model"]), model_weights(straight.models["model"])
    )


def test_a_run_dir_where_checkpoints_cannot_go_is_refused_before_training(tmp_path):
    from beatloop.core.failures.errors import RunDirError

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").write_text("a file, not a folder")
    with pytest.raises(RunDirError, match=r"checkpoints is a file, not the run's checkpoint"):
        small_run(tmp_path, epochs=1)
    assert (tmp_path / "run" / "checkpoints").read_text() == "a file, not a folder"


def test_callback_state_survives_the_checkpoint_round_trip():
    import keras

    from beatloop import EarlyStopping
    from beatloop.core.events.callbacks import Run
    from beatloop.core.running.pacing import FixedPace

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    bound = type("Bound", (), {"models": {"model": model}})()  # all Run.models reads
    run = Run(None, bound, None, None, 1, FixedPace(1), None, 0)
    stopping = EarlyStopping(monitor="val_loss", patience=2)
    stopping.on_epoch_end(run, 0, {"val_loss": 0.5})
    best = model_weights(model)
    stopping.on_epoch_end(run, 1, {"val_loss": 0.7})
    saved = json.loads(json.dumps(stopping.checkpoint_state()))
    again = EarlyStopping(monitor="val_loss", patience=2)
    again.restore_state(saved)
    assert (again.best, again.best_epoch, again._waited) == (0.5, 0, 1)
    model.set_weights([w + 1.0 for w in best])
    again.on_epoch_end(run, 2, {"val_loss": 0.9})  # patience runs out after the resume
    assert run.stop_training
    again.on_fit_end(run, {})
    assert_same_weights(model_weights(model), best)
