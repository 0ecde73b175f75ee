"""Multi-worker runs from the command line: three worker processes on 127.0.0.1
(``beatloop run ... --strategy multi_worker``, TF_CONFIG each) given one ``--run-dir``.
The chief writes it, the other workers write only temporary dirs removed at the end;
they train to the one-device weights; one worker SIGKILLed mid-epoch stops the others
with a WorkerLostError (exit 6) within the documented time, and starting all three
again with the same command ends bit-identical to the uninterrupted run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import start_python
from test_distribution import free_ports

from beatloop.cli import main

WORKER = Path(__file__).parent / "workers" / "cluster_run.py"
WORKERS = 3
#: What each recipe's runs are given besides the data, the run dir and the strategy:
#: 320 training digits, batches of 32 (10 steps an epoch), calls of 2 steps; the gan's
#: unshuffled (reshuffled, its one-device run takes the batches in another order).
SETTINGS = {
    "supervised": ["--set", "optimizer=sgd", "--set", "learning_rate=0.1"],
    "gan": ["--set", "n_critic=2", "--set", "quality_samples=32", "--data-set", "shuffle=false"],
}
#: What the chief writes in the run dir (the lock file goes when the run ends).
WRITTEN = {
    "supervised": {"run.json", "history.jsonl", "checkpoints"},
    "gan": {
        "run.json", "history.jsonl", "checkpoints", "samples", "samples.png",
        "digits_classifier.weights.h5",
    },
}  # fmt: skip
#: The documented bound on how long the surviving workers take to stop (docs/distribution.md).
STOP_SECONDS = 30


def digits_npz(path: Path, recipe: str) -> Path:
    """The first 320 digits, as the recipe takes them."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images[:320].reshape(-1, 64) / 16.0).astype(np.float32)
    if recipe == "gan":
        np.savez(path, x=2 * x - 1)
    else:
        np.savez(path, x=x, y=digits.target[:320].astype(np.int64))
    return path


def command(recipe: str, data: Path, run_dir: Path, *, cluster: bool = True) -> list[str]:
    """``beatloop run``'s arguments (after ``run``), the same for every worker."""
    args = [
        recipe, "--data", f"npz:{data}", "--epochs", "2", "--seed", "7", "--run-dir",
        str(run_dir), "--steps-per-execution", "2", "--checkpoint-every", "2", "--quiet",
        *SETTINGS[recipe],
    ]  # fmt: skip
    return [*args, "--strategy", "multi_worker"] if cluster else args


def start_cluster(args: list[str], scratch: Path, kill_when: Path | None = None) -> list:
    """Three workers on free ports, each with its own TMPDIR under ``scratch``
    (``scratch/tmpN``); worker 2 SIGKILLs itself once ``kill_when`` exists. Both are
    the worker script's options, not the environment, so the workers fork from a zygote
    with TensorFlow imported instead of importing it each."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(WORKERS)]}
    processes = []
    for index in range(WORKERS):
        temporary = scratch / f"tmp{index}"
        temporary.mkdir(parents=True, exist_ok=True)
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        own = ["--tmpdir", str(temporary)]
        if kill_when is not None and index == WORKERS - 1:
            own += ["--kill-when", str(kill_when)]
        processes.append(start_python(WORKER, *own, *args, TF_CONFIG=json.dumps(config)))
    return processes


def finish(processes: list, timeout: float = 240) -> list[tuple[int, str, str]]:
    """Every process's (exit code, stdout, stderr); all killed on a hang."""
    try:
        outputs = [process.communicate(timeout=timeout) for process in processes]
        return [(p.returncode, *output) for p, output in zip(processes, outputs, strict=True)]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()


def succeeded(results) -> None:
    for code, _, err in results:
        assert code == 0, err[-3000:]


