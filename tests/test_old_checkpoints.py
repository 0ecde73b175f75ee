"""Checkpoints written by earlier code (``tests/fixtures/old_checkpoints``, made by
``tests/fixtures/make_old_checkpoints.py``) resume with this code and end where that
code's own uninterrupted run ended.

The fixtures' expected weights and figures were computed on the CPU that made them; the
steps after the checkpoint run here, and another CPU (or oneDNN on where it was off)
rounds their sums differently in the last bit. So they are compared to a stated float32
tolerance, ``ULPS`` units in the last place, and bit for bit only what is the same on
every machine: the same old checkpoint resumed twice here."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from helpers import (
    FLOAT32_ULP,
    all_weights,
    assert_same_weights,
    assert_weights_within_ulps,
    load_npz,
)

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

from old_runs import RUNS, ULPS, data_for  # noqa: E402


def resumed(tmp_path: Path, name: str, copy: str = "run", **options):
    """The fixture run ``name`` resumed from a fresh copy of its old checkpoint to the
    end of its second epoch (``options`` added to ``fit``'s)."""
    import beatloop

    spec = RUNS[name]
    run_dir = tmp_path / copy / name
    shutil.copytree(FIXTURES / "old_checkpoints" / name, run_dir)
    result = beatloop.fit(
        spec["recipe"], data=data_for(spec), epochs=2, run_dir=run_dir, progress=False,
        **spec["fit"], **options,
    )  # fmt: skip
    assert result.resumed_from == str(run_dir / "checkpoints" / "ckpt-4")
    assert result.steps == 6 and result.epochs == 2
    return result, run_dir


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_checkpoint_from_earlier_code_resumes_to_that_codes_result(tmp_path, name):
    """Resumed here, within ``ULPS`` of the earlier code's uninterrupted run (made on
    another CPU); resumed again, the same to the bit."""
    result, run_dir = resumed(tmp_path, name)
    weights = all_weights(result.models)
    assert_weights_within_ulps(weights, load_npz(run_dir / "expected.npz"), ULPS)
    assert_same_weights(all_weights(resumed(tmp_path, name, copy="again")[0].models), weights)
    history = json.loads((run_dir / "expected_history.json").read_text())
    # Validation draws its noise from its own generator, reset to the run's seed at every
    # pass (so an evaluation gives the figures fit logged); the earlier code drew it from
    # the run's generator. A recipe whose losses draw noise (the GAN) therefore validates
    # the resumed epoch on other noise: its last val_ figures are those evaluate gives.
    redrawn = [key for key in history if key.startswith("val_")] if name == "gan" else []
    for key in redrawn:
        assert result.history[key][:-1] == history[key][:-1]
        assert result.history[key][-1] == result.evaluate()[key.removeprefix("val_")]
        del result.history[key], history[key]
    assert sorted(result.history) == sorted(history)
    for key, figures in history.items():
        # The first epoch's figures are the old run's own (read from its history.jsonl).
        assert result.history[key][0] == figures[0], key
        assert result.history[key] == pytest.approx(figures, rel=ULPS * FLOAT32_ULP), key
