"""EMA update cost: a BYOL-like schedule with and without an `EMA` target update, and the
same two steps hand-written.

An online encoder (64-64-64) and predictor (64-64) are trained by one SGD beat on a
cosine loss between two noisy views, the second seen by a target encoder of the online
one's shape; with the update, `EMA("online", "target", 0.99)` follows each step (the
hand-written loop assigns `0.99 * t + 0.01 * s` in its step); without it, the target is
frozen. Digits repeated to 184 batches of 64 an epoch, 32 steps per compiled call. Each
fit's first epoch (tracing) is dropped and its fastest remaining epoch kept; the figures
are the median and the best over interleaved repeats.

    python benchmarks/updates.py             # full run
    python benchmarks/updates.py --quick     # smoke run
    python benchmarks/updates.py --cpu-time  # on a shared machine
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import statistics
import sys
import time
import types

import common
import keras
import tensorflow as tf
from common import handwritten_epochs, race, spread, timed_fit

import beatloop
from beatloop.datasets import digits_arrays

BATCH, PASSES, MULTI_STEP, WIDTH, DECAY, NOISE = 64, 8, 32, 64, 0.99, 0.1
EMA_COST, VERSUS_HAND = 1.05, 1.0


def make_data() -> tf.data.Dataset:
    train, _ = digits_arrays(0)
    batches = tf.data.Dataset.from_tensor_slices({"x": train["x"]}).batch(BATCH)
    return batches.repeat(PASSES).prefetch(tf.data.AUTOTUNE)


def make_models(seed: int = 0) -> dict[str, keras.Model]:
    keras.utils.set_random_seed(seed)

    def encoder(name):
        layers = [keras.layers.Dense(WIDTH, activation="relu"), keras.layers.Dense(WIDTH)]
        return keras.Sequential([keras.Input((64,)), *layers], name=name)

    predictor = keras.Sequential(
        [keras.Input((WIDTH,)), keras.layers.Dense(WIDTH, activation="relu")], name="predictor"
    )
    return {"online": encoder("online"), "predictor": predictor, "target": encoder("target")}


def byol_loss(online, predictor, target, x, random) -> tf.Tensor:
    view1 = x + NOISE * random.normal(tf.shape(x))
    view2 = x + NOISE * random.normal(tf.shape(x))
    p = tf.math.l2_normalize(predictor(online(view1)), axis=-1)
    z = tf.stop_gradient(tf.math.l2_normalize(target(view2), axis=-1))
    return tf.reduce_mean(2.0 - 2.0 * tf.reduce_sum(p * z, axis=-1))


class Byol(beatloop.Recipe):
    """The BYOL-like step, with the EMA target update or with the target frozen."""

    name = "byol_benchmark"
    batch_keys = {"x": 2}

    def __init__(self, ema: bool):
        super().__init__()
        self.ema = ema

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.05)}

    def losses(self):
        def loss(models, batch):
            online, predictor, target = (models[n] for n in ("online", "predictor", "target"))
            return byol_loss(online, predictor, target, batch["x"], models.random)

        return {"byol": loss}

    def schedule(self):
        beat = beatloop.Beat("byol", "sgd", updates=("online", "predictor"))
        if self.ema:
            return beatloop.Schedule([beat, beatloop.EMA("online", "target", DECAY)])
        return beatloop.Schedule(beat, frozen="target")


def run_beatloop(data, epochs: int, ema: bool) -> list[float]:
    return timed_fit(Byol(ema), data, epochs, MULTI_STEP, models=make_models())


def run_handwritten(data, epochs: int, ema: bool) -> list[float]:
    models = make_models()
    online, predictor, target = (models[n] for n in ("online", "predictor", "target"))
    optimizer = keras.optimizers.SGD(0.05)
    variables = online.trainable_variables + predictor.trainable_variables
    optimizer.build(variables)
    random = tf.random.Generator.from_seed(0)
    pairs = list(zip(target.trainable_variables, online.trainable_variables, strict=True))
    metrics = {"byol": keras.metrics.Mean("byol")}

    def step(batch):
        x = batch["x"]
        with tf.GradientTape() as tape:
            loss = byol_loss(
                lambda v: online(v, training=True),
                lambda v: predictor(v, training=True),
                lambda v: target(v, training=False),
                x,
                random,
            )
        optimizer.apply(tape.gradient(loss, variables), variables)
        if ema:
            for t, s in pairs:
                t.assign(tf.constant(DECAY) * t + tf.constant(1 - DECAY) * s)
        metrics["byol"].update_state(loss, sample_weight=tf.shape(x)[0])

    return handwritten_epochs(step, data, metrics, epochs, MULTI_STEP)


LOOPS = {
    "beatloop, EMA": lambda data, epochs: run_beatloop(data, epochs, True),
    "beatloop, no EMA": lambda data, epochs: run_beatloop(data, epochs, False),
    "hand-written, EMA": lambda data, epochs: run_handwritten(data, epochs, True),
    "hand-written, no EMA": lambda data, epochs: run_handwritten(data, epochs, False),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per fit, first dropped")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2 epochs")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time epochs by this process's CPU time, not wall time (on a machine other "
        "work shares, its load then inflates the figures less)",
    )
    args = parser.parse_args(argv)
    if args.cpu_time:  # the timers in common read time.perf_counter
        common.time = types.SimpleNamespace(perf_counter=time.process_time)
    repeats, epochs = (1, 2) if args.quick else (args.repeats, max(args.epochs, 2))
    data = make_data()
    steps = int(data.cardinality())
    rates: dict[str, list[float]] = {name: [] for name in LOOPS}

    def log(line: str) -> None:
        print(line, file=sys.stderr)
        name, rate = line[line.index("  ") + 2 :].rsplit(None, 2)[0].strip(), line.split()[-2]
        rates[name].append(float(rate.replace(",", "")))

    bound = {name: (lambda epochs, loop=loop: loop(data, epochs)) for name, loop in LOOPS.items()}
    median = race(bound, steps, repeats, epochs, log)
    clock = "CPU" if args.cpu_time else "wall"
    print(f"\nBYOL-like steps/{clock} s ({steps} steps/epoch, spe={MULTI_STEP}), {repeats} repeats")
    print(f"{'loop':<28} {'median':>10} {'spread':>6} {'best':>8}")
    for name, value in median.items():
        print(f"{name:<28} {value:10,.0f} {spread(rates[name]):>6} {max(rates[name]):8,.0f}")
    cost = median["beatloop, no EMA"] / median["beatloop, EMA"]
    hand = median["beatloop, EMA"] / median["hand-written, EMA"]
    print(f"\n{'EMA cost (no EMA / EMA time)':<36} {cost:6.3f}x  <= {EMA_COST}")
    print(f"{'beatloop / hand-written, EMA':<36} {hand:6.2f}x  >= {VERSUS_HAND}")
    bare = median["beatloop, no EMA"] / median["hand-written, no EMA"]
    print(f"{'beatloop / hand-written, no EMA':<36} {bare:6.2f}x")
    print(f"{'median of each repeat: EMA cost':<36} {statistics.median(_costs(rates)):6.3f}x")
    best = max(rates["beatloop, no EMA"]) / max(rates["beatloop, EMA"])
    print(f"{'best epochs: EMA cost':<36} {best:6.3f}x")
    versus = max(rates["beatloop, EMA"]) / max(rates["hand-written, EMA"])
    print(f"{'best epochs: beatloop / hand-written, EMA':<36} {versus:6.2f}x")
    return 0


def _costs(rates: dict[str, list[float]]) -> list[float]:
    """The EMA cost within each repeat (the two beatloop runs of one repeat are neighbours
    in time, so machine noise cancels more than between medians)."""
    return [a / b for a, b in zip(rates["beatloop, no EMA"], rates["beatloop, EMA"], strict=True)]


if __name__ == "__main__":
    sys.exit(main())
