"""Gradient accumulation's cost per micro-step (batch): beatloop's ``accumulate=4`` beside
its plain step, and both beside the same maths hand-written, at equal steps per call.

The 784-64-10 classifier of engine_overhead.py (Adam, sparse cross-entropy, a loss mean
and accuracy) on its synthetic data, batches of 32. beatloop runs its supervised recipe
with ``config={"accumulate": 4}`` or ``1``. The hand-written accumulation does what the
engine does (beatloop/core/compiled/accumulation.py): each batch adds its gradients
times its rows to sums held in non-trainable variables, and its rows; a ``tf.cond``
applies the sums over the rows with Adam on every 4th batch and empties them; a partial
sum left at an epoch's end is applied then; updates are counted. The hand-written loops
make one ``tf.function`` call per batch, which takes it from the iterator (K=1), or run
K batches per call over the iterator (K=32, engine_overhead.py's loop), beside beatloop
at ``steps_per_execution=K``.

Every fit starts from the same weights; its first epoch (tracing) is dropped and its
fastest remaining epoch kept, as milliseconds per batch. The figures are medians over
repeats, interleaved across loops with the order rotated each repeat; ± is half the
range over repeats, of each time and of each ratio taken within a repeat.

    python benchmarks/accumulation.py                # full run (about 2 minutes)
    python benchmarks/accumulation.py --quick        # smoke run
    python benchmarks/accumulation.py --spe 32 --json accumulation.json
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import engine_overhead as eo
import keras
import tensorflow as tf
from common import EpochTimer, as_the_others, as_users_run, spread

import beatloop

BATCH, ACCUMULATE = 32, 4
DEFAULTS = {"repeats": 5, "epochs": 5, "examples": 16384, "spe": "1,32"}
QUICK = {"repeats": 1, "epochs": 2, "examples": 2048, "spe": "1,32"}


# --- the loops: each trains a fresh model and returns its epoch times and updates --------


@attrs.frozen
class Timed:
    """One fit: its epochs' wall times and the updates its last epoch made."""

    times: list[float]
    updates: float


def run_beatloop(dataset, weights, epochs: int, spe: int, accumulate: int) -> Timed:
    """The supervised recipe, accumulating over ``accumulate`` batches (1: the plain step)."""
    timer = EpochTimer()
    result = beatloop.fit(
        "supervised",
        data=(dataset, None),
        models={"model": eo.fresh_model(weights)},
        optimizers={"optimizer": eo.make_optimizer()},
        config={"accumulate": accumulate},
        epochs=epochs,
        steps_per_execution=spe,
        seed=0,
        progress=False,
        callbacks=[timer],
        **as_the_others(),  # op determinism off, as in the hand-written loop
    )
    # the plain step logs no update count: it updates on every batch
    updates = result.history.get("loss_updates", [_batches(dataset)])[-1]
    return Timed(timer.times, float(updates))


def _batches(dataset) -> int:
    return int(dataset.cardinality())


def cross_entropy(y, logits) -> tf.Tensor:
    """The supervised recipe's loss: sparse cross-entropy, its sum over the batch's size."""
    values = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    return tf.math.divide_no_nan(tf.reduce_sum(values), tf.cast(tf.size(values), values.dtype))


class HandWritten:
    """A hand-written step on one batch: forward, gradients, then the update (plain) or
    the sums (``accumulate`` > 1, applied in a ``tf.cond`` on every N-th batch)."""

    def __init__(self, weights, accumulate: int):
        self.model = eo.fresh_model(weights)
        self.variables = self.model.trainable_variables
        self.optimizer = eo.make_optimizer()
        self.optimizer.build(self.variables)  # else the step traces twice
        self.metrics = eo.TrainMetrics()
        self.updates = keras.metrics.Sum(name="loss_updates")
        self.accumulate = accumulate
        self.sums = [
            tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"sum_{i}")
            for i, v in enumerate(self.variables)
        ]
        self.rows = tf.Variable(0.0, trainable=False, name="rows")
        self.turns = tf.Variable(0, dtype=tf.int64, trainable=False, name="turns")

    def step(self, x, y) -> None:
        with tf.GradientTape() as tape:
            logits = self.model(x, training=True)
            loss = cross_entropy(y, logits)
        grads = tape.gradient(loss, self.variables)
        if self.accumulate == 1:
            self.optimizer.apply(grads, self.variables)
        else:
            rows = tf.cast(tf.shape(x)[0], tf.float32)
            for total, grad in zip(self.sums, grads, strict=True):
                total.assign_add(grad * rows)
            self.rows.assign_add(rows)
            self.turns.assign_add(tf.ones([], tf.int64))
            due = tf.greater_equal(self.turns, self.accumulate)
            applied = tf.cond(due, self._apply_sums, lambda: tf.constant(False))
            self.updates.update_state(tf.cast(applied, tf.float32))
        self.metrics.update(y, logits, loss)

    def _apply_sums(self) -> tf.Tensor:
        rows = self.rows.read_value()
        self.optimizer.apply([s.read_value() / rows for s in self.sums], self.variables)
        for total in self.sums:
            total.assign(tf.zeros_like(total))
        self.rows.assign(0.0)
        self.turns.assign(tf.zeros([], tf.int64))
        return tf.constant(True)

    def flush(self) -> tf.Tensor:
        """Apply a partial sum left at the epoch's end (compiled: one call an epoch)."""
        applied = tf.cond(tf.greater(self.turns, 0), self._apply_sums, lambda: tf.constant(False))
        self.updates.update_state(tf.cast(applied, tf.float32))
        return applied


