"""The equivalence matrix: every built-in recipe trained a few dozen steps on one device
and on a ``MirroredStrategy`` over two logical CPUs (same seed, shuffled data, replica
shares that differ by a row on every batch) ends on the same weights, optimizer slots and
recipe state, to a bound each case states; the slow tier adds two local workers of a
``MultiWorkerMirroredStrategy`` for some. Each bound above 1e-6 is explained in
``docs/speed.md`` ("Many devices: the equivalence matrix", "where the gaps come from")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import finish_all, load_npz, run_python, start_python

from beatloop.cli.workers import free_ports

WORKER = Path(__file__).parent / "workers" / "equivalence_run.py"

#: Float32 round-off of two half-batch sums instead of one, through a few dozen updates.
ROUND_OFF = 1e-6

#: Each case's bound on the largest difference of any weight, optimizer variable or
#: recipe state variable between one device and two replicas.
BOUNDS: dict[str, float] = {
    "supervised": ROUND_OFF,
    "supervised_k1": ROUND_OFF,
    "gan": ROUND_OFF,
    "style_transfer": ROUND_OFF,
    "risk_weighted_none": ROUND_OFF,
    "risk_weighted_norm": ROUND_OFF,  # the clip sees the global batch's gradient
    "risk_weighted_global_norm": ROUND_OFF,
    "multitask": ROUND_OFF,
    "multitask_pcgrad": ROUND_OFF,
    # The linear probe's Adam at lr 0.05 carries the pretrained encoder's 1.3e-7 to 1e-6.
    "contrastive": 1e-5,
    "meta": ROUND_OFF,
    "dqn": ROUND_OFF,  # one agent: acts once a step, the buffer sample split by rows
    # Embedding lookups (sparse gradients) and a gather, 31 batches of 33 then one row.
    # With ReLUs, one example meets a ReLU within round-off of 0 at step 23 and Adam
    # carries that example's gradient to 2.8e-3; with GELUs Adam keeps round-off at 1e-6.
    "two_tower": 5e-3,
    "two_tower_gelu": 1e-5,
    "noisy": ROUND_OFF,  # models.random drawn inside a conditional of the loss
    # One agent: rollouts once a step, each minibatch split by rows. Weights within 6e-8;
    # the returns in recipe state (up to about 30: one float32 step is 1.9e-6 there)
    # within one step.
    "ppo": 1e-5,
    # Embeddings (sparse gradients) under Adam at lr 0.05 over 78 steps: round-off
    # carried to 4.7e-5 in the user embeddings, which moved 1.27.
    "recommender": 1e-4,
}


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
