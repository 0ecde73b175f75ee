"""Training throughput of beatloop's engine beside Keras ``fit`` and hand-written loops.

Every loop trains the same 784-64-10 classifier (Adam, sparse cross-entropy, a loss mean
and sparse categorical accuracy) from the same initial weights on the same synthetic
data, at the defaults users run: beatloop without a seed, and so all of them with
TensorFlow's op determinism off (a seeded run turns it on: ``epoch_times.py`` times it).
Each fit's first epoch (tracing) is dropped and the fastest remaining epoch is taken;
the figure reported is the median over repeats, which are interleaved across loops so
that machine noise spreads evenly.

    python benchmarks/engine_overhead.py            # full run (a few minutes)
    python benchmarks/engine_overhead.py --quick    # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import functools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import keras
import numpy as np
import tensorflow as tf
from common import EpochTimer, KerasTimer, as_users_run, spread

import beatloop

FEATURES, HIDDEN, CLASSES = 784, 64, 10
MULTI_STEP = 32
DEFAULTS = {"repeats": 3, "epochs": 4, "examples": 16384, "batch_sizes": "32,256"}
QUICK = {"repeats": 1, "epochs": 2, "examples": 2048, "batch_sizes": "32,256"}
TARGETS = {"keras": 1.0, "handwritten": 0.9, "epoch": 0.85}


# --- data, model, metrics -------------------------------------------------------------


def make_arrays(examples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic float32 features and int64 labels in [0, CLASSES)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((examples, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=examples, dtype=np.int64)
    return x, y


def make_dataset(x: np.ndarray, y: np.ndarray, batch_size: int) -> tf.data.Dataset:
    """The one input pipeline every loop reads: batched, prefetched, not shuffled."""
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def build_model() -> keras.Sequential:
    """The benchmark's classifier: 784 -> Dense(64, relu) -> Dense(10) logits."""
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )


def initial_weights(seed: int = 0) -> list[np.ndarray]:
    """The initial weights every loop starts from."""
    keras.utils.set_random_seed(seed)
    return build_model().get_weights()


def fresh_model(weights: list[np.ndarray]) -> keras.Sequential:
    """A new model holding ``weights``."""
    model = build_model()
    model.set_weights(weights)
    return model


def make_optimizer() -> keras.optimizers.Optimizer:
    """A fresh Adam(1e-3)."""
    return keras.optimizers.Adam(1e-3)


def make_loss() -> keras.losses.Loss:
    """Sparse cross-entropy on logits."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class TrainMetrics:
    """A batch-size-weighted loss mean and sparse categorical accuracy, as the supervised
    recipe and Keras ``fit`` keep them."""

    def __init__(self):
        self.loss = keras.metrics.Mean(name="loss")
        self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    def update(self, y, logits, loss) -> None:
        self.loss.update_state(loss, sample_weight=tf.shape(y)[0])
        self.accuracy.update_state(y, logits)

    def reset(self) -> None:
        self.loss.reset_state()
        self.accuracy.reset_state()

    def results(self) -> dict[str, float]:
        return {"loss": float(self.loss.result()), "accuracy": float(self.accuracy.result())}


# --- the loops: each trains a fresh model and returns its epoch times ---------------------


def run_beatloop(
    dataset,
    weights,
    epochs: int,
    steps_per_execution: int,
    check_gradients: bool = True,
    seed: int | None = None,
) -> list[float]:
    """beatloop's supervised recipe on the engine, at its defaults: no seed, so op
    determinism off (``seed=N``: a repeatable run, op determinism on;
    ``check_gradients=False``: its NaN guard checks the losses only, as Keras's
    ``TerminateOnNaN`` does)."""
    if seed is None:
        as_users_run()  # an older checkout leaves it as an earlier seeded run set it
    timer = EpochTimer()
    beatloop.fit(
        "supervised",
        data=(dataset, None),
        models={"model": fresh_model(weights)},
        optimizers={"optimizer": make_optimizer()},
        epochs=epochs,
        steps_per_execution=steps_per_execution,
        seed=seed,
        progress=False,
        callbacks=[timer],
        **({} if check_gradients else {"check_gradients": False}),  # older checkouts lack it
    )
    return timer.times


def run_keras_fit(
    dataset, weights, epochs: int, steps_per_execution: int, op_determinism: bool = False
) -> list[float]:
    """Keras ``model.fit`` with the same loss and metric (``op_determinism=True``: as
    after ``tf.config.experimental.enable_op_determinism()``, what a seeded run sets)."""
    if op_determinism:
        tf.config.experimental.enable_op_determinism()
    else:
        as_users_run()
    model = fresh_model(weights)
    model.compile(
        optimizer=make_optimizer(),
        loss=make_loss(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=steps_per_execution,
    )
    timer = KerasTimer()
    model.fit(dataset, epochs=epochs, shuffle=False, verbose=0, callbacks=[timer])
    return timer.times


def make_train_step(model, optimizer, metrics: TrainMetrics) -> Callable:
    """The hand-written loops' shared step: forward, gradients, apply, metrics."""
    loss_fn = make_loss()
    variables = model.trainable_variables

    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        metrics.update(y, logits, loss)

    return train_step


