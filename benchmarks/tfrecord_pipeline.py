"""TFRecord input against the in-memory pipeline: the built-in digits' training examples
written as sharded TFRecord files (as float vectors, and as PNG images) and read by the
``tfrecord`` source, beside the same examples through ``beatloop.data.batches``
(``from_tensor_slices``, cache, seeded shuffle, batch, prefetch). For each: the input
alone (examples/s over passes with no training) and the supervised recipe training on
it (examples/s, training time only), medians of the repeats with their spread, and the
TFRecord/in-memory ratios side by side.

    python benchmarks/tfrecord_pipeline.py            # full run
    python benchmarks/tfrecord_pipeline.py --quick    # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
from common import TrainingTimer, spread

import beatloop
from beatloop.data import batches, digits_arrays
from beatloop.tfrecord_source import TfrecordConfig, TfrecordSource

SHARDS = 8
FORMS = ("vector", "png")


def write_shards(folder: Path, arrays: dict, form: str) -> str:
    """The examples as ``SHARDS`` TFRecord files in ``folder``; the glob naming them."""
    pixels = np.round(arrays["x"] * 255).astype(np.uint8).reshape(-1, 8, 8, 1)
    for shard, rows in enumerate(np.array_split(np.arange(len(arrays["y"])), SHARDS)):
        with tf.io.TFRecordWriter(str(folder / f"{form}-{shard:02d}.tfrecord")) as writer:
            for row in rows:
                label = tf.train.Feature(int64_list=tf.train.Int64List(value=[arrays["y"][row]]))
                if form == "png":
                    png = tf.io.encode_png(pixels[row]).numpy()
                    x = tf.train.Feature(bytes_list=tf.train.BytesList(value=[png]))
                else:
                    x = tf.train.Feature(float_list=tf.train.FloatList(value=arrays["x"][row]))
                feature = {"x": x, "y": label}
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
    return str(folder / f"{form}-*.tfrecord")


def tfrecord_pipeline(pattern: str, batch_size: int) -> tf.data.Dataset:
    source = TfrecordSource(pattern, TfrecordConfig())
    return source.load(seed=0, batch_size=batch_size).train


def examples_per_second(dataset: tf.data.Dataset, passes: int) -> float:
    """Examples/s of the input alone: ``passes`` passes of one iterator over the data
    repeated, drained inside a compiled loop as the engine takes batches (after a first
    pass, which builds the pipeline), so no Python runs per batch."""
    batches = int(dataset.cardinality())
    iterator = iter(dataset.repeat())

    @tf.function
    def drain(count):
        examples = tf.constant(0)
        for _ in tf.range(count):
            examples += tf.shape(next(iterator)["y"])[0]
        return examples

    drain(tf.constant(batches))
    start = time.perf_counter()
    examples = int(drain(tf.constant(batches * passes)))
    return examples / (time.perf_counter() - start)


def training_rate(dataset: tf.data.Dataset, epochs: int, batch_size: int) -> float:
    """Examples/s of the supervised recipe training on ``dataset`` (training time only,
    the epochs after the first)."""
    timer = TrainingTimer()
    beatloop.fit(
        "supervised",
        data=dataset,
        config={"batch_size": batch_size},
        epochs=epochs,
        seed=0,
        progress=False,
        callbacks=[timer],
    )
    return timer.rates()[1]


def measure(pipelines: dict, args) -> dict[str, dict[str, list[float]]]:
    """Every pipeline's input and training rates, the repeats interleaved so a noisy
    stretch of the machine touches all of them alike."""
    rates = {name: {"input": [], "training": []} for name in pipelines}
    for _ in range(args.repeats):
        for name, make in pipelines.items():
            rates[name]["input"].append(examples_per_second(make(), args.epochs))
            rates[name]["training"].append(training_rate(make(), args.epochs, args.batch_size))
    return rates


def report(rates: dict, args) -> None:
    base = rates["in memory"]
    print(
        f"\nexamples/s, supervised recipe, batch {args.batch_size}, {args.epochs} epochs, "
        f"median of {args.repeats} repeat(s)"
    )
    print(
        f"{'pipeline':<18}{'input alone':>14}{'':>6}{'ratio':>7}{'training':>12}{'':>6}{'ratio':>7}"
    )
    for name, figures in rates.items():
        cells = []
        for kind in ("input", "training"):
            median = statistics.median(figures[kind])
            ratio = median / statistics.median(base[kind])
            cells.append(f"{median:>14,.0f}{spread(figures[kind]):>6}{ratio:>6.2f}x")
        print(f"{name:<18}" + "".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.epochs = 1, 2
    train, _ = digits_arrays(0)
    with tempfile.TemporaryDirectory() as folder:
        patterns = {form: write_shards(Path(folder), train, form) for form in FORMS}
        pipelines = {
            "in memory": lambda: batches(train, args.batch_size, shuffle_seed=0),
            "tfrecord vector": lambda: tfrecord_pipeline(patterns["vector"], args.batch_size),
            "tfrecord png": lambda: tfrecord_pipeline(patterns["png"], args.batch_size),
        }
        report(measure(pipelines, args), args)


if __name__ == "__main__":
    main()
