"""The best epoch (``keep_best``) through faults: a real SIGKILL at each moment of the
new best's save, mid-epoch checkpoints (``checkpoint_every``), a rollback after a NaN
(``on_nan="rollback"``) and a multi-worker run. After each, ``run.json`` names a whole
best that restores to the run stopped at that epoch, bit for bit, and the run goes on
to end as one never interrupted, with the same best.

The killed runs: supervised on its built-in digits (batches of 128, 3 steps an epoch, 4
epochs) at a learning rate of 0.4, whose validation loss falls at epochs 1, 2 and 4 and
rises at 3: new bests are saved at the ends of epochs 1, 2 and 4 (``ckpt-2``, ``ckpt-3``,
``ckpt-5``; ``ckpt-1`` is the start's), and with ``max_to_keep=1`` the best of epoch 2
is kept beside epoch 3's checkpoint until epoch 4's replaces both."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, history_records, start_python, worker

import beatloop

WORKER = Path(__file__).parent / "workers" / "best_run.py"
CLUSTER_WORKER = Path(__file__).parent / "workers" / "cluster_run.py"
best_run = worker("best_run")

SPEC = {
    "config": {"hidden": 24, "batch_size": 128, "learning_rate": 0.4},
    "epochs": 4,
    "seed": 0,
    "steps_per_epoch": 3,
    "keep_best": "val_loss:min",
    "max_to_keep": 1,
}


def best_of(run_dir: Path) -> dict | None:
    return json.loads((run_dir / "run.json").read_text()).get("best")


def checkpoint_names(run_dir: Path) -> list[str]:
    return sorted(p.name.removesuffix(".index") for p in (run_dir / "checkpoints").glob("*.index"))


def listed(run_dir: Path) -> list[str]:
    """The checkpoints the index (``checkpoints/checkpoint``) lists, oldest first."""
    state = tf.train.get_checkpoint_state(str(run_dir / "checkpoints"))
    return [Path(path).name for path in state.all_model_checkpoint_paths]


def checkpoint_tensors(path: Path) -> dict[str, object]:
    """Every tensor of one checkpoint (host state and run record included), by key."""
    reader = tf.train.load_checkpoint(str(path))
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()}


def assert_same_checkpoint(a: Path, b: Path) -> None:
    ours, theirs = checkpoint_tensors(a), checkpoint_tensors(b)
    assert sorted(ours) == sorted(theirs)
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


class References:
    """The uninterrupted run, and runs of the same seed stopped after N epochs (fitted
    once each, on first use)."""

    def __init__(self, root: Path):
        self.root = root
        self._stopped: dict[int, beatloop.FitResult] = {}

    def stopped(self, epochs: int) -> beatloop.FitResult:
        if epochs not in self._stopped:
            run_dir = self.root / f"stopped-{epochs}"
            self._stopped[epochs] = best_run.fit({**SPEC, "epochs": epochs, "run_dir": run_dir})
        return self._stopped[epochs]

    @property
    def full(self) -> beatloop.FitResult:
        return self.stopped(SPEC["epochs"])

    @property
    def full_dir(self) -> Path:
        return self.full.run_dir


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    return References(tmp_path_factory.mktemp("best-references"))


def test_the_runs_val_loss_makes_new_bests_at_epochs_1_2_and_4(references):
    losses = references.full.history["val_loss"]
    assert losses[1] < losses[0] and losses[2] > losses[1] and losses[3] < losses[1]
    assert references.full.best == best_of(references.full_dir)
    assert references.full.best["epoch"] == 4
    assert checkpoint_names(references.full_dir) == ["ckpt-5"]
    assert references.stopped(3).best["checkpoint"] == "ckpt-3"  # epoch 2's, kept
    assert checkpoint_names(references.stopped(3).run_dir) == ["ckpt-3", "ckpt-4"]


#: Each kill: where it falls (in the save of the new best of ``epoch``), the epoch of the
#: best ``run.json`` names after it, and what the checkpoints folder holds then.
KILLS = {
    # epoch 2's data file moved into place, its index not written: that save never was
    "data-2": ("data", 2, 1, {"ckpt-2", "ckpt-3.data-00000-of-00001", "ckpt-3_temp"}),
    # whole but not listed: the index still says ckpt-2 is the latest
    "whole-2": ("whole", 2, 1, {"ckpt-2", "ckpt-3"}),
    # saved and listed, run.json not yet rewritten: it names the former best, still there
    "listed-2": ("listed", 2, 1, {"ckpt-2", "ckpt-3"}),
    "listed-4": ("listed", 4, 2, {"ckpt-3", "ckpt-5"}),
    # run.json names the new best; the former one is not deleted yet
    "named-2": ("named", 2, 2, {"ckpt-2", "ckpt-3"}),
    "named-4": ("named", 4, 4, {"ckpt-3", "ckpt-5"}),
}
#: What the resume of a run killed in its last epoch's save says it put right: it has
#: nothing to train, and finishes the save's last steps.
TIDIED = {
    "listed-4": "run.json names the best epoch's checkpoint, ckpt-5; removed ckpt-3",
    "named-4": "removed ckpt-3",
}


def files_of(run_dir: Path) -> set[str]:
    """The checkpoints folder's entries, a checkpoint's ``.index`` and ``.data`` as one."""
    names = {p.name for p in (run_dir / "checkpoints").iterdir()} - {"checkpoint"}
    whole = {name.removesuffix(".index") for name in names if name.endswith(".index")}
    data = {name for name in names if name.split(".data-")[0] in whole}
    return {*whole, *(names - data - {f"{name}.index" for name in whole})}


@pytest.mark.slow
@pytest.mark.parametrize("moment", list(KILLS))
def test_a_kill_while_saving_a_new_best_leaves_a_whole_best_and_resumes_exactly(
    moment, references, tmp_path
):
    kill, epoch, named, files = KILLS[moment]
    run_dir = tmp_path / "run"
    spec = {**SPEC, "run_dir": str(run_dir)}
    process = start_python(WORKER, json.dumps({**spec, "kill": kill, "epoch": epoch}))
    _, err = process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL, err[-3000:]
    assert files_of(run_dir) == files
    # The newest checkpoint the index lists, which a resume goes on from: the new best's
    # once its save has listed it, else the epoch before's.
    latest = f"ckpt-{epoch + 1}" if kill in ("listed", "named") else f"ckpt-{epoch}"
    assert listed(run_dir)[-1] == latest
    best = best_of(run_dir)  # run.json parses, and names a best that is whole
    assert best["epoch"] == named
    restored = beatloop.restore(run_dir, best=True)
    stopped = references.stopped(named)
    assert restored.checkpoint == str(run_dir / "checkpoints" / best["checkpoint"])
    assert restored.best == best == {**stopped.best, "checkpoint": best["checkpoint"]}
    assert restored.history == stopped.history
    assert_same_weights(all_weights(restored.models), all_weights(stopped.models))

    if moment in TIDIED:
        said = rf"nothing to train, put right only what a kill .*\({TIDIED[moment]}\)"
        with pytest.warns(UserWarning, match=said):
            resumed = best_run.fit(spec)
    else:
        resumed = best_run.fit(spec)  # trains on to the end
    assert resumed.resumed_from == str(run_dir / "checkpoints" / latest)
    full, full_dir = references.full, references.full_dir
    assert resumed.best == full.best == best_of(run_dir)
    assert files_of(run_dir) == files_of(full_dir) == {"ckpt-5"}
    assert listed(run_dir) == listed(full_dir)
    assert history_records(run_dir) == history_records(full_dir)
    assert_same_weights(all_weights(resumed.models), all_weights(full.models))
    checkpoint = Path("checkpoints", full.best["checkpoint"])
    assert_same_checkpoint(run_dir / checkpoint, full_dir / checkpoint)


# --- mid-epoch checkpoints ------------------------------------------------------------------


class Stopped(BaseException):
    """Stops a run at a call boundary without a checkpoint (as a kill would there)."""


class StopAt(beatloop.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_execution_end(self, run, steps, logs):
        if run.step == self.step:
            raise Stopped


def host_state(checkpoint: Path) -> dict:
    return json.loads(checkpoint_tensors(checkpoint)["host/.ATTRIBUTES/VARIABLE_VALUE"])


def test_mid_epoch_checkpoints_prune_beside_the_best_and_a_resume_from_one_keeps_it(tmp_path):
    # Checkpoints every 2 steps, 3 steps an epoch: ckpt-1 at step 0, ckpt-2 at 2, epoch
    # 1's ckpt-3 at 3, ckpt-4 at 4, epoch 2's ckpt-5 at 6 (the best), ckpt-6 at 8, epoch
    # 3's ckpt-7 at 9 (val_loss above epoch 2's: not the best).
    spec = {**SPEC, "epochs": 3, "checkpoint_every": 2}
    full = best_run.fit({**spec, "run_dir": tmp_path / "full"})
    assert full.best["epoch"] == 2 and full.best["checkpoint"] == "ckpt-5"
    assert checkpoint_names(tmp_path / "full") == ["ckpt-5", "ckpt-7"]

    run_dir = tmp_path / "stopped"
    with pytest.raises(Stopped):  # at step 9, before epoch 3's end is saved
        best_run.fit({**spec, "run_dir": run_dir}, callbacks=[StopAt(9)])
    # The mid-epoch checkpoints were pruned as usual, the best kept beside the newest.
    assert checkpoint_names(run_dir) == ["ckpt-5", "ckpt-6"]
    assert best_of(run_dir) == full.best
    assert host_state(run_dir / "checkpoints" / "ckpt-6")["best"] == full.best

    # Resumed from step 8's mid-epoch checkpoint, epoch 3 is compared with epoch 2's
    # best (a resume that lost it would make epoch 3 the best).
    resumed = best_run.fit({**spec, "run_dir": run_dir})
    assert resumed.resumed_from == str(run_dir / "checkpoints" / "ckpt-6")
    assert resumed.best == full.best == best_of(run_dir)
    assert checkpoint_names(run_dir) == ["ckpt-5", "ckpt-7"]
    assert history_records(run_dir) == history_records(tmp_path / "full")
    assert_same_weights(all_weights(resumed.models), all_weights(full.models))
    assert_same_checkpoint(run_dir / "checkpoints" / "ckpt-5", tmp_path / "full/checkpoints/ckpt-5")


# --- rollback ------------------------------------------------------------------------------

#: Supervised on the first 384 training digits in 12 unshuffled batches of 32, 4 steps an
#: epoch, 3 epochs, checkpoints every 2 steps: its val_loss falls at epoch 2 and rises at
#: epoch 3, so epoch 2's checkpoint (ckpt-5, step 8) is the best at the end.
ROLLBACK = {
    "config": {"hidden": 24, "learning_rate": 0.3}, "epochs": 3, "seed": 0,
    "steps_per_epoch": 4, "steps_per_execution": 1, "checkpoint_every": 2,
    "keep_best": "val_loss:min", "max_to_keep": 1, "progress": False,
}  # fmt: skip


def digit_batches(digits, rows: int, nan_batch: int | None = None):
    """The first ``rows`` training digits in batches of 32 (batch ``nan_batch``, from 1,
    all NaN), and 64 validation digits."""
    from helpers import dict_batches

    train, validation = digits
    train = {key: np.array(values[:rows], copy=True) for key, values in train.items()}
    train["x"] = train["x"].astype(np.float32)
    if nan_batch is not None:
        train["x"][32 * (nan_batch - 1) : 32 * nan_batch] = np.nan
    return dict_batches(train, 32), dict_batches({k: v[:64] for k, v in validation.items()}, 32)


def test_a_rollback_after_the_best_goes_on_from_the_best_it_restores(digits, tmp_path):
    # Batch 12 (epoch 3's last) is NaN: the run rolls back to step 10's mid-epoch
    # checkpoint, which names epoch 2's best, and skips batches 11 and 12. A run on the
    # first 10 batches alone, without a fault, ends the same way: epoch 3 of 2 batches.
    with pytest.warns(RuntimeWarning, match=r"ckpt-6 \(step 10\) and skipped 2 batch"):
        rolled = beatloop.fit(
            "supervised", data=digit_batches(digits, 384, nan_batch=12), run_dir=tmp_path / "r",
            on_nan="rollback", **ROLLBACK,
        )  # fmt: skip
    clean = beatloop.fit(
        "supervised", data=digit_batches(digits, 320), run_dir=tmp_path / "c", **ROLLBACK
    )
    assert rolled.history == clean.history
    assert rolled.history["val_loss"][2] > rolled.history["val_loss"][1]
    assert rolled.best == clean.best == best_of(tmp_path / "r")
    assert rolled.best["epoch"] == 2 and rolled.best["checkpoint"] == "ckpt-5"
    assert checkpoint_names(tmp_path / "r") == ["ckpt-5", "ckpt-7"]  # epoch 3's end: ckpt-7
    assert_same_weights(all_weights(rolled.models), all_weights(clean.models))
    best = beatloop.restore(tmp_path / "r", data=digit_batches(digits, 384), best=True)
    assert best.history == beatloop.restore(tmp_path / "c", data=digit_batches(digits, 320),
                                            best=True).history  # fmt: skip
    assert_same_checkpoint(tmp_path / "r/checkpoints/ckpt-5", tmp_path / "c/checkpoints/ckpt-5")


class RunJsonBest(beatloop.Callback):
    """The best ``run.json`` names after each call, with the step it ended at; from step 9
    on, the newest checkpoint's data garbled (a damaged disk)."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.seen = run_dir, []

    def on_execution_end(self, run, steps, logs):
        if run.step == 9 and len(self.seen) == 8:
            data = next((self.run_dir / "checkpoints").glob("ckpt-3.data-*"))
            blob = bytearray(data.read_bytes())
            blob[: len(blob) // 2] = b"\xff" * (len(blob) // 2)
            data.write_bytes(bytes(blob))
        self.seen.append((run.step, best_of(self.run_dir)))


def test_a_rollback_past_the_best_takes_run_json_back_with_it(digits, tmp_path):
    # 640 digits, 20 batches. Epoch 2's checkpoint (ckpt-3, the best) is damaged during
    # epoch 3, whose batch 10 is NaN: the rollback cannot read ckpt-3 and restores epoch
    # 1's (ckpt-2), whose best is epoch 1's. From then on run.json names that one, whole,
    # not the damaged one (an epoch after the rollback may then beat it).
    run_dir = tmp_path / "r"
    seen = RunJsonBest(run_dir)
    options = {**ROLLBACK, "checkpoint_every": None, "max_to_keep": 2}
    with pytest.warns(RuntimeWarning) as warned:
        result = beatloop.fit(
            "supervised", data=digit_batches(digits, 640, nan_batch=10), run_dir=run_dir,
            on_nan="rollback", callbacks=[seen], **options,
        )  # fmt: skip
    messages = [str(w.message) for w in warned]
    assert any("ckpt-3 could not be read" in m for m in messages), messages
    assert any("restored" in m and "ckpt-2 (step 4)" in m for m in messages), messages
    steps = [step for step, _ in seen.seen]
    assert steps[:10] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 5]  # step 10 faulted: back to 4
    before, after = seen.seen[8][1], seen.seen[9][1]
    assert (before["epoch"], before["checkpoint"]) == (2, "ckpt-3")
    assert after == {**before, "epoch": 1, "checkpoint": "ckpt-2",
                     "value": result.history["val_loss"][0]}  # fmt: skip
    assert result.best == best_of(run_dir)
    restored = beatloop.restore(run_dir, data=digit_batches(digits, 640), best=True)
    assert restored.history == {k: v[: result.best["epoch"]] for k, v in result.history.items()}


