"""Keep the best epoch (``keep_best``, ``--keep-best``): the epoch-end checkpoint of the
best epoch by one figure is kept beside the newest ``max_to_keep``, named in
``run.json``, and restored, evaluated and exported with ``best=True`` / ``--best``.

The supervised recipe at a learning rate of 1.0 on its built-in digits: its validation
loss falls to a low at epoch 5 of 6 and rises again, so the best epoch is not the last."""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights

import beatloop
from beatloop.callbacks.standard import format_figure
from beatloop.cli import main
from beatloop.core.running.best import BestKeeper

CONFIG = {"hidden": 24, "batch_size": 128, "learning_rate": 1.0}
EPOCHS = 6


def fit(run_dir, epochs=EPOCHS, **options):
    return beatloop.fit(
        "supervised", config=CONFIG, epochs=epochs, seed=0, run_dir=run_dir, progress=False,
        **options,
    )  # fmt: skip


def best_of(run_dir) -> dict | None:
    return json.loads((run_dir / "run.json").read_text()).get("best")


def checkpoint_names(run_dir) -> list[str]:
    return sorted(p.name.removesuffix(".index") for p in (run_dir / "checkpoints").glob("*.index"))


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """A run keeping the best by val_loss with max_to_keep=1, and a run of the same seed
    stopped at the best epoch."""
    root = tmp_path_factory.mktemp("keep_best")
    result = fit(root / "kept", keep_best="val_loss:min", max_to_keep=1)
    best = best_of(root / "kept")
    stopped = fit(root / "stopped", epochs=best["epoch"])
    return root / "kept", result, root / "stopped", stopped


def test_the_best_epoch_is_the_histories_argmin_and_kept_beside_the_latest(kept):
    run_dir, result, _, _ = kept
    losses = result.history["val_loss"]
    best = best_of(run_dir)
    epoch = int(np.argmin(losses)) + 1
    assert epoch < EPOCHS  # the test is about a best that is not the latest
    assert best == {
        "figure": "val_loss",
        "mode": "min",
        "epoch": epoch,
        "value": losses[epoch - 1],
        "checkpoint": f"ckpt-{epoch + 1}",  # ckpt-1 is the start's
    }
    assert result.best == best  # FitResult.best: what run.json records
    record = json.loads((run_dir / "run.json").read_text())
    assert record["keep_best"] == "val_loss:min"
    latest = f"ckpt-{EPOCHS + 1}"
    assert checkpoint_names(run_dir) == sorted([best["checkpoint"], latest])  # max_to_keep=1
    assert tf.train.latest_checkpoint(str(run_dir / "checkpoints")).endswith(latest)


def test_restore_best_is_the_run_stopped_at_the_best_epoch(kept):
    run_dir, _, _, stopped = kept
    best = best_of(run_dir)
    restored = beatloop.restore(run_dir, best=True)
    assert restored.epochs == best["epoch"] == stopped.epochs
    assert restored.checkpoint.endswith(best["checkpoint"])
    assert restored.history == stopped.history
    assert_same_weights(all_weights(restored.models), all_weights(stopped.models))
    assert restored.best == best
    latest = beatloop.restore(run_dir)
    assert latest.epochs == EPOCHS  # without best: the latest, as before
    assert latest.best == best  # the latest checkpoint holds the best too
    assert stopped.best is None  # a run without keep_best


def test_evaluate_best_equals_evaluating_the_stopped_run(kept, capsys):
    run_dir, _, stopped_dir, _ = kept
    figures = beatloop.evaluate(stopped_dir)
    assert beatloop.evaluate(run_dir, best=True) == figures
    assert beatloop.evaluate(run_dir) != figures
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--best"]) == 0
    lines = capsys.readouterr().out.split("\n")
    printed = dict(line.split() for line in lines if line.strip())
    assert printed == {name: format_figure(value) for name, value in figures.items()}


def test_best_without_a_kept_best_is_a_clear_error(kept, capsys):
    _, _, stopped_dir, _ = kept
    with pytest.raises(beatloop.CheckpointError, match="keeps no best epoch"):
        beatloop.restore(stopped_dir, best=True)
    assert main(["export", str(stopped_dir), str(stopped_dir.parent / "out"), "--best"]) != 0
    assert "keeps no best epoch" in capsys.readouterr().err


def test_a_best_checkpoint_gone_or_damaged_is_named_and_the_latest_still_serves(
    kept, tmp_path, capsys
):
    run_dir, _, _, _ = kept
    best = best_of(run_dir)
    gone, damaged = tmp_path / "gone", tmp_path / "damaged"
    for copy in (gone, damaged):
        shutil.copytree(run_dir, copy)
    for path in (gone / "checkpoints").glob(f"{best['checkpoint']}.*"):
        path.unlink()
    (data,) = (damaged / "checkpoints").glob(f"{best['checkpoint']}.data-*")
    data.write_bytes(b"\xff" * data.stat().st_size)
    latest = f"ckpt-{EPOCHS + 1}"
    named = (
        f"the best epoch's checkpoint {best['checkpoint']} that {gone}/run.json names (epoch "
        f"{best['epoch']}, val_loss {best['value']:.4g}) is gone (its files were deleted or "
        f"moved); nothing was changed: leave out best (--best) to use the run's latest "
        f"checkpoint, {latest}"
    )
    with pytest.raises(beatloop.CheckpointError) as caught:
        beatloop.restore(gone, best=True)
    assert str(caught.value) == named
    for command in (["evaluate", str(gone), "--best"],
                    ["export", str(gone), str(tmp_path / "out"), "--best"]):  # fmt: skip
        assert main(command) == 5
        err = capsys.readouterr().err
        assert err.splitlines() == [f"beatloop: error: {named}"], err
    with pytest.raises(beatloop.CheckpointError, match=r"\) cannot be read \(.+\); nothing was"):
        beatloop.restore(damaged, best=True)
    # Without best, the latest checkpoint, untouched, serves as it always did.
    assert beatloop.restore(gone).epochs == beatloop.restore(damaged).epochs == EPOCHS
    assert main(["evaluate", str(gone)]) == 0


