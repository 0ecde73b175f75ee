"""The same data on any number of devices: a seeded, shuffled source gives the global
batches one device takes, epoch after epoch (its reshuffles included), on a
MirroredStrategy over two logical CPUs and on two local workers, and trains to one
device's weights; where a split cannot (a tfrecord sharded by file, a shuffle without a
seed across workers) one ReproducibilityWarning says so."""

from __future__ import annotations

import collections
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import run_python, start_python
from PIL import Image
from test_distribution import finish_all

from beatloop.cli.workers import free_ports, tf_config
from beatloop.core.feeding.sharding import as_one_device, order_problems, unseeded_shuffles

WORKER = Path(__file__).parent / "workers" / "data_order_run.py"
#: Examples and the global batch: 7 steps an epoch, the last of 2 rows (1 a replica).
COUNT, BATCH, EPOCHS, SEED = 50, 8, 2, 5
STEPS = -(-COUNT // BATCH)


def write_data(folder: Path) -> None:
    """COUNT examples (``id`` 0..COUNT-1, ``x`` two floats) as an npz file, a CSV file,
    four TFRecord shards, and a folder of 2x2 grayscale images whose pixels are the id."""
    ids = np.arange(COUNT)
    x = np.stack([ids / 50.0, -ids / 100.0], axis=1).astype(np.float32)
    np.savez(folder / "data.npz", x=x, id=ids)
    rows = [f"{i},{a},{b}" for i, (a, b) in zip(ids, x, strict=True)]
    (folder / "data.csv").write_text("id,a,b\n" + "\n".join(rows) + "\n")
    (folder / "shards").mkdir()
    for shard, part in enumerate(np.array_split(ids, 4)):
        with tf.io.TFRecordWriter(str(folder / "shards" / f"part-{shard}.tfrecord")) as writer:
            for i in part:
                feature = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i])),
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
    for i in ids:
        images = folder / "images" / str(i % 2)
        images.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((2, 2), i, np.uint8), mode="L").save(images / f"{i:03d}.png")


def spec(folder: Path, sources: list[str], out: Path, digits_one: Path) -> str:
    """``digits_one``: the one-device digits run's weights (.npz), which the mirrored
    run writes and the chief worker compares with (fitted once for both)."""
    return json.dumps(
        {
            "folder": str(folder),
            "sources": sources,
            "count": COUNT,
            "batch_size": BATCH,
            "epochs": EPOCHS,
            "seed": SEED,
            "out": str(out),
            "digits_one": str(digits_one),
        }
    )


def epochs_of(seen: list[list[int]]) -> list[list[list[int]]]:
    """A run's recorded global batches ([step] -> ids, -1 padding) as [epoch][step]."""
    steps = [[i for i in row if i >= 0] for row in seen]
    return [steps[e * STEPS : (e + 1) * STEPS] for e in range(EPOCHS)]


def assert_each_example_once_per_epoch_and_reshuffled(epochs: list[list[list[int]]]) -> None:
    for batches in epochs:
        assert sorted(i for batch in batches for i in batch) == list(range(COUNT))
    assert epochs[0] != epochs[1]  # each epoch reshuffled


# --- one process: how the data are split --------------------------------------------------


def test_on_one_worker_a_data_set_is_distributed_as_it_is():
    dataset = tf.data.Dataset.range(10).shuffle(10).batch(2)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert as_one_device(strategy, dataset) is dataset
    assert as_one_device(None, dataset) is dataset
    assert order_problems(strategy, dataset) == []  # an unseeded shuffle: no split to spoil


def test_shuffles_without_a_seed_are_found_in_the_pipeline():
    from tensorflow.python.eager import context
    from tensorflow.python.framework import config

    # An earlier fit(seed=...) in this process set a global seed and op determinism (which
    # refuses a shuffle without a seed): as in a fresh process, neither while it is built.
    global_seed, deterministic = context.global_seed(), config.is_op_determinism_enabled()
    tf.random.set_seed(None)
    config.disable_op_determinism()
    try:
        rows = tf.data.Dataset.range(10)
        unseeded = rows.shuffle(10).map(lambda r: r + 1).shuffle(5).batch(2)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        with_options = rows.shuffle(10).batch(2).with_options(options)
    finally:
        tf.random.set_seed(global_seed)
        if deterministic:
            config.enable_op_determinism()
    assert unseeded_shuffles(rows.shuffle(10, seed=3).batch(2).prefetch(1)) == 0
    assert unseeded_shuffles(unseeded) == 2
    assert unseeded_shuffles(with_options) == 1


