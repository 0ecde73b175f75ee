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

import sys

import keras
import tensorflow as tf
from common import handwritten_epochs, race_main, timed_fit

from beatloop.datasets import digits_arrays
from beatloop.recipes.gan import Gan

LATENT, BATCH, PASSES, MULTI_STEP = 16, 64, 8, 32
TARGET = 1.0


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
    return timed_fit(
        StepOnly(),
        data,
        epochs,
        steps_per_execution,
        models={"generator": generator, "discriminator": discriminator},
        optimizers={"d_optimizer": d_opt, "g_optimizer": g_opt},
    )


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
    return handwritten_epochs(step, data, metrics, epochs, steps_per_call)


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
    median = race_main(argv, __doc__.splitlines()[0], make_data, LOOPS, "GAN", TARGET)
    names = list(LOOPS)
    best = max(median[n] for n in names[:2]) / max(median[n] for n in names[2:])
    print(f"{'beatloop best / fastest hand-written':<44} {best:9.2f}x  >= {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