def test_the_best_survives_a_resume_that_extends_the_epochs(kept, tmp_path):
    run_dir, _, _, _ = kept
    fit(tmp_path / "r", epochs=3, keep_best="val_loss:min", max_to_keep=1)
    assert best_of(tmp_path / "r")["epoch"] == 3
    with pytest.raises(beatloop.ConfigError, match="keeps the best epoch by val_loss:min"):
        fit(tmp_path / "r", epochs=EPOCHS, keep_best="val_accuracy:max")
    fit(tmp_path / "r", epochs=EPOCHS, max_to_keep=1)  # keep_best omitted: the run's own
    assert best_of(tmp_path / "r") == best_of(run_dir)
    assert checkpoint_names(tmp_path / "r") == checkpoint_names(run_dir)


class Killed(BaseException):
    """Stands for a kill between a checkpoint's save and run.json's rewrite."""


def test_a_kill_before_run_json_names_the_new_best_loses_nothing(kept, tmp_path, monkeypatch):
    run_dir, _, _, _ = kept
    written, write = [], BestKeeper.write

    def killed_at_the_third(self, path):
        written.append(path)
        if len(written) == 3:
            raise Killed
        write(self, path)

    monkeypatch.setattr(BestKeeper, "write", killed_at_the_third)
    with pytest.raises(Killed):
        fit(tmp_path / "r", keep_best="val_loss:min", max_to_keep=1)
    monkeypatch.undo()
    assert best_of(tmp_path / "r")["checkpoint"] == "ckpt-3"  # epoch 2's, still there
    assert checkpoint_names(tmp_path / "r") == ["ckpt-3", "ckpt-4"]
    fit(tmp_path / "r", keep_best="val_loss:min", max_to_keep=1)
    assert best_of(tmp_path / "r") == best_of(run_dir)
    assert checkpoint_names(tmp_path / "r") == checkpoint_names(run_dir)


class StopAt(beatloop.Callback):
    """Stops the run (as a kill would) once a call ends at ``step`` or later."""

    def __init__(self, step: int):
        self.step = step

    def on_execution_end(self, run, steps, logs):
        if run.step >= self.step:
            raise Killed


def test_a_resume_before_any_epoch_ended_goes_on_with_the_runs_keep_best(kept, tmp_path):
    run_dir, _, _, _ = kept
    with pytest.raises(Killed):  # in epoch 1: only the start's checkpoint, no best yet
        fit(tmp_path / "r", keep_best="val_loss:min", max_to_keep=1, callbacks=[StopAt(5)])
    assert checkpoint_names(tmp_path / "r") == ["ckpt-1"]
    with pytest.raises(beatloop.ConfigError, match="keeps the best epoch by val_loss:min"):
        fit(tmp_path / "r", keep_best="val_accuracy:max")
    resumed = fit(tmp_path / "r", max_to_keep=1)  # keep_best omitted: the run's own
    assert resumed.best == best_of(tmp_path / "r") == best_of(run_dir)
    assert checkpoint_names(tmp_path / "r") == checkpoint_names(run_dir)


def test_a_figure_the_run_does_not_log_is_refused_naming_those_it_does(tmp_path):
    with pytest.raises(beatloop.ConfigError) as refused:
        fit(tmp_path / "r", keep_best="val_los:min")
    message = str(refused.value)
    for figure in ("'val_los'", "loss", "accuracy", "val_loss", "val_accuracy"):
        assert figure in message
    assert not (tmp_path / "r").exists()  # refused before anything was written
    with pytest.raises(beatloop.ConfigError, match="FIGURE:min"):
        fit(tmp_path / "r", keep_best="val_loss:lowest")
    with pytest.raises(beatloop.ConfigError, match="needs a run_dir"):
        fit(None, keep_best="val_loss:min")


def test_a_validation_figure_without_validation_data_is_refused(tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = np.arange(64) % 10
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    with pytest.raises(beatloop.ConfigError, match="no validation data"):
        beatloop.fit("supervised", data=data, run_dir=tmp_path / "r", keep_best="quality")


def test_the_command_line_keeps_the_quality_figure_and_exports_the_best(tmp_path, capsys):
    run_dir = tmp_path / "r"
    settings = [f"--set={name}={value}" for name, value in CONFIG.items()]
    argv = ["run", "supervised", "--epochs", "3", "--seed", "0", "--run-dir", str(run_dir)]
    assert main([*argv, *settings, "--keep-best", "quality", "--quiet"]) == 0
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    accuracies = [row["val_accuracy"] for row in history]
    best = best_of(run_dir)
    assert (best["figure"], best["mode"]) == ("val_accuracy", "max")  # supervised's quality
    assert best["epoch"] == int(np.argmax(accuracies)) + 1
    capsys.readouterr()
    assert main(["export", str(run_dir), str(tmp_path / "out"), "--best"]) == 0
    assert f"restored {run_dir / 'checkpoints' / best['checkpoint']}" in capsys.readouterr().out
