"""The data-order tests' runs, in their own processes (logical devices and TF_CONFIG must
be set before TensorFlow starts): ``python data_order_run.py MODE SPEC_JSON``.

The spec names a folder of data files (``tests/test_data_order.py`` writes them: COUNT
examples with an ``id`` column, as npz, csv, four TFRecord shards and a folder of
images), the sources to read (names from ``SOURCES``), the seed, the batch size and the
epochs, and ``out``, the JSON file the report goes to.

``mirrored``: for each source, a ``Recording`` run on one device and one on a
MirroredStrategy over two logical CPUs: the ids of every step's global batch (gathered
across the replicas in the step) and the trained weights; then the ``supervised``
recipe on its built-in shuffled digits, both ways, and the largest weight difference;
the one-device run's weights go to the spec's ``digits_one`` (.npz), if it names one.

``worker``: one worker of a MultiWorkerMirroredStrategy (TF_CONFIG from the
environment): for each source, the ids this worker's replica is given at each step of
each pass as the engine distributes the data (``core/feeding/stream.py``'s ``_distributed``),
the warnings the engine would give at the start of a run on it, and the global batches
one device takes of the same source (built again, after the same seeding); then the
``supervised`` recipe on its built-in digits (shuffled), and on the chief the largest
difference from the same run on one device (the weights ``mirrored`` wrote to the
spec's ``digits_one``: that run is fitted once, not again here).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import keras
import numpy as np
import tensorflow as tf
from helpers import all_weights, largest_difference, load_npz

import beatloop
from beatloop import datasets as data
from beatloop.core.feeding.sharding import as_one_device, warn_if_not_one_device
from beatloop.core.feeding.stream import _distributed
from beatloop.named_data.load import make_source


def ids_of(batch) -> tf.Tensor:
    """The examples' ids: the ``id`` key, or (a folder's images) the first pixel."""
    if "id" in batch:
        return tf.cast(batch["id"], tf.int64)
    return tf.cast(tf.round(tf.reshape(batch["x"], [tf.shape(batch["x"])[0], -1])[:, 0]), tf.int64)


class Recording(beatloop.Recipe):
    """A linear model fitted to ``id % 3`` from the id (scaled), and an ``Act`` writing
    the ids of each step's global batch (``models.all_gather``) into recipe state."""

    name = "recording_test"

    def __init__(self, steps: int, batch_size: int):
        super().__init__()
        self.steps, self.batch_size = steps, batch_size

    def build_models(self, batch_spec):
        keras.utils.set_random_seed(1)
        return {"m": keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])}

    def build_state(self):
        blank = tf.fill([self.steps, self.batch_size], tf.constant(-1, tf.int64))
        return {
            "seen": tf.Variable(blank, trainable=False),
            "at": tf.Variable(0, dtype=tf.int64, trainable=False),
        }

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.1)}

    def losses(self):
        def loss(models, batch):
            ids = ids_of(batch)
            out = models["m"](tf.cast(ids, tf.float32)[:, None] / 50.0)[:, 0]
            return tf.reduce_mean(tf.square(out - tf.cast(ids % 3, tf.float32)))

        return {"fit": loss}

    def record(self, models, batch):
        """The global batch's ids (an act runs once a step, on the global batch, whatever
        the replica count), padded with -1 to a whole batch."""
        ids = ids_of(batch)
        row = tf.concat([ids, -tf.ones([self.batch_size - tf.shape(ids)[0]], tf.int64)], 0)
        seen, at = models.state["seen"], models.state["at"]
        seen.assign(tf.tensor_scatter_nd_update(seen, [[at]], [row]))
        at.assign_add(1)

    def schedule(self):
        return beatloop.Schedule(
            [beatloop.Beat("fit", "sgd", updates="m"), beatloop.Act(self.record, name="record")]
        )


def arrays(spec: dict) -> dict[str, np.ndarray]:
    ids = np.arange(spec["count"])
    return {"x": (ids / 50.0).astype(np.float32)[:, None], "id": ids}


def user_records(spec: dict, seed: int | None):
    """A user's own pipeline: the TFRecord shards read with TFRecordDataset, parsed,
    shuffled (by ``seed``; none: without a seed), batched."""
    files = sorted(tf.io.gfile.glob(f"{spec['folder']}/shards/part-*.tfrecord"))
    features = {
        "x": tf.io.FixedLenFeature([2], tf.float32),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }
    records = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, features))
    return records.shuffle(spec["count"], seed=seed).batch(spec["batch_size"])


