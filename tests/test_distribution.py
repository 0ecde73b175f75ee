"""Distribution: the engine on a MirroredStrategy over two logical CPUs, and on a
MultiWorkerMirroredStrategy with two worker processes on 127.0.0.1, trains to the same
weights as one device with the same global batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    assert_close_weights,
    assert_same_weights,
    finish_all,
    load_npz,
    start_python,
)

from beatloop.cli.workers import free_ports

WORKER = Path(__file__).parent / "workers" / "distributed_run.py"
sys.path.insert(0, str(WORKER.parent))
import distributed_run  # noqa: E402  (its one-device run is fitted here in-process)


def start(mode: str, out: Path, tf_config: dict | None = None) -> subprocess.Popen:
    """A worker process; only the workers given a ``tf_config`` see a TF_CONFIG."""
    return start_python(
        WORKER, mode, out, TF_CONFIG=None if tf_config is None else json.dumps(tf_config)
    )


@pytest.mark.slow
def test_mirrored_strategy_over_two_cpus_matches_one_device(tmp_path):
    out = tmp_path / "mirrored.json"
    finish_all([start("mirrored", out)])
    report = json.loads(out.read_text())
    assert report["replicas"] == 2
    # gan: two optimizers, n_critic=2, noise; gan_simultaneous: one forward, two tapes
    for recipe in ("supervised", "gan", "gan_simultaneous"):
        figures = report[recipe]
        assert figures["steps"] == [16, 16]
        # Two half-batch gradients summed instead of one: float32 round-off, ~1e-7,
        # against weights that training moved by more than 1e-2.
        assert figures["max_move"] > 1e-2
        assert figures["max_difference"] < 1e-6, recipe
        for name, values in figures["one"].items():
            np.testing.assert_allclose(figures["two"][name], values, rtol=1e-5, err_msg=name)
        # Each call's last step's losses: the global batch's, not one replica's.
        one_device, two_replicas = figures["last"]
        assert len(one_device) == len(two_replicas) == 16 and one_device[0]
        for first, second in zip(one_device, two_replicas, strict=True):
            assert sorted(first) == sorted(second)
            for name in first:
                np.testing.assert_allclose(second[name], first[name], rtol=1e-5, err_msg=name)


@pytest.mark.slow
def test_multi_worker_mirrored_with_two_processes_trains_like_one_device(tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    outputs = [tmp_path / f"worker{i}.npz" for i in range(2)] + [tmp_path / "single.npz"]
    processes = [
        start("worker", outputs[i], {"cluster": cluster, "task": {"type": "worker", "index": i}})
        for i in range(2)
    ]
    try:  # the one-device run in this process while the workers train
        distributed_run.single(str(outputs[2]))
    finally:
        finish_all(processes, timeout=240)

    def load(path):
        arrays = load_npz(path)
        return arrays, json.loads(str(arrays.pop("history")))

    (first, first_history), (second, _), (single, single_history) = map(load, outputs)
    assert_same_weights(first, second)  # the workers hold one mirrored model
    assert_close_weights(first, single, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(first_history["loss"], single_history["loss"], rtol=1e-5)


def test_a_strategy_refuses_xla_and_debug_and_non_strategies():
    import beatloop
    from beatloop.core.failures.errors import ConfigError

    with pytest.raises(ConfigError, match=r"must be a tf\.distribute\.Strategy, got str"):
        beatloop.fit("supervised", strategy="mirrored")
    import tensorflow as tf

    with pytest.raises(ConfigError, match="drop jit_compile"):
        beatloop.fit("supervised", strategy=tf.distribute.get_strategy(), jit_compile=True)
    with pytest.raises(ConfigError, match="without XLA: drop debug"):
        beatloop.fit("supervised", strategy=tf.distribute.get_strategy(), debug=True)


@pytest.mark.parametrize(("kind", "recipe"), [("one_device", "supervised"), ("mirrored", "gan")])
def test_a_one_replica_strategy_reads_plain_data_and_trains_like_no_strategy(kind, recipe):
    """One replica takes whole batches: its data are not distributed (a distributed
    iterator made each step about twice as slow: benchmarks/strategy_overhead.py), the
    loop is traced as a concrete function, its step has no batch share to weight by
    (the gan's noise drawn whole), and the run is bit for bit the run without a
    strategy, the built-in data's reshuffled passes included."""
    import tensorflow as tf
    from helpers import all_weights

    import beatloop
    from beatloop.core.feeding.stream import _distributed, _pass_length

    if kind == "one_device":
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    else:
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    data = tf.data.Dataset.range(6).batch(2)
    assert _distributed(strategy, data) is data
    assert _pass_length(data, strategy) == 3

    def train(strategy):
        return beatloop.fit(
            recipe, epochs=2, seed=3, steps_per_execution=8, progress=False, strategy=strategy,
            config={"n_critic": 2, "quality_samples": 32} if recipe == "gan" else None,
        )  # fmt: skip

    alone, replica = train(None), train(strategy)
    assert_same_weights(all_weights(alone.models), all_weights(replica.models))
    assert replica.history == alone.history