# --- two replicas: one worker process for every check ---------------------------------------

MIRRORED = ["builtin", "npz", "csv", "tfrecord", "folder", "user"]


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data_order")
    write_data(folder)
    out = folder / "mirrored.json"
    digits_one = folder / "digits_one.npz"
    run_python(WORKER, "mirrored", spec(folder, MIRRORED, out, digits_one), timeout=500)
    return {**json.loads(out.read_text()), "digits_one": digits_one}


@pytest.mark.slow
@pytest.mark.parametrize("source", MIRRORED)
def test_a_shuffled_source_gives_one_devices_global_batches_on_two_replicas(mirrored, source):
    assert mirrored["replicas"] == 2
    report = mirrored["sources"][source]
    one, two = epochs_of(report["one"]), epochs_of(report["two"])
    assert_each_example_once_per_epoch_and_reshuffled(one)
    assert two == one
    assert report["max_difference"] < 1e-6, report["max_difference"]


@pytest.mark.slow
def test_the_built_in_digits_shuffled_train_to_one_devices_weights_on_two_replicas(mirrored):
    digits = mirrored["digits"]
    assert digits["steps"][0] == digits["steps"][1] == 2 * 45  # 1,437 digits in batches of 32
    assert digits["max_difference"] < 1e-6, digits["max_difference"]


# --- two local workers ----------------------------------------------------------------------

SAME_ON_WORKERS = ["npz", "csv", "tfrecord", "user_files"]
WORKER_SOURCES = [*SAME_ON_WORKERS, "tfrecord_by_file", "user_unseeded"]


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, mirrored):
    folder = tmp_path_factory.mktemp("data_order_workers")
    write_data(folder)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    outputs = [folder / f"worker{index}.json" for index in range(2)]
    processes: list[subprocess.Popen] = [
        start_python(
            WORKER,
            "worker",
            spec(folder, WORKER_SOURCES, out, mirrored["digits_one"]),
            TF_CONFIG=tf_config(addresses, index),
        )
        for index, out in enumerate(outputs)
    ]
    finish_all(processes, timeout=500)
    return [json.loads(out.read_text()) for out in outputs]


def global_batches(reports: list[dict], source: str) -> list[list[list[int]]]:
    """[pass][step] -> the ids of the step's global batch: the workers' parts in order."""
    seen = [report["sources"][source]["seen"] for report in reports]
    return [
        [[i for worker in seen for i in worker[number][step]] for step in range(len(seen[0][0]))]
        for number in range(EPOCHS)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("source", SAME_ON_WORKERS)
def test_a_shuffled_source_gives_one_devices_global_batches_on_two_workers(two_workers, source):
    assert [report["workers"] for report in two_workers] == [2, 2]
    one = two_workers[0]["sources"][source]["one"]
    assert one == two_workers[1]["sources"][source]["one"]
    assert_each_example_once_per_epoch_and_reshuffled(one)
    assert global_batches(two_workers, source) == one
    assert all(report["sources"][source]["warnings"] == [] for report in two_workers)


@pytest.mark.slow
def test_the_built_in_digits_shuffled_train_to_one_devices_weights_on_two_workers(two_workers):
    assert two_workers[0]["digits"]["max_difference"] < 1e-6


@pytest.mark.slow
def test_tfrecord_sharded_by_file_gives_other_batches_and_says_so_once(two_workers):
    source = two_workers[0]["sources"]["tfrecord_by_file"]
    assert global_batches(two_workers, "tfrecord_by_file") != source["one"]
    for number in range(EPOCHS):  # still every record once an epoch, across the workers
        ids = collections.Counter(
            i for step in global_batches(two_workers, "tfrecord_by_file")[number] for i in step
        )
        assert sorted(ids) == list(range(COUNT)) and set(ids.values()) == {1}
    [warning] = source["warnings"]
    assert warning.startswith("ReproducibilityWarning: tfrecord_by_file: under 2 workers")
    assert "auto-shard policy is FILE: each worker reads files of its own" in warning


@pytest.mark.slow
def test_a_shuffle_without_a_seed_across_workers_is_warned_of(two_workers):
    [warning] = two_workers[0]["sources"]["user_unseeded"]["warnings"]
    assert "it shuffles without a seed (1 shuffle(s)): each worker draws its own order" in warning
    # As it says: the workers' parts are not one permutation's, so within an epoch some
    # examples come twice and others not at all.
    epochs = global_batches(two_workers, "user_unseeded")
    assert any(sorted(i for step in steps for i in step) != list(range(COUNT)) for steps in epochs)