def one_step_epoch(train_step: Callable, dataset: tf.data.Dataset) -> Callable[[], None]:
    """An epoch as one compiled call per batch, the batch taken from the iterator inside
    the call (a conditional on the next one), as beatloop's and Keras's loops do at K=1:
    a Python ``for`` over the data set (engine_overhead's ``per_batch_epoch``) would also
    time an eager iterator step per batch."""

    @tf.function
    def run_one(iterator) -> tf.Tensor:
        batch = iterator.get_next_as_optional()

        def run() -> tf.Tensor:
            train_step(*batch.get_value())
            return tf.constant(1)

        return tf.cond(batch.has_value(), run, lambda: tf.constant(0))

    def run_epoch() -> None:
        iterator = iter(dataset)
        while int(run_one(iterator)):
            pass

    return run_epoch


def run_handwritten(dataset, weights, epochs: int, spe: int, accumulate: int) -> Timed:
    """The hand-written loop: one compiled call per batch (``spe=1``) or ``spe`` steps
    per compiled call (engine_overhead's ``multi_step_epoch``); each epoch's time
    includes the flush and reading the metrics, as in ``fit``."""
    as_users_run()
    hand = HandWritten(weights, accumulate)
    if spe == 1:
        run_epoch = one_step_epoch(hand.step, dataset)
    else:
        run_epoch = eo.multi_step_epoch(hand.step, dataset, spe)
    flush = tf.function(hand.flush) if accumulate > 1 else None
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        hand.metrics.reset()
        hand.updates.reset_state()
        run_epoch()
        if flush is not None:
            flush()
        hand.metrics.results()
        updates = float(hand.updates.result()) if accumulate > 1 else float(_batches(dataset))
        times.append(time.perf_counter() - start)
    return Timed(times, updates)


@attrs.frozen
class Loop:
    """A loop to time at each K: ``run(dataset, weights, epochs, spe)`` gives a ``Timed``."""

    key: str
    label: str
    run: Callable[..., Timed]


def _loop(key: str, label: str, run, accumulate: int) -> Loop:
    return Loop(key, label, lambda d, w, e, k: run(d, w, e, k, accumulate))


LOOPS = (
    _loop("beatloop_plain", "beatloop, plain", run_beatloop, 1),
    _loop("beatloop_accumulate", f"beatloop, accumulate={ACCUMULATE}", run_beatloop, ACCUMULATE),
    _loop("hand_plain", "hand-written, plain", run_handwritten, 1),
    _loop("hand_accumulate", f"hand-written, accumulate={ACCUMULATE}", run_handwritten, ACCUMULATE),
)
#: (label, numerator, denominator) of each ratio of times per batch (above 1: slower).
RATIOS = (
    (f"beatloop: accumulate={ACCUMULATE} / plain", "beatloop_accumulate", "beatloop_plain"),
    (f"hand-written: accumulate={ACCUMULATE} / plain", "hand_accumulate", "hand_plain"),
    (f"accumulate={ACCUMULATE}: beatloop / hand-written", "beatloop_accumulate", "hand_accumulate"),
    ("plain: beatloop / hand-written", "beatloop_plain", "hand_plain"),
)


# --- measuring and reporting --------------------------------------------------------------


def measure(settings) -> tuple[dict, dict]:
    """Milliseconds per batch of each loop at each K, one figure per repeat (the fastest
    epoch after the first); repeats interleaved, the order rotated each repeat. Also the
    updates each fit's last epoch made."""
    x, y = eo.make_arrays(settings.examples)
    weights = eo.initial_weights()
    dataset = eo.make_dataset(x, y, BATCH)
    batches = _batches(dataset)
    runs = [(loop, k) for k in settings.spe for loop in LOOPS]
    ms: dict[str, dict[int, list[float]]] = {
        loop.key: {k: [] for k in settings.spe} for loop in LOOPS
    }
    updates: dict[str, dict[int, float]] = {loop.key: {} for loop in LOOPS}
    for repeat in range(settings.repeats):
        shift = repeat % len(runs)
        for loop, k in runs[shift:] + runs[:shift]:
            timed = loop.run(dataset, weights, settings.epochs, k)
            figure = 1000 * min(timed.times[1:]) / batches
            ms[loop.key][k].append(figure)
            updates[loop.key][k] = timed.updates
            print(
                f"repeat {repeat + 1}/{settings.repeats}  spe {k:>3}  {loop.label:<30} "
                f"{figure:8.4f} ms/batch  ({timed.updates:.0f} updates/epoch)",
                file=sys.stderr,
                flush=True,
            )
    return ms, updates