def training_data(name: str, spec: dict, seed: int) -> tf.data.Dataset:
    """Source ``name``'s training batches, shuffled by ``seed``."""
    folder, size = spec["folder"], spec["batch_size"]
    count = spec["count"]
    sources = {
        "builtin": lambda: data.batches(arrays(spec), size, shuffle_seed=seed),
        "npz": lambda: make_source(f"npz:{folder}/data.npz").load(seed, size).train,
        "csv": lambda: (
            make_source(f"csv:{folder}/data.csv", ["keys=id", "shuffle_buffer=16"])
            .load(seed, size)
            .train
        ),
        "tfrecord": lambda: (
            make_source(f"tfrecord:{folder}/shards/part-*.tfrecord").load(seed, size).train
        ),
        "tfrecord_by_file": lambda: (
            make_source(f"tfrecord:{folder}/shards/part-*.tfrecord", ["shard=file"])
            .load(seed, size)
            .train
        ),
        "folder": lambda: (
            make_source(
                f"folder:{folder}/images",
                ["image_size=2,2", "color_mode=grayscale", "value_range=raw"],
            )
            .load(seed, size)
            .train
        ),
        "user": lambda: (
            tf.data.Dataset.from_tensor_slices(arrays(spec)).shuffle(count, seed=seed).batch(size)
        ),
        "user_files": lambda: user_records(spec, seed),
        "user_unseeded": lambda: user_records(spec, None),
    }
    return sources[name]()


def recorded_run(name: str, spec: dict, strategy) -> tuple[list, dict]:
    """A Recording run on source ``name``: the ids of every step's global batch (-1
    pads a short one) and the weights."""
    steps = spec["epochs"] * -(-spec["count"] // spec["batch_size"])
    result = beatloop.fit(
        Recording(steps, spec["batch_size"]),
        data=lambda recipe, seed: training_data(name, spec, seed),
        epochs=spec["epochs"],
        seed=spec["seed"],
        strategy=strategy,
        steps_per_execution=4,
        progress=False,
    )
    seen = result.bound.state["seen"].numpy()
    return seen.tolist(), all_weights(result.models)


def digits_run(spec: dict, strategy):
    """The supervised recipe on its built-in digits, shuffled each epoch."""
    return beatloop.fit(
        "supervised",
        config={"optimizer": "sgd", "learning_rate": 0.1},
        epochs=spec["epochs"],
        seed=spec["seed"],
        strategy=strategy,
        steps_per_execution=16,
        progress=False,
    )


def mirrored(spec: dict) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report: dict = {"replicas": strategy.num_replicas_in_sync, "sources": {}}
    for name in spec["sources"]:
        one, one_weights = recorded_run(name, spec, None)
        two, two_weights = recorded_run(name, spec, strategy)
        report["sources"][name] = {
            "one": one,
            "two": two,
            "max_difference": largest_difference(one_weights, two_weights),
        }
    one, two = digits_run(spec, None), digits_run(spec, strategy)
    if spec.get("digits_one"):
        np.savez(spec["digits_one"], **all_weights(one.models))
    report["digits"] = {
        "max_difference": largest_difference(all_weights(one.models), all_weights(two.models)),
        "steps": [one.steps, two.steps],
    }
    Path(spec["out"]).write_text(json.dumps(report))


def passes_seen(strategy, dataset: tf.data.Dataset, passes: int) -> list[list[list[int]]]:
    """[pass][step] -> the ids this worker's replica is given, as the engine gives them."""
    distributed = _distributed(strategy, dataset)
    result = []
    for _ in range(passes):
        steps = []
        for batch in iter(distributed):
            parts = strategy.experimental_local_results(batch)
            steps.append([int(i) for part in parts for i in ids_of(part).numpy()])
        result.append(steps)
    return result


def one_device(name: str, spec: dict) -> list[list[list[int]]]:
    """[pass][step] -> the ids of one device's batch, the data built after the seeding
    ``fit`` does."""
    tf.random.set_seed(spec["seed"])
    dataset = training_data(name, spec, spec["seed"])
    return [[ids_of(b).numpy().tolist() for b in dataset] for _ in range(spec["epochs"])]


def worker(spec: dict) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    report: dict = {"workers": strategy.extended._num_workers, "sources": {}}
    for name in spec["sources"]:
        # As fit seeds TensorFlow before it reads its data; a pipeline shuffled without a
        # seed is built as a user builds it before fit, with no global seed set.
        tf.random.set_seed(None if name == "user_unseeded" else spec["seed"])
        dataset = training_data(name, spec, spec["seed"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_if_not_one_device(strategy, as_one_device(strategy, dataset), name)
        report["sources"][name] = {
            "seen": passes_seen(strategy, dataset, spec["epochs"]),
            "one": one_device(name, spec),
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        }
    weights = all_weights(digits_run(spec, strategy).models)
    if strategy.cluster_resolver.task_id == 0:  # the chief: one device, for reference
        single = load_npz(spec["digits_one"])
        report["digits"] = {"max_difference": largest_difference(weights, single)}
    Path(spec["out"]).write_text(json.dumps(report))


if __name__ == "__main__":
    {"mirrored": mirrored, "worker": worker}[sys.argv[1]](json.loads(sys.argv[2]))
