"""Input sharding under MultiWorkerMirroredStrategy: three worker processes on 127.0.0.1
read a source's training data as the engine distributes it (tf.distribute's auto-shard),
and across them every example is seen exactly once per pass, for sources sharded by
data (npz, csv and parquet: one file; tfrecord shards by default) and by file (tfrecord shards with
``shard=file``)."""

from __future__ import annotations

import collections
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import start_python
from test_distribution import finish_all

from beatloop.cli.workers import free_ports, tf_config

WORKER = Path(__file__).parent / "workers" / "sharding_run.py"
WORKERS = 3
#: Examples: not a multiple of the batch (a short last batch) nor of the workers.
COUNT = 103
#: The global batch: not a multiple of the workers (replicas get unequal parts).
BATCH = 8


def write_sources(folder: Path) -> list[dict]:
    """The same COUNT examples (``x``: 2 floats, ``id``: 0..COUNT-1) as an npz file, a
    CSV file and a Parquet file with an id column (in row groups of 20), and four
    TFRecord shards of tf.train.Examples."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = np.arange(COUNT)
    x = np.stack([ids * 0.5, -ids * 0.25], axis=1).astype(np.float32)
    np.savez(folder / "data.npz", x=x, id=ids)
    rows = [f"{i},{a},{b}" for i, (a, b) in zip(ids, x, strict=True)]
    (folder / "data.csv").write_text("id,a,b\n" + "\n".join(rows) + "\n")
    table = pa.table({"id": ids, "a": x[:, 0], "b": x[:, 1]})
    pq.write_table(table, folder / "data.parquet", row_group_size=20)
    shards = folder / "shards"
    shards.mkdir()
    for shard, part in enumerate(np.array_split(ids, 4)):
        with tf.io.TFRecordWriter(str(shards / f"part-{shard}.tfrecord")) as writer:
            for i in part:
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i])),
                            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                        }
                    )
                )
                writer.write(example.SerializeToString())
    return [
        {"name": "npz", "data": f"npz:{folder / 'data.npz'}"},
        {"name": "csv", "data": f"csv:{folder / 'data.csv'}", "settings": ["keys=id"]},
        {"name": "parquet", "data": f"parquet:{folder / 'data.parquet'}", "settings": ["keys=id"]},
        {
            "name": "tfrecord",
            "data": f"tfrecord:{shards}/part-*.tfrecord",
            "settings": ["shard=file"],
        },
        {"name": "tfrecord_by_data", "data": f"tfrecord:{shards}/part-*.tfrecord"},
    ]


@pytest.mark.slow
def test_each_example_is_seen_once_per_pass_across_three_workers(tmp_path):
    sources = write_sources(tmp_path)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(WORKERS)]
    outputs = [tmp_path / f"worker{i}.json" for i in range(WORKERS)]
    processes: list[subprocess.Popen] = []
    for index, out in enumerate(outputs):
        spec = {"sources": sources, "seed": 5, "batch_size": BATCH, "passes": 2, "out": str(out)}
        processes.append(
            start_python(WORKER, json.dumps(spec), TF_CONFIG=tf_config(addresses, index))
        )
    finish_all(processes, timeout=300)
    reports = [json.loads(out.read_text()) for out in outputs]
    assert [report["workers"] for report in reports] == [WORKERS] * WORKERS
    for source in ("npz", "csv", "parquet", "tfrecord", "tfrecord_by_data"):
        passes = [report["sources"][source] for report in reports]  # [worker][pass] -> ids
        for number in range(2):
            per_worker = [worker[number] for worker in passes]
            counts = collections.Counter(i for ids in per_worker for i in ids)
            assert sorted(counts) == list(range(COUNT)), (source, number)
            assert set(counts.values()) == {1}, (source, number, counts.most_common(3))
            # Every worker has a share: the data is split, not read whole by one.
            assert all(len(ids) < COUNT for ids in per_worker), (source, number)
            assert all(ids for ids in per_worker), (source, number)
        # Each pass is reshuffled by the seed: the first worker's order changes.
        assert passes[0][0] != passes[0][1], source
    # FILE sharding (shard=file) splits the four shards between the workers: 2 + 1 + 1 of
    # them; by data, each worker takes its part of every global batch of 8 (3 + 3 + 2).
    tfrecord = sorted(len(report["sources"]["tfrecord"][0]) for report in reports)
    assert tfrecord == [26, 26, 51], tfrecord
    by_data = sorted(len(report["sources"]["tfrecord_by_data"][0]) for report in reports)
    assert by_data == [25, 39, 39], by_data
