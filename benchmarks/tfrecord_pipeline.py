"""TFRecord input against the in-memory pipeline: the built-in digits' training examples
written as sharded TFRecord files (as float vectors, and as PNG images) and read by the
``tfrecord`` source, beside the same examples through ``beatloop.datasets.batches``
(``from_tensor_slices``, cache, seeded shuffle, batch, prefetch). For each: the input
alone (examples/s over passes with no training) and the supervised recipe training on
it (examples/s, training time only; and examples per CPU second of the process, which
the machine's other load moves less), medians of the repeats with their spread, and the
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
from beatloop.datasets import batches, digits_arrays
from beatloop.sources.tfrecord import TfrecordConfig, TfrecordSource

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


class CpuTimer(beatloop.Callback):
    """Examples trained per CPU second of this process (every thread: the step's and the
    input pipeline's), over the epochs after the first: the machine's other load
    moves it less than wall time."""

    def __init__(self):
        self.seconds, self.examples, self._epoch = 0.0, 0, 0

    def on_epoch_start(self, run, epoch):
        self._epoch += 1
        self._start, self._first = time.process_time(), run.examples

    def on_epoch_end(self, run, epoch, logs):
        if self._epoch > 1:
            self.seconds += time.process_time() - self._start
            self.examples += run.examples - self._first

    def rate(self) -> float:
        return self.examples / self.seconds


def training_rates(dataset: tf.data.Dataset, epochs: int, batch_size: int) -> tuple:
    """Examples per second and per CPU second of the supervised recipe training on
    ``dataset`` (the epochs after the first; wall time: training time only), 32 steps a
    compiled call on both sides (``"auto"`` would choose K from timings as noisy as the
    figures)."""
    timer, cpu = TrainingTimer(), CpuTimer()
    beatloop.fit(
        "supervised",
        data=dataset,
        config={"batch_size": batch_size},
        epochs=epochs,
        seed=0,
        steps_per_execution=32,
        progress=False,
        callbacks=[timer, cpu],
    )
    return timer.rates()[1], cpu.rate()


def measure(pipelines: dict, args) -> dict[str, dict[str, list[float]]]:
    """Every pipeline's input and training rates, the repeats interleaved, each repeat
    starting with the next pipeline, so a noisy stretch of the machine touches all of
    them alike."""
    rates = {name: {"input": [], "training": [], "per CPU s": []} for name in pipelines}
    names = list(pipelines)
    for repeat in range(args.repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            make = pipelines[name]
            rates[name]["input"].append(examples_per_second(make(), args.epochs))
            wall, cpu = training_rates(make(), args.epochs, args.batch_size)
            rates[name]["training"].append(wall)
            rates[name]["per CPU s"].append(cpu)
    return rates


def report(rates: dict, args) -> None:
    base = rates["in memory"]
    print(
        f"\nexamples/s, supervised recipe, batch {args.batch_size}, {args.epochs} epochs, "
        f"median of {args.repeats} repeat(s); training per CPU s: examples per second of "
        "this process's CPU time"
    )
    kinds = ("input", "training", "per CPU s")
    titles = ("input alone", "training", "training per CPU s")
    print(f"{'pipeline':<18}" + "".join(f"{title:>21}{'ratio':>7}" for title in titles))
    for name, figures in rates.items():
        cells = []
        for kind in kinds:
            median = statistics.median(figures[kind])
            ratio = median / statistics.median(base[kind])
            cells.append(f"{median:>15,.0f}{spread(figures[kind]):>6}{ratio:>6.2f}x")
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
