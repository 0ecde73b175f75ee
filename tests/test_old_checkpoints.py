"""Checkpoints written by earlier code (``tests/fixtures/old_checkpoints``, made by
``tests/fixtures/make_old_checkpoints.py``) resume with this code and end where that
code's own uninterrupted run ended."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from helpers import all_weights, assert_same_weights, load_npz

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

from old_runs import RUNS, data_for  # noqa: E402


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_checkpoint_from_earlier_code_resumes_to_that_codes_result(tmp_path, name):
    import beatloop

    spec = RUNS[name]
    run_dir = tmp_path / name
    shutil.copytree(FIXTURES / "old_checkpoints" / name, run_dir)
    result = beatloop.fit(
        spec["recipe"], data=data_for(spec), epochs=2, run_dir=run_dir, progress=False,
        **spec["fit"],
    )  # fmt: skip
    assert result.resumed_from == str(run_dir / "checkpoints" / "ckpt-4")
    assert result.steps == 6 and result.epochs == 2
    assert_same_weights(all_weights(result.models), load_npz(run_dir / "expected.npz"))
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
    assert result.history == history
