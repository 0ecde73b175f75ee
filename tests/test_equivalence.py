"""The equivalence matrix: every built-in recipe trained a few dozen steps on one device
and on a ``MirroredStrategy`` over two logical CPUs (same seed, shuffled data, replica
shares that differ by a row on every batch) ends on the same weights, optimizer slots and
recipe state, to a bound each case states; the slow tier adds two local workers of a
``MultiWorkerMirroredStrategy`` for some.

Each bound is the case's noise floor times ``MARGIN``. The floor is how far one device
parts from itself when only the order of its sums changes: the same case, on one device,
with oneDNN off (``TF_ENABLE_ONEDNN_OPTS=0``), with Grappler's arithmetic optimizer off
and, for the cases whose embeddings' rows are summed per id, with each batch's rows in
reverse order (a sum neither of the others reorders), the largest gap over every
variable compared here, and never less than one float32 spacing of the largest model
weight (where all leave every bit alone, the least two orders of a sum can part by).
``FLOORS`` holds each with the run that sets it, as ``python benchmarks/replica_gaps.py
--small`` measures them; the gaps beside them are in
``docs/speed.md`` ("Many devices: the equivalence matrix")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import finish_all, load_npz, run_python, start_python

from beatloop.cli.workers import free_ports

WORKER = Path(__file__).parent / "workers" / "equivalence_run.py"

#: Each case's noise floor and the run that sets it: ``oneDNN off``, ``arithmetic off``
#: (Grappler's arithmetic optimizer), ``rows reversed`` (each batch's), or ``spacing``
#: (one float32 spacing of the largest weight, where no reordering moves a bit).
FLOORS: dict[str, tuple[float, str]] = {
    "supervised": (3.0e-8, "spacing"),
    "supervised_k1": (3.0e-8, "spacing"),
    "gan": (4.0e-7, "arithmetic off"),
    "style_transfer": (4.8e-7, "oneDNN off"),
    "risk_weighted_none": (6.0e-8, "arithmetic off"),
    "risk_weighted_norm": (6.0e-8, "arithmetic off"),
    "risk_weighted_global_norm": (6.0e-8, "oneDNN off"),
    "multitask": (1.2e-7, "spacing"),
    "multitask_pcgrad": (1.2e-7, "spacing"),
    "contrastive": (1.2e-7, "spacing"),
    "meta": (3.0e-8, "oneDNN off"),
    "dqn": (3.0e-8, "spacing"),
    "two_tower": (2.6e-3, "rows reversed"),
    "two_tower_gelu": (6.3e-7, "rows reversed"),
    "noisy": (6.0e-8, "spacing"),
    "ppo": (1.9e-6, "oneDNN off"),
    "recommender": (2.0e-6, "oneDNN off"),
}

#: How many floors two replicas may part from one device by: an order of magnitude, as
#: two replicas reorder more sums at once (each half-batch, then the all-reduce) than
#: one switch does on one device, and Adam carries each reordering on.
MARGIN = 10

#: Each case's bound on the largest difference of any weight, optimizer variable or
#: recipe state variable between one device and two replicas.
BOUNDS: dict[str, float] = {case: MARGIN * floor for case, (floor, _) in FLOORS.items()}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("equivalence") / "matrix.json"
    run_python(WORKER, out, *BOUNDS, timeout=1500)
    report = json.loads(out.read_text())
    report["dir"] = out.parent
    return report


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BOUNDS))
def test_one_device_and_two_replicas_end_on_the_same_weights(matrix, case):
    assert matrix["replicas"] == 2
    figures = matrix["cases"][case]
    print(case, figures)
    one, two = figures["steps"]
    assert one == two >= 12, figures
    assert figures["moved"] > 1e-2, figures  # training moved the weights
    for part in ("weights", "optimizer", "state"):
        assert figures[part] <= BOUNDS[case], (part, figures)


@pytest.mark.slow
def test_an_entry_every_other_step_is_refused_on_two_replicas_before_the_first_step(matrix):
    refused = matrix["every"]
    assert refused is not None and refused["class"] == "ScheduleError", refused
    assert refused["message"].startswith(
        "recipe 'noisy': the schedule has 1 problem(s):\n  - entry 'noisy' runs every 2 steps, "
        "which a distribution strategy of 2 replicas cannot run"
    ), refused["message"]


#: Cases the slow tier also runs on two local workers (one CPU each): a transform on
#: the global gradient, a gather across processes, one agent acting for both workers,
#: and the plain case.
ON_WORKERS = ("supervised", "risk_weighted_global_norm", "contrastive", "dqn")


@pytest.mark.slow
def test_two_local_workers_end_on_the_weights_of_one_device(matrix, tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    outs = [tmp_path / f"worker{index}" for index in range(2)]
    processes = []
    for index, out in enumerate(outs):
        out.mkdir()
        config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        processes.append(start_python(WORKER, "--worker", out, *ON_WORKERS, TF_CONFIG=config))
    finish_all(processes, timeout=600)
    for case in ON_WORKERS:
        one = load_npz(matrix["dir"] / f"{case}.npz")
        first, second = (load_npz(out / f"{case}.npz") for out in outs)
        assert sorted(first) == sorted(one)
        for key in one:
            np.testing.assert_array_equal(first[key], second[key], err_msg=key)  # one model
        gap = max(float(np.abs(first[k] - one[k]).max(initial=0.0)) for k in one)
        print(case, "two workers vs one device:", gap)
        assert gap <= BOUNDS[case], (case, gap)
