"""One worker of the sharding tests, in its own process: ``python sharding_run.py
SPEC_JSON`` (TF_CONFIG from the environment). For each source in the spec (``name``,
``data``: ``KIND:PATH``, ``settings``: ``--data-set`` texts) it loads the source's
training data as a run would, distributes it as the engine does
(``beatloop.core.feeding.stream._distributed``: tf.distribute's auto-shard), and records the
example ids (batch key ``id``) this worker's replica is given, pass by pass; it writes
``{name: [[ids of pass 1], [ids of pass 2], ...]}`` to ``out`` (JSON).

``tfrecord:`` data is read by the registered ``tfrecord`` source when there is one; until
then by a hand-built pipeline of the same shape (files interleaved in order, parsed,
shuffled by the seed, batched): what FILE sharding sees either way.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from beatloop.core.feeding.stream import _distributed
from beatloop.named_data.load import make_source


def hand_built_tfrecords(pattern: str, seed: int, batch_size: int) -> tf.data.Dataset:
    """Sharded tf.train.Example files (``x``: 2 floats, ``id``: int64) as batches."""
    files = sorted(tf.io.gfile.glob(pattern))
    features = {
        "x": tf.io.FixedLenFeature([2], tf.float32),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }
    dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=2, deterministic=True
    )
    dataset = dataset.shuffle(10_000, seed=seed, reshuffle_each_iteration=True)
    return dataset.batch(batch_size).map(lambda records: tf.io.parse_example(records, features))


def training_data(source: dict, seed: int, batch_size: int) -> tf.data.Dataset:
    from beatloop.plugins.registry import registry

    kind, _, path = source["data"].partition(":")
    if kind == "tfrecord" and "tfrecord" not in registry().source_names():
        return hand_built_tfrecords(path, seed, batch_size)
    data_source = make_source(source["data"], source.get("settings", ()))
    return data_source.load(seed, batch_size).train


def seen(strategy, dataset: tf.data.Dataset, passes: int) -> list[list[int]]:
    """The ids this worker's replicas are given in each of ``passes`` passes."""
    distributed = _distributed(strategy, dataset)
    result = []
    for _ in range(passes):
        ids: list[int] = []
        for batch in iter(distributed):
            for part in strategy.experimental_local_results(batch["id"]):
                ids += [int(i) for i in part.numpy().reshape(-1)]
        result.append(ids)
    return result


def main(spec: dict) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    report = {"workers": strategy.extended._num_workers, "sources": {}}
    for source in spec["sources"]:
        dataset = training_data(source, spec["seed"], spec["batch_size"])
        report["sources"][source["name"]] = seen(strategy, dataset, spec["passes"])
    Path(spec["out"]).write_text(json.dumps(report))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