# --- multi-worker ----------------------------------------------------------------------------


@pytest.mark.slow
def test_in_a_multi_worker_run_the_chiefs_run_json_names_a_best_that_restores(tmp_path):
    # Two workers (cluster_run.py: `beatloop run` under TF_CONFIG), 256 training digits
    # and 64 held out, 8 steps an epoch, 2 epochs. Kept by val_loss:max, the best is
    # epoch 1's (the loss falls), kept beside epoch 2's with --max-to-keep 1.
    from test_distribution import free_ports
    from test_workers import digits_npz

    from beatloop.cli import main
    from beatloop.named_data.load import NamedData

    data = digits_npz(tmp_path / "digits.npz", "supervised")
    split = ["--data-set", "validation_fraction=0.2"]
    args = [
        "supervised", "--data", f"npz:{data}", *split, "--epochs", "2", "--seed", "7",
        "--steps-per-execution", "2", "--set", "optimizer=sgd", "--set", "learning_rate=0.1",
        "--keep-best", "val_loss:max", "--max-to-keep", "1", "--quiet",
    ]  # fmt: skip
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    in_cluster = [*args, "--run-dir", str(tmp_path / "run"), "--strategy", "multi_worker"]
    processes = []
    for index in range(2):
        (tmp_path / f"tmp{index}").mkdir()
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        temporary = ["--tmpdir", str(tmp_path / f"tmp{index}")]  # forked: an option, not env
        processes.append(
            start_python(CLUSTER_WORKER, *temporary, *in_cluster, TF_CONFIG=json.dumps(config))
        )
    try:  # the one-device run of epoch 1 in this process while the workers train
        assert main(["run", *args, "--epochs", "1", "--run-dir", str(tmp_path / "one")]) == 0
        results = [process.communicate(timeout=240) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    for process, (_, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err[-3000:]
    run_dir = tmp_path / "run"
    best = best_of(run_dir)
    history = history_records(run_dir)
    assert [row["epoch"] for row in history] == [1, 2]  # one writer
    assert history[1]["val_loss"] < history[0]["val_loss"]
    assert best == {"figure": "val_loss", "mode": "max", "epoch": 1,
                    "value": history[0]["val_loss"], "checkpoint": "ckpt-2"}  # fmt: skip
    assert checkpoint_names(run_dir) == ["ckpt-2", "ckpt-3"]
    for index in range(2):  # the other worker's temporary dir is gone
        assert list((tmp_path / f"tmp{index}").iterdir()) == []
    named = NamedData(f"npz:{data}", ("validation_fraction=0.2",))
    restored = beatloop.restore(run_dir, named, best=True)
    assert restored.epochs == 1 and restored.best == best
    assert restored.history["val_loss"] == [best["value"]]
    # Two share-of-batch gradients summed instead of one: float32 round-off.
    one = all_weights(beatloop.restore(tmp_path / "one", named).models)
    for key, weight in all_weights(restored.models).items():
        np.testing.assert_allclose(weight, one[key], rtol=0, atol=1e-5, err_msg=key)
