"""GAN step throughput: beatloop's `gan` recipe beside a hand-written two-tape loop.

Both train the same generator (16-64-64-64) and discriminator (64-64-1) from the same
initial weights with the same optimizers, losses and metrics (means of both losses and
of the discriminator's probabilities on real and generated samples), on the digits
repeated to 184 batches of 64 per epoch. Each fit's first epoch (tracing) is dropped and
its fastest remaining epoch kept; the figure is the median over interleaved repeats.

    python benchmarks/gan_step.py             # full run
    python benchmarks/gan_step.py --quick     # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import statistics
import sys
import time

import keras
import tensorflow as tf
from common import EpochTimer

import beatloop
from beatloop.data import digits_arrays
from beatloop.recipes.gan import Gan

LATENT, BATCH, PASSES, MULTI_STEP = 16, 64, 8, 32
TARGET = 0.95


def make_data() -> tf.data.Dataset:
    """Digits in [-1, 1], batched, the epoch made of several passes so it lasts."""
    train, _ = digits_arrays(0, signed=True)
    batches = tf.data.Dataset.from_tensor_slices({"x": train["x"]}).batch(BATCH)
    return batches.repeat(PASSES).prefetch(tf.data.AUTOTUNE)


def make_models(seed: int = 0) -> tuple[keras.Model, keras.Model]:
    keras.utils.set_random_seed(seed)
    dense = keras.layers.Dense
    generator = keras.Sequential(
        [keras.Input((LATENT,)), dense(64, "relu"), dense(64, "relu"), dense(64, "tanh")]
    )
    discriminator = keras.Sequential([keras.Input((64,)), dense(64, "leaky_relu"), dense(1)])
    return generator, discriminator


def make_optimizers() -> tuple[keras.optimizers.Optimizer, keras.optimizers.Optimizer]:
    return keras.optimizers.Adam(1e-3, beta_1=0.5), keras.optimizers.Adam(1e-3, beta_1=0.5)


class StepOnly(Gan):
    """The gan recipe without its end-of-epoch sample figures and grid: only the step."""

    def epoch_figures(self, run):
        return {}

    def callbacks(self):
        return []


def run_beatloop(data, epochs: int, steps_per_execution: int) -> list[float]:
    generator, discriminator = make_models()
    d_opt, g_opt = make_optimizers()
    timer = EpochTimer()
    beatloop.fit(
        StepOnly(),
        data=data,
        models={"generator": generator, "discriminator": discriminator},
        optimizers={"d_optimizer": d_opt, "g_optimizer": g_opt},
        epochs=epochs,
        seed=0,
        steps_per_execution=steps_per_execution,
        progress=False,
        callbacks=[timer],
    )
    return timer.times


def make_handwritten_step(generator, discriminator, d_opt, g_opt, metrics):
    """The step people write by hand: two tapes, one per network, in one function."""

    def bce(targets, logits):
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(targets, logits))

    def train_step(batch):
        real = batch["x"]
        count = tf.shape(real)[0]
        with tf.GradientTape() as tape:
            fake = generator(tf.random.normal([count, LATENT]), training=True)
            real_logits = discriminator(real, training=True)
            fake_logits = discriminator(fake, training=True)
            d_loss = bce(tf.ones_like(real_logits), real_logits) + bce(
                tf.zeros_like(fake_logits), fake_logits
            )
        variables = discriminator.trainable_variables
        d_opt.apply_gradients(zip(tape.gradient(d_loss, variables), variables, strict=True))
        with tf.GradientTape() as tape:
            fake_logits_g = discriminator(
                generator(tf.random.normal([count, LATENT]), training=True), training=True
            )
            g_loss = bce(tf.ones_like(fake_logits_g), fake_logits_g)
        variables = generator.trainable_variables
        g_opt.apply_gradients(zip(tape.gradient(g_loss, variables), variables, strict=True))
        metrics["d_loss"].update_state(d_loss, sample_weight=count)
        metrics["g_loss"].update_state(g_loss, sample_weight=count)
        metrics["d_real"].update_state(tf.reduce_mean(tf.sigmoid(real_logits)))
        metrics["d_fake"].update_state(tf.reduce_mean(tf.sigmoid(fake_logits)))

    return train_step


def run_handwritten(data, epochs: int, steps_per_call: int | None) -> list[float]:
    """Per-batch calls of a compiled step (``None``) or ``steps_per_call`` steps a call."""
    generator, discriminator = make_models()
    d_opt, g_opt = make_optimizers()
    d_opt.build(discriminator.trainable_variables)
    g_opt.build(generator.trainable_variables)
    metrics = {name: keras.metrics.Mean(name) for name in ("d_loss", "g_loss", "d_real", "d_fake")}
    step = make_handwritten_step(generator, discriminator, d_opt, g_opt, metrics)
    if steps_per_call is None:
        compiled = tf.function(step)

        def run_epoch():
            for batch in data:
                compiled(batch)

    else:

        @tf.function
        def run_steps(iterator):
            count = tf.constant(0)
            for _ in tf.range(steps_per_call):
                batch = iterator.get_next_as_optional()
                if not batch.has_value():
                    break
                step(batch.get_value())
                count += 1
            return count

        def run_epoch():
            iterator = iter(data)
            while int(run_steps(iterator)) == steps_per_call:
                pass

    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        for metric in metrics.values():
            metric.reset_state()
        run_epoch()
        _ = {name: float(m.result()) for name, m in metrics.items()}  # read, as fit does
        times.append(time.perf_counter() - start)
    return times


LOOPS = {
    "beatloop gan, spe=1": lambda data, epochs: run_beatloop(data, epochs, 1),
    f"beatloop gan, spe={MULTI_STEP}": lambda data, epochs: run_beatloop(data, epochs, MULTI_STEP),
    "hand-written two-tape step, per batch": lambda data, epochs: run_handwritten(
        data, epochs, None
    ),
    f"hand-written two-tape, {MULTI_STEP} steps/call": lambda data, epochs: run_handwritten(
        data, epochs, MULTI_STEP
    ),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per fit, first dropped")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2 epochs")
    args = parser.parse_args(argv)
    repeats, epochs = (1, 2) if args.quick else (args.repeats, max(args.epochs, 2))
    data = make_data()
    steps = int(data.cardinality())
    rates: dict[str, list[float]] = {name: [] for name in LOOPS}
    names = list(LOOPS)
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            rate = steps / min(LOOPS[name](data, epochs)[1:])
            rates[name].append(rate)
            print(
                f"repeat {repeat + 1}/{repeats}  {name:<40} {rate:8,.0f} steps/s", file=sys.stderr
            )
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\nGAN steps/s (batch {BATCH}, {steps} steps/epoch), median of {repeats} repeat(s)")
    for name, value in median.items():
        print(f"{name:<44} {value:10,.0f}")
    print(f"\n{'ratio':<44} {'value':>10}  target")
    for k in ("1", str(MULTI_STEP)):
        ours = median[f"beatloop gan, spe={k}"]
        theirs = median[
            "hand-written two-tape step, per batch"
            if k == "1"
            else f"hand-written two-tape, {MULTI_STEP} steps/call"
        ]
        ratio = ours / theirs
        verdict = "ok" if ratio >= TARGET else "--"
        print(f"{'beatloop spe=' + k + ' / hand-written':<44} {ratio:9.2f}x  >= {TARGET} {verdict}")
    best = max(median[n] for n in names[:2]) / max(median[n] for n in names[2:])
    print(f"{'beatloop best / fastest hand-written':<44} {best:9.2f}x  >= {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