def checkpoint_tensors(run_dir: Path) -> dict[str, np.ndarray]:
    """Every numeric tensor of the run dir's latest checkpoint, by checkpoint key."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))
    tensors = {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()}
    numeric = {key: np.asarray(value) for key, value in tensors.items()}
    return {key: value for key, value in numeric.items() if value.dtype.kind in "biuf"}


def model_weights(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {key: value for key, value in tensors.items() if key.startswith("model_variables/")}


_RUNS: dict[str, dict] = {}


def uninterrupted(recipe: str, tmp_path_factory) -> dict:
    """The recipe's three-worker run and its one-device twin (run once per session):
    ``{"cluster": run dir, "single": run dir, "results": per worker, "scratch": dir}``."""
    if recipe not in _RUNS:
        base = tmp_path_factory.mktemp(f"{recipe}-uninterrupted")
        data = digits_npz(base / "digits.npz", recipe)
        cluster = start_cluster(command(recipe, data, base / "run"), base)
        try:  # the one-device twin in this process while the workers train
            assert main(["run", *command(recipe, data, base / "single", cluster=False)]) == 0
        finally:
            results = finish(cluster)
        succeeded(results)
        _RUNS[recipe] = {
            "base": base, "data": data, "cluster": base / "run", "single": base / "single",
            "results": results,
        }  # fmt: skip
    return _RUNS[recipe]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["supervised", "gan"])
def test_three_workers_train_like_one_device_and_only_the_chief_writes(recipe, tmp_path_factory):
    run = uninterrupted(recipe, tmp_path_factory)
    run_dir = run["cluster"]
    assert {path.name for path in run_dir.iterdir()} == WRITTEN[recipe]
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in history] == [1, 2]  # one writer: each epoch once
    assert json.loads((run_dir / "run.json").read_text())["epochs"] == 2
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.index")) == [
        "ckpt-10.index", "ckpt-11.index", "ckpt-9.index",
    ]  # fmt: skip
    for index in range(WORKERS):  # the other workers' temporary dirs are gone
        assert list((run["base"] / f"tmp{index}").iterdir()) == []
    # Every worker reports the chief's run dir and checkpoint, not its own dir.
    for _, out, _ in run["results"]:
        assert f"checkpoint: {run_dir / 'checkpoints' / 'ckpt-11'}" in out
    cluster, single = checkpoint_tensors(run_dir), checkpoint_tensors(run["single"])
    moved = model_weights(cluster)
    assert sorted(moved) == sorted(model_weights(single))
    # Three share-of-batch gradients summed instead of one: float32 round-off, against
    # weights that training moved far more.
    largest = max(float(np.abs(moved[key] - single[key]).max()) for key in moved)
    assert largest < 1e-5, largest
    assert cluster["state/step/.ATTRIBUTES/VARIABLE_VALUE"] == 20


@pytest.mark.slow
def test_a_worker_killed_mid_epoch_stops_the_others_and_all_resume_exactly(tmp_path_factory):
    reference = uninterrupted("gan", tmp_path_factory)
    base = tmp_path_factory.mktemp("gan-killed")
    run_dir = base / "run"
    args = command("gan", reference["data"], run_dir)
    trigger = run_dir / "checkpoints" / "ckpt-8.index"  # step 14, mid-epoch 2
    processes = start_cluster(args, base, kill_when=trigger)
    while not trigger.exists() and all(p.poll() is None for p in processes):
        time.sleep(0.005)
    killed_at = time.monotonic()
    results = finish(processes, timeout=120)
    stopped = time.monotonic() - killed_at
    print(f"the survivors stopped {stopped:.1f} s after the kill")
    assert results[WORKERS - 1][0] == -9  # the one killed
    for code, _, err in results[: WORKERS - 1]:
        assert code == 6, err[-3000:]
        assert "of the 3 workers was lost at step" in err, err[-3000:]
        assert "start all 3 workers again with the same command to resume" in err
        assert "Traceback" not in err
    chief_error = results[0][2]
    assert "worker 2 of the 3 workers was lost" in chief_error
    assert f"the run dir {run_dir} holds its last checkpoint, ckpt-" in chief_error
    assert stopped < STOP_SECONDS, stopped
    for index in range(WORKERS - 1):  # the survivors' temporary dirs are gone
        assert list((base / f"tmp{index}").iterdir()) == []

    restarted = finish(start_cluster(args, base))
    succeeded(restarted)
    assert "resumed from ckpt-" in restarted[0][1]
    assert {path.name for path in run_dir.iterdir()} == WRITTEN["gan"]
    resumed, whole = checkpoint_tensors(run_dir), checkpoint_tensors(reference["cluster"])
    assert sorted(resumed) == sorted(whole)
    slots = [key for key in whole if key.startswith("optimizers/d_optimizer/_variables/")]
    assert len(slots) == 12  # Adam's two slots for each of the discriminator's 6 variables
    for key in whole:  # every weight, optimizer slot, counter and generator state
        if key.startswith("metrics/"):
            # Figures only: a synchronised-on-read accumulator is saved as the sum over
            # the workers and restored as a third of it on each, so the sum read back
            # may move by one float32 unit in the last place.
            np.testing.assert_allclose(resumed[key], whole[key], rtol=2e-7, err_msg=key)
        else:
            np.testing.assert_array_equal(resumed[key], whole[key], err_msg=key)


# TensorFlow's words, as the surviving workers received them (TF 2.21, 127.0.0.1).
RESET = (
    "Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error "
    "information from remote target /job:worker/replica:0/task:2 while calling "
    "/tensorflow.WorkerService/RecvBuf:\n:UNKNOWN:Error received from peer\nAdditional GRPC "
    "error information from remote target /job:worker/replica:0/task:0 while calling "
    "/tensorflow.WorkerService/RecvBuf"
)
HEARTBEATS = (
    "Collective ops is aborted by: Error reported from /job:worker/task:1: The following "
    "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:2\nThe "
    "tasks have crashed."
)


def test_a_lost_worker_is_named_from_tensorflows_words(tmp_path):
    import tensorflow as tf

    from beatloop.core.devices.workers import Worker, lost_worker_error
    from beatloop.core.failures.errors import DataError

    chief, second = Worker("worker", 0, 3), Worker("worker", 1, 3)
    assert chief.is_chief and not second.is_chief
    assert Worker("worker", 0, 3, has_chief_task=True).is_chief is False
    assert Worker("chief", 0, 3, has_chief_task=True).is_chief
    for message, worker in ((RESET, second), (HEARTBEATS, chief)):
        error = tf.errors.UnavailableError(None, None, message)
        lost = lost_worker_error(
            DataError("wrapped"), worker, where="x", run_dir=None, checkpoint=None
        )
        assert lost is None  # beatloop's own error, no TensorFlow one behind it
        lost = lost_worker_error(
            error, worker, where="step 14, in epoch 2", run_dir=tmp_path,
            checkpoint=str(tmp_path / "checkpoints" / "ckpt-8"),
        )  # fmt: skip
        assert str(lost).startswith("worker 2 of the 3 workers was lost at step 14, in epoch 2")
        assert f"the run dir {tmp_path} holds its last checkpoint, ckpt-8" in str(lost)
        assert lost.exit_code == 6 and lost.original is error
    # The error reached through another one's cause (a checkpoint that could not be saved).
    try:
        try:
            raise tf.errors.UnavailableError(None, None, RESET)
        except tf.errors.OpError as error:
            raise OSError("could not write") from error
    except OSError as wrapped:
        assert lost_worker_error(wrapped, chief, where="a step", run_dir=None, checkpoint=None)
    # One worker alone, or an error naming no task: not a lost worker.
    alone = tf.errors.UnavailableError(None, None, RESET)
    assert lost_worker_error(alone, Worker(), where="x", run_dir=None, checkpoint=None) is None
    plain = tf.errors.UnavailableError(None, None, "a file system is unavailable")
    assert lost_worker_error(plain, chief, where="x", run_dir=None, checkpoint=None) is None


def test_only_the_chief_writes_the_run_dir_and_the_others_temporary_dirs_go(tmp_path):
    from beatloop.core.devices.workers import Worker, write_dir

    with write_dir(tmp_path / "run", Worker("worker", 0, 3)) as written:
        assert written == tmp_path / "run"
    with pytest.raises(RuntimeError), write_dir(tmp_path / "run", Worker("worker", 1, 3)) as other:
        assert other != tmp_path / "run" and other.is_dir()
        (other / "history.jsonl").write_text("{}\n")
        raise RuntimeError("the run failed")
    assert not other.exists()