def per_batch_epoch(train_step: Callable, dataset: tf.data.Dataset) -> Callable[[], None]:
    """An epoch as a Python loop over batches calling a compiled step per batch."""
    compiled = tf.function(train_step, input_signature=list(dataset.element_spec))

    def run_epoch() -> None:
        for x, y in dataset:
            compiled(x, y)

    return run_epoch


def multi_step_epoch(
    train_step: Callable, dataset: tf.data.Dataset, steps: int
) -> Callable[[], None]:
    """An epoch as calls of a compiled function that runs up to ``steps`` steps each on an
    iterator; a short count marks the end of the data, no exception needed."""

    @tf.function
    def run_steps(iterator) -> tf.Tensor:
        count = tf.constant(0)
        for _ in tf.range(steps):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            train_step(*batch.get_value())
            count += 1
        return count

    def run_epoch() -> None:
        iterator = iter(dataset)
        while int(run_steps(iterator)) == steps:
            pass

    return run_epoch


def whole_epoch(train_step: Callable, dataset: tf.data.Dataset) -> Callable[[], None]:
    """An epoch as one call of a compiled function looping over the whole iterator: no
    host round trip between steps, the bound for a loop on this model and machine."""

    @tf.function
    def run_all(iterator) -> None:
        for x, y in iterator:
            train_step(x, y)

    def run_epoch() -> None:
        run_all(iter(dataset))

    return run_epoch


def run_handwritten(dataset, weights, epochs: int, steps: int | None) -> list[float]:
    """A hand-written loop: a compiled step per batch (``steps=None``), ``steps`` steps
    per compiled call, or the whole epoch in one call (``steps=0``); each epoch's time
    includes reading the metrics, as in ``fit``."""
    as_users_run()
    model = fresh_model(weights)
    optimizer = make_optimizer()
    optimizer.build(model.trainable_variables)  # else the step traces twice
    metrics = TrainMetrics()
    train_step = make_train_step(model, optimizer, metrics)
    if steps is None:
        run_epoch = per_batch_epoch(train_step, dataset)
    elif steps == 0:
        run_epoch = whole_epoch(train_step, dataset)
    else:
        run_epoch = multi_step_epoch(train_step, dataset, steps)
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        metrics.reset()
        run_epoch()
        metrics.results()
        times.append(time.perf_counter() - start)
    return times


@attrs.frozen
class Loop:
    """A loop to time: ``run(dataset, weights, epochs)`` returns its epoch times."""

    key: str
    label: str
    run: Callable[..., list[float]]


LOOPS = (
    Loop(
        "beatloop_spe1", "beatloop, spe=1", functools.partial(run_beatloop, steps_per_execution=1)
    ),
    Loop(
        "beatloop_spe32",
        f"beatloop, spe={MULTI_STEP}",
        functools.partial(run_beatloop, steps_per_execution=MULTI_STEP),
    ),
    Loop("keras_spe1", "Keras fit, spe=1", functools.partial(run_keras_fit, steps_per_execution=1)),
    Loop(
        "keras_spe32",
        f"Keras fit, spe={MULTI_STEP}",
        functools.partial(run_keras_fit, steps_per_execution=MULTI_STEP),
    ),
    Loop(
        "tf_function_step",
        "tf.function step, Python loop",
        functools.partial(run_handwritten, steps=None),
    ),
    Loop(
        "tf_function_multi",
        f"tf.function, {MULTI_STEP} steps/call",
        functools.partial(run_handwritten, steps=MULTI_STEP),
    ),
    Loop(
        "tf_function_epoch",
        "whole epoch in one tf.function",
        functools.partial(run_handwritten, steps=0),
    ),
)
HANDWRITTEN = ("tf_function_step", "tf_function_multi")


# --- measuring and reporting --------------------------------------------------------------


def throughput(times: list[float], examples: int) -> float:
    """Examples/s of the fastest steady-state epoch (the first, tracing, is dropped).

    The fastest, not the median: on this shared 2-core machine whole epochs run at half
    speed now and then for reasons outside the process, which a median of a few epochs
    absorbs badly; the median is then taken over repeats."""
    return examples / min(times[1:])


def measure(settings: argparse.Namespace) -> dict[str, dict[int, list[float]]]:
    """Examples/s per loop and batch size, one figure per repeat; repeats interleaved and
    the loop order rotated each repeat."""
    x, y = make_arrays(settings.examples)
    weights = initial_weights()
    datasets = {size: make_dataset(x, y, size) for size in settings.batch_sizes}
    rates: dict[str, dict[int, list[float]]] = {
        loop.key: {size: [] for size in settings.batch_sizes} for loop in LOOPS
    }
    for repeat in range(settings.repeats):
        shift = repeat % len(LOOPS)
        for loop in LOOPS[shift:] + LOOPS[:shift]:
            for size, dataset in datasets.items():
                times = loop.run(dataset, weights, settings.epochs)
                rate = throughput(times, settings.examples)
                rates[loop.key][size].append(rate)
                print(
                    f"repeat {repeat + 1}/{settings.repeats}  batch {size:>4}  "
                    f"{loop.label:<32} {rate:>10,.0f} examples/s",
                    file=sys.stderr,
                    flush=True,
                )
    return rates


