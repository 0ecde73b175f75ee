"""benchmarks/gpu_check.py: on a machine without a GPU it says so in one line and exits
0; ``--device cpu`` runs the same measuring and reporting code on the CPU (supervised,
4 steps an epoch, 2 epochs, the strategy over two logical CPUs), so the GPU path is not
untested code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_python

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
def test_gpu_check_without_a_gpu_says_so_and_exits_0():
    out = run_python(SCRIPT, timeout=120, CUDA_VISIBLE_DEVICES="-1")
    assert out.strip().count("\n") == 0
    assert "sees no GPU" in out and "nothing measured" in out


@pytest.mark.slow
def test_gpu_check_dry_run_on_the_cpu_measures_every_case(tmp_path):
    record = tmp_path / "gpu.json"
    out = run_python(SCRIPT, "--device", "cpu", "--json", record, timeout=300)
    figures = json.loads(record.read_text())
    assert figures["failed"] == {} and figures["skipped"] == {}
    for variant in ("float32", "mixed_float16", "XLA", "mirrored"):
        [rate] = figures["examples/s"]["supervised"][variant]
        assert rate > 0, variant
    assert all(rate > 0 for rate in figures["supervised_loops"].values())
    equal = figures["equivalence"]["supervised"]
    # One device against two logical CPUs, 4 steps: round-off (two half-batch gradients
    # summed) against weights that moved by more than 1e-3.
    assert equal["max_move"] > 1e-3
    assert equal["max_difference"] < 1e-6
    for line in ("examples/s", "mirrored (2 CPUs)", "beatloop / Keras fit", "equivalence"):
        assert line in out
