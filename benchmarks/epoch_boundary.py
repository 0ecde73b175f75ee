"""The end of a pass: epochs over data given as one pass per epoch beside the same data
repeated endlessly with ``steps_per_epoch``, which never ends a pass.

A difference between the two is the cost of ending a pass (letting go of the iterator,
opening the next, its autotuning starting over; the stream now runs passes of known
length as repetitions of one iterator, so it should find none). Cases: the `gan`
recipe, conv (the 1,792 digits resized to 28x28, 28 batches of 64 a pass) and dense
(8x8, the digits 8 times a pass), `supervised` on the digits (8 times a pass), and
`supervised` on its built-in pipeline (shuffled, cached, prefetched, batches of 8,
validation each epoch); Keras `fit` on the supervised data,
both ways, for reference. Per fit the first epoch (tracing) is dropped and the median of
the others kept; the figure is the median over interleaved repeats.

    python benchmarks/epoch_boundary.py              # full run
    python benchmarks/epoch_boundary.py --quick      # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import statistics
import sys

import keras
import numpy as np
import tensorflow as tf
from common import EpochTimer, KerasTimer, as_the_others, spread

import beatloop
from beatloop import DataSplit
from beatloop.datasets import digits_arrays
from beatloop.recipes.gan import Gan

BATCH = 64
PASSES = 8  # copies of the 8x8 digits in one pass, so an epoch lasts long enough to time


class StepOnly(Gan):
    """The gan recipe without its end-of-epoch samples and figures: only the steps."""

    def epoch_figures(self, run):
        return {}

    def callbacks(self):
        return []


def digits(side: int | None = None, signed: bool = False) -> dict[str, np.ndarray]:
    """Every digit (train and validation split of the built-in data), optionally resized
    to ``side`` x ``side`` pixels, as a whole number of batches."""
    train, validation = digits_arrays(0, signed=signed)
    arrays = {key: np.concatenate([train[key], validation[key]]) for key in train}
    count = len(arrays["x"]) // BATCH * BATCH
    arrays = {key: value[:count] for key, value in arrays.items()}
    if side is not None:
        pictures = arrays["x"].reshape(-1, 8, 8, 1)
        arrays["x"] = tf.image.resize(pictures, (side, side)).numpy()[..., 0]
    return arrays


def one_pass(arrays, keys, copies: int = 1) -> tf.data.Dataset:
    """The arrays in batches, ``copies`` times over: one finite data set, one pass."""
    batches = tf.data.Dataset.from_tensor_slices({k: arrays[k] for k in keys}).batch(BATCH)
    return batches.repeat(copies) if copies > 1 else batches


def beatloop_epochs(recipe, split: DataSplit, repeat: bool, epochs: int) -> list[float]:
    """Epoch times of a beatloop run on ``split``, or on its training data repeated."""
    steps = None
    if repeat:
        steps = int(split.train.cardinality())
        split = DataSplit(split.train.repeat(), split.validation)
    timer = EpochTimer()
    beatloop.fit(
        recipe, data=split, epochs=epochs, seed=0, steps_per_epoch=steps, progress=False,
        callbacks=[timer], **as_the_others(),
    )  # fmt: skip
    return timer.times


def keras_epochs(dataset: tf.data.Dataset, repeat: bool, epochs: int) -> list[float]:
    """Epoch times of Keras ``fit`` on the supervised recipe's classifier."""
    keras.utils.set_random_seed(0)
    model = beatloop.make_recipe("supervised").build_models(dataset.element_spec)["model"]
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    timer = KerasTimer()
    pairs = dataset.map(lambda batch: (batch["x"], batch["y"]))
    steps = int(pairs.cardinality()) if repeat else None
    model.fit(
        pairs.repeat() if repeat else pairs, epochs=epochs, steps_per_epoch=steps, verbose=0,
        callbacks=[timer],
    )  # fmt: skip
    return timer.times


def cases():
    """Name -> run(repeat, epochs) -> epoch times."""
    conv = digits(28, signed=True)
    dense = digits(signed=True)
    plain = digits()
    supervised = beatloop.make_recipe("supervised", {"batch_size": BATCH})
    small_batches = beatloop.make_recipe("supervised", {"batch_size": 8})

    def gan(arrays, architecture, copies):
        return lambda repeat, epochs: beatloop_epochs(
            StepOnly(Gan.Config(architecture=architecture, batch_size=BATCH)),
            DataSplit(one_pass(arrays, ["x"], copies)), repeat, epochs,
        )  # fmt: skip

    def built_in(repeat, epochs):
        keras.utils.set_random_seed(0)  # the built-in shuffle's order depends on it
        return beatloop_epochs(small_batches, small_batches.default_data(0), repeat, epochs)

    return {
        "gan conv, 28x28 digits": gan(conv, "conv", 1),
        "gan dense, 8x8 digits": gan(dense, "dense", PASSES),
        "supervised, digits": lambda repeat, epochs: beatloop_epochs(
            supervised, DataSplit(one_pass(plain, ["x", "y"], PASSES)), repeat, epochs
        ),
        "supervised, built-in pipeline": built_in,
        "Keras fit (supervised), digits": lambda repeat, epochs: keras_epochs(
            one_pass(plain, ["x", "y"], PASSES), repeat, epochs
        ),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6, help="epochs per fit, first dropped")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 3 epochs")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    args = parser.parse_args(argv)
    repeats, epochs = (1, 3) if args.quick else (args.repeats, max(args.epochs, 2))
    runs = {name: run for name, run in cases().items() if args.only in name}
    seconds = {(name, form): [] for name in runs for form in ("one pass", "repeat")}
    for repeat in range(repeats):
        for name, run in runs.items():
            forms = ("one pass", "repeat") if repeat % 2 == 0 else ("repeat", "one pass")
            for form in forms:
                median = statistics.median(run(form == "repeat", epochs)[1:])
                seconds[(name, form)].append(median)
                print(f"repeat {repeat + 1}/{repeats}  {name:<32} {form:<9} {median:.3f} s/epoch",
                      file=sys.stderr, flush=True)  # fmt: skip
    print(f"\nseconds per epoch, median of {repeats} repeat(s) of {epochs} epochs (first dropped)")
    print(f"{'case':<34}{'one pass':>16}{'repeat':>16}{'one pass / repeat':>20}")
    for name in runs:
        once, again = seconds[(name, "one pass")], seconds[(name, "repeat")]
        ratios = [a / b for a, b in zip(once, again, strict=True)]
        print(
            f"{name:<34}{statistics.median(once):>11.3f} {spread(once):<4}"
            f"{statistics.median(again):>11.3f} {spread(again):<4}"
            f"{statistics.median(ratios):>14.2f}x {spread(ratios)}"
        )
    print("(target: one pass within 5% of repeat)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
