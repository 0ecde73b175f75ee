"""A run's op determinism: decided once (asked, the resumed run's, or on with a seed),
set for the process whatever it had before, recorded in ``run.json`` and checkpoints,
and taken again by a resume, ``restore`` and ``evaluate``. It changes the last bits
(TensorFlow's cross-entropy losses run as composite ops while it is on), so a resume
that switched it would not end as the uninterrupted run."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, model_variables, same_weights
from tensorflow.python.framework import config as tf_config

import beatloop
from beatloop.cli import main
from beatloop.core.saving.record import RunRecord

SHORT = {"config": {"batch_size": 64}, "steps_per_epoch": 6, "steps_per_execution": 3}


def fit(**settings):
    return beatloop.fit("supervised", progress=False, **SHORT, **settings)


def test_op_determinism_changes_the_last_bits_of_a_cross_entropy_run():
    """Why it is part of the run: the same seed, on and off, ends apart."""
    on, off = fit(seed=5, op_determinism=True), fit(seed=5, op_determinism=False)
    assert not same_weights(all_weights(on.models), all_weights(off.models))


def test_a_seedless_run_resumes_with_the_op_determinism_it_began_with(tmp_path):
    """A run without a seed trains with op determinism off; its resume reads the seed
    from the checkpoint but must not turn it on: it ends as the run never interrupted."""
    tf.config.experimental.enable_op_determinism()  # left on by some earlier run
    first = fit(epochs=1, run_dir=tmp_path)
    recorded = json.loads((tmp_path / "run.json").read_text())
    assert recorded["op_determinism"] is False and not tf_config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    resumed = fit(epochs=2, run_dir=tmp_path)
    assert resumed.seed == first.seed and not tf_config.is_op_determinism_enabled()
    whole = fit(epochs=2, seed=first.seed, op_determinism=False)
    assert_same_weights(all_weights(resumed.models), all_weights(whole.models))


def test_a_seeded_run_has_it_on_and_evaluate_traces_as_the_run_did(tmp_path):
    result = fit(epochs=1, seed=2, run_dir=tmp_path)
    assert json.loads((tmp_path / "run.json").read_text())["op_determinism"] is True
    tf_config.disable_op_determinism()  # as a later seedless run in the process leaves it
    figures = beatloop.evaluate(tmp_path, steps_per_execution=3)
    assert tf_config.is_op_determinism_enabled()
    assert figures["loss"] == result.history["val_loss"][-1]


def test_a_resume_asked_for_the_other_op_determinism_is_refused(tmp_path):
    fit(epochs=1, run_dir=tmp_path)  # off: no seed
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(beatloop.CheckpointError) as refused:
        fit(epochs=2, run_dir=tmp_path, op_determinism=True)
    assert "op_determinism is False in the checkpoint but True now" in str(refused.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before


def test_a_record_from_before_op_determinism_was_kept_reads_as_on():
    """Records written before the field had it on from their first resume."""
    stored = {
        "recipe": "supervised",
        "config": {},
        "seed": 1,
        "schedule": ["1. loss"],
        "variables": {},
        "data": {},
    }
    assert RunRecord.from_json(stored).op_determinism is True
    assert RunRecord.from_json({**stored, "op_determinism": False}).op_determinism is False


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_op_determinism_must_be_a_bool_or_none(value):
    with pytest.raises(beatloop.ConfigError, match="op_determinism must be True, False or None"):
        fit(op_determinism=value)


def test_the_command_line_sets_it_and_a_replay_of_run_json_keeps_it(tmp_path, capsys):
    """``--no-op-determinism`` with a seed is recorded; ``--config run.json`` replays it."""
    argv = ["run", "supervised", "--epochs", "1", "--seed", "3", "--no-op-determinism",
            "--steps-per-execution", "3", "--set", "batch_size=256", "--quiet"]  # fmt: skip
    assert main([*argv, "--run-dir", str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "run.json").read_text())["op_determinism"] is False
    replay = ["run", "--config", str(tmp_path / "a" / "run.json"), "--quiet"]
    assert main([*replay, "--run-dir", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "run.json").read_text())["op_determinism"] is False
    a, b = model_variables(tmp_path / "a"), model_variables(tmp_path / "b")
    assert set(a) == set(b) and all((a[name] == b[name]).all() for name in a)
    capsys.readouterr()