def medians(rates: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    """The median over repeats of each loop's figure at each batch size."""
    return {
        key: {size: statistics.median(r) for size, r in by_size.items()}
        for key, by_size in rates.items()
    }


def ratios(median: dict[str, dict[int, float]], sizes: list[int]) -> list[dict]:
    """The ratios the engine is held to, each with its target."""

    def best(keys, size):
        return max(median[key][size] for key in keys)

    rows = [
        ("beatloop spe=1 / Keras fit spe=1", ["beatloop_spe1"], ["keras_spe1"], TARGETS["keras"]),
        (
            f"beatloop spe={MULTI_STEP} / Keras fit spe={MULTI_STEP}",
            ["beatloop_spe32"],
            ["keras_spe32"],
            TARGETS["keras"],
        ),
        (
            "beatloop best / fastest hand-written",
            ["beatloop_spe1", "beatloop_spe32"],
            list(HANDWRITTEN),
            TARGETS["handwritten"],
        ),
        (
            f"beatloop spe={MULTI_STEP} / whole epoch in one call",
            ["beatloop_spe32"],
            ["tf_function_epoch"],
            TARGETS["epoch"],
        ),
    ]
    return [
        {
            "name": name,
            "target": target,
            "values": {size: best(top, size) / best(bottom, size) for size in sizes},
        }
        for name, top, bottom, target in rows
    ]


def print_report(settings, rates, median, ratio_rows) -> None:
    """The throughput table, then the ratios against their targets."""
    sizes = settings.batch_sizes
    print(
        f"\nexamples/s, median of {settings.repeats} repeat(s); {settings.examples} examples, "
        f"{settings.epochs} epochs per fit, first dropped, fastest kept "
        "(±: half the range over repeats)"
    )
    header = f"{'loop':<34}" + "".join(f"{'batch ' + str(s):>18}" for s in sizes)
    print(header)
    print("-" * len(header))
    for loop in LOOPS:
        cells = (f"{median[loop.key][s]:>10,.0f} {spread(rates[loop.key][s]):<5}" for s in sizes)
        print(f"{loop.label:<34}" + "".join(f"{c:>18}" for c in cells))

    print(f"\n{'ratio':<42}" + "".join(f"{'batch ' + str(s):>14}" for s in sizes) + "  target")
    for row in ratio_rows:
        cells = "".join(
            f"{v:>11.2f}x {'ok' if v >= row['target'] else '--'}" for v in row["values"].values()
        )
        print(f"{row['name']:<42}{cells}  >= {row['target']:.2f}x")
    print("(ok: meets the target; --: below it)")


def write_json(path: Path, settings, rates, median, ratio_rows) -> None:
    """The settings, versions, every repeat's figure, the medians and the ratios."""
    record = {
        "settings": {
            "examples": settings.examples,
            "epochs": settings.epochs,
            "repeats": settings.repeats,
            "batch_sizes": settings.batch_sizes,
            "steps_per_execution": MULTI_STEP,
        },
        "versions": {
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "beatloop": beatloop.__version__,
        },
        "examples_per_second": {
            loop.key: {
                str(s): {"median": median[loop.key][s], "repeats": rates[loop.key][s]}
                for s in settings.batch_sizes
            }
            for loop in LOOPS
        },
        "ratios": [
            {**row, "values": {str(s): v for s, v in row["values"].items()}} for row in ratio_rows
        ],
    }
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings; ``--quick`` changes the defaults, explicit flags still win."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, help=f"fits per loop (default {DEFAULTS['repeats']})"
    )
    parser.add_argument(
        "--epochs", type=int, help=f"epochs per fit, first dropped (default {DEFAULTS['epochs']})"
    )
    parser.add_argument(
        "--examples", type=int, help=f"examples per epoch (default {DEFAULTS['examples']})"
    )
    parser.add_argument(
        "--batch-sizes", help=f"comma-separated (default {DEFAULTS['batch_sizes']})"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 repeat, 2 epochs, 2048 examples"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    for name, default in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    args.batch_sizes = [int(s) for s in str(args.batch_sizes).split(",") if s.strip()]
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first epoch is dropped)")
    if args.repeats < 1 or args.examples < 1 or not args.batch_sizes:
        parser.error("--repeats, --examples and --batch-sizes must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    """Measure every loop, print the tables, and optionally write the JSON record."""
    settings = parse_args(argv)
    rates = measure(settings)
    median = medians(rates)
    ratio_rows = ratios(median, settings.batch_sizes)
    print_report(settings, rates, median, ratio_rows)
    if settings.json is not None:
        write_json(settings.json, settings, rates, median, ratio_rows)


if __name__ == "__main__":
    main()
