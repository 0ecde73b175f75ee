"""An epoch that trained no step (a rollback skipped every batch it took) logs its
training figures as missing: absent from its logs, ``history.jsonl``, ``history.csv`` and
TensorBoard (MLflow: ``test_mlflow.py``); keep-best, ``EarlyStopping`` and ``tune``'s
objective pass over it, and its validation figures are the restored models' own."""

from __future__ import annotations

import csv
import json

import numpy as np
import optuna
import pytest
from helpers import dict_batches

import beatloop
from beatloop.callbacks.tensorboard import read_scalars
from beatloop.tuning.spec import Objective, StudySpec
from beatloop.tuning.trial import TrialReporter, _objective


def skipping_data(digits, batches: int = 6):
    """The first ``batches`` batches of 32 training digits, the last one NaN, and 64
    validation digits. In epochs of 3 steps (6 batches: the second epoch's last batch;
    3 batches: every epoch's last) the NaN rolls back to the epoch's start and skips the
    whole epoch."""
    train, validation = digits
    train = {key: np.array(values[: 32 * batches], copy=True) for key, values in train.items()}
    train["x"] = train["x"].astype(np.float32)
    train["x"][32 * (batches - 1) :] = np.nan
    return dict_batches(train, 32), dict_batches({k: v[:64] for k, v in validation.items()}, 32)


def fit_skipping(digits, run_dir, batches: int = 6, **options):
    return beatloop.fit(
        "supervised", data=skipping_data(digits, batches), seed=0, run_dir=run_dir,
        steps_per_epoch=3, steps_per_execution=1, on_nan="rollback", progress=False, **options,
    )  # fmt: skip


def test_an_epoch_a_rollback_skipped_whole_logs_no_training_figure_and_is_never_best(
    digits, tmp_path
):
    # Epoch 1 trains batches 1-3; epoch 2's batch 6 is NaN: back to epoch 1's end, its
    # 3 batches skipped; epoch 3 trains batches 1-3 of a new pass.
    stopper = beatloop.EarlyStopping(monitor="loss", patience=1)
    study = optuna.create_study()
    reporter = TrialReporter(study.ask(), Objective("loss", "min"), 3)
    callbacks = [beatloop.CsvLogger(), beatloop.TensorBoard(), stopper, reporter]
    with pytest.warns(RuntimeWarning) as warned:
        result = fit_skipping(digits, tmp_path, epochs=3, keep_best="loss:min", callbacks=callbacks)
    said = [str(w.message) for w in warned if "trained no step" in str(w.message)]
    assert said == [
        "epoch 2 trained no step (a rollback skipped every batch it took): its training "
        "figures (loss, accuracy) are missing from its logs, history.jsonl and trackers, "
        "and keep_best, compare and tune pass over them; its validation, if any, ran on "
        "the models the rollback restored"
    ]
    rows = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert set(rows[1]) == {"epoch", "step", "val_loss", "val_accuracy"}
    assert rows[1]["step"] == rows[0]["step"] == 3  # nothing trained since epoch 1's end
    assert rows[1]["val_loss"] == rows[0]["val_loss"]  # the same, restored, models
    assert result.history["loss"] == [rows[0]["loss"], rows[2]["loss"]]
    assert result.history["val_loss"] == [row["val_loss"] for row in rows]
    with (tmp_path / "history.csv").open(newline="") as handle:
        table = list(csv.DictReader(handle))
    assert (table[1]["loss"], table[1]["accuracy"]) == ("", "")
    assert float(table[1]["val_loss"]) == pytest.approx(rows[1]["val_loss"])
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [step for step, _ in scalars["epoch/loss"]] == [1, 3]
    assert [step for step, _ in scalars["epoch/val_loss"]] == [1, 2, 3]
    # Not the best (a made-up 0.0 would be), for keep_best nor EarlyStopping; tune's
    # objective is reported for the epochs that trained.
    assert rows[2]["loss"] < rows[0]["loss"]
    assert result.best["epoch"] == 3 and result.best["value"] == rows[2]["loss"]
    assert json.loads((tmp_path / "run.json").read_text())["best"] == result.best
    assert (stopper.best, stopper.best_epoch) == (rows[2]["loss"], 2)
    (trial,) = study.get_trials()
    assert trial.intermediate_values == {0: rows[0]["loss"], 2: rows[2]["loss"]}


def test_a_trial_none_of_whose_epochs_trained_fails_saying_why(digits, tmp_path):
    # 3 batches, the third NaN: each epoch rolls back to its start, skipping all of it.
    study = optuna.create_study()
    reporter = TrialReporter(study.ask(), Objective("loss", "min"), 2)
    with pytest.warns(RuntimeWarning, match="epoch 2 trained no step"):
        result = fit_skipping(digits, tmp_path / "run", batches=3, epochs=2,
                              callbacks=[reporter])  # fmt: skip
    assert "loss" not in result.history and len(result.history["val_loss"]) == 2
    assert study.get_trials()[0].intermediate_values == {}
    spec = StudySpec("supervised", ("hidden=int:4:8",), Objective("loss", "min"), tmp_path)
    with pytest.raises(beatloop.NumericsError) as caught:
        _objective(result, spec, 7)
    assert str(caught.value) == (
        "trial 7 logged no 'loss' (--objective): none of its 2 epoch(s) trained a step "
        "(rollbacks after non-finite steps skipped all their batches; its log says which)"
    )