def ratio_rows(ms: dict, spe: list[int]) -> list[dict]:
    """Each ratio at each K: of the medians, and the spread of the ratio within repeats."""
    rows = []
    for label, top, bottom in RATIOS:
        values, spreads = {}, {}
        for k in spe:
            values[k] = statistics.median(ms[top][k]) / statistics.median(ms[bottom][k])
            paired = [a / b for a, b in zip(ms[top][k], ms[bottom][k], strict=True)]
            spreads[k] = {"repeats": paired, "spread": spread(paired)}
        rows.append({"name": label, "values": values, "within_repeats": spreads})
    return rows


def print_report(settings, ms, updates, rows, batches: int) -> None:
    spe = settings.spe
    print(
        f"\nms per batch (micro-step), median of {settings.repeats} repeat(s); "
        f"{batches} batches of {BATCH} an epoch, {settings.epochs} epochs per fit, first "
        "dropped, fastest kept (±: half the range over repeats)"
    )
    header = f"{'loop':<44}" + "".join(f"{'spe=' + str(k):>10}      " for k in spe)
    header += "updates/epoch"
    print(header)
    print("-" * len(header))
    for loop in LOOPS:
        cells = "".join(
            f"{statistics.median(ms[loop.key][k]):>10.4f} {spread(ms[loop.key][k]):<5}" for k in spe
        )
        counts = "/".join(f"{updates[loop.key][k]:.0f}" for k in spe)
        print(f"{loop.label:<44}{cells} {counts:>12}")
    print(
        f"\n{'ratio of times per batch (above 1: slower)':<44}"
        + "".join(f"{'spe=' + str(k):>10}      " for k in spe)
    )
    print("-" * (44 + 16 * len(spe)))
    for row in rows:
        cells = "".join(
            f"{row['values'][k]:>9.3f}x {row['within_repeats'][k]['spread']:<5}" for k in spe
        )
        print(f"{row['name']:<44}{cells}")


def write_json(path: Path, settings, ms, updates, rows) -> None:
    record = {
        "settings": {
            "examples": settings.examples,
            "batch_size": BATCH,
            "accumulate": ACCUMULATE,
            "epochs": settings.epochs,
            "repeats": settings.repeats,
            "steps_per_execution": settings.spe,
        },
        "versions": {
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "beatloop": beatloop.__version__,
        },
        "ms_per_batch": {
            loop.key: {
                str(k): {
                    "median": statistics.median(ms[loop.key][k]),
                    "repeats": ms[loop.key][k],
                    "updates_per_epoch": updates[loop.key][k],
                }
                for k in settings.spe
            }
            for loop in LOOPS
        },
        "ratios": [
            {
                "name": row["name"],
                "values": {str(k): v for k, v in row["values"].items()},
                "within_repeats": {str(k): v for k, v in row["within_repeats"].items()},
            }
            for row in rows
        ],
    }
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings; ``--quick`` changes the defaults, explicit flags still win."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, help=f"fits per loop and K (default {DEFAULTS['repeats']})"
    )
    parser.add_argument(
        "--epochs", type=int, help=f"epochs per fit, first dropped (default {DEFAULTS['epochs']})"
    )
    parser.add_argument(
        "--examples", type=int, help=f"examples per epoch (default {DEFAULTS['examples']})"
    )
    parser.add_argument(
        "--spe", help=f"comma-separated steps per call, K (default {DEFAULTS['spe']})"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 repeat, 2 epochs, 2048 examples"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    for name, default in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    args.spe = [int(s) for s in str(args.spe).split(",") if s.strip()]
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first epoch is dropped)")
    if args.repeats < 1 or args.examples < BATCH or not args.spe or min(args.spe) < 1:
        parser.error("--repeats and --spe must be positive, --examples at least a batch")
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure every loop at every K, print the tables, and optionally write the JSON."""
    settings = parse_args(argv)
    ms, updates = measure(settings)
    rows = ratio_rows(ms, settings.spe)
    batches = -(-settings.examples // BATCH)
    print_report(settings, ms, updates, rows, batches)
    if settings.json is not None:
        write_json(settings.json, settings, ms, updates, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
