"""What docs/schedules.md shows of ``models`` (``ModelCalls``) does what it says: its MAML
recipe, built on ``models.raw`` and ``stateless_call``, is second-order MAML bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_python

WORKER = Path(__file__).parent / "workers" / "maml_docs.py"


@pytest.mark.slow
def test_the_maml_block_trains_like_a_hand_written_second_order_maml_loop(tmp_path):
    """In a fresh process, for the bits (see the worker's docstring)."""
    out = tmp_path / "maml.json"
    run_python(WORKER, out)
    report = json.loads(out.read_text())
    first, second = report["block_losses"]  # the block's own run learned
    assert second < first
    one_step, default = report["spe=1"], report["spe=auto"]
    assert one_step["moved"] > 1e-3  # training moved the weights
    assert one_step["max_difference"] == 0.0  # and both loops moved them alike
    # Several steps per compiled call: a loop body Grappler optimises as a whole, where
    # sums may be ordered otherwise: float32 round-off.
    assert default["max_difference"] < 1e-6 and default["moved"] > 1e-3
