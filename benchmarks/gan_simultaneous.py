"""Simultaneous GAN step throughput: the `gan` recipe with `update=simultaneous` beside
the TensorFlow DCGAN tutorial's hand-written step (one forward, two tapes), and beside
the recipe's own `update=alternating` (one generator forward more per step).

The models are the recipe's DCGAN-style ones (`architecture=conv`: batch-normalised
transposed convolutions up, strided convolutions down, on 8x8 digits); optimizers, data
and metrics are `gan_step.py`'s: Adam, digits repeated to 184 batches of 64 per epoch.
Each fit's first epoch (tracing) is dropped and its fastest remaining epoch kept; the
figure is the median over interleaved repeats.

    python benchmarks/gan_simultaneous.py             # full run
    python benchmarks/gan_simultaneous.py --quick     # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys

import keras
import tensorflow as tf
from common import handwritten_epochs, race_main, timed_fit
from gan_step import LATENT, MULTI_STEP, StepOnly, make_data, make_optimizers

from beatloop.recipes.gan import GanConfig

CONFIG = {"architecture": "conv", "hidden": 32, "latent_dim": LATENT}


def make_models(seed: int = 0) -> tuple[keras.Model, keras.Model]:
    keras.utils.set_random_seed(seed)
    return StepOnly(GanConfig(**CONFIG))._conv_models((64,))


TARGET = 1.0


def run_beatloop(data, epochs: int, steps_per_execution: int, update: str) -> list[float]:
    generator, discriminator = make_models()
    d_opt, g_opt = make_optimizers()
    return timed_fit(
        StepOnly(GanConfig(**CONFIG, update=update)),
        data,
        epochs,
        steps_per_execution,
        models={"generator": generator, "discriminator": discriminator},
        optimizers={"d_optimizer": d_opt, "g_optimizer": g_opt},
    )


def make_tutorial_step(generator, discriminator, d_opt, g_opt, metrics):
    """The tutorial's step: one generated batch, one discriminator pass over real and
    fake, two tapes, both updates after both gradients; plus the recipe's metrics."""

    def bce(targets, logits):
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(targets, logits))

    def train_step(batch):
        real = batch["x"]
        count = tf.shape(real)[0]
        noise = tf.random.normal([count, LATENT])
        with tf.GradientTape() as gen_tape, tf.GradientTape() as disc_tape:
            fake = generator(noise, training=True)
            real_logits = discriminator(real, training=True)
            fake_logits = discriminator(fake, training=True)
            g_loss = bce(tf.ones_like(fake_logits), fake_logits)
            d_loss = bce(tf.ones_like(real_logits), real_logits) + bce(
                tf.zeros_like(fake_logits), fake_logits
            )
        g_vars, d_vars = generator.trainable_variables, discriminator.trainable_variables
        g_grads = gen_tape.gradient(g_loss, g_vars)
        d_grads = disc_tape.gradient(d_loss, d_vars)
        g_opt.apply_gradients(zip(g_grads, g_vars, strict=True))
        d_opt.apply_gradients(zip(d_grads, d_vars, strict=True))
        metrics["d_loss"].update_state(d_loss, sample_weight=count)
        metrics["g_loss"].update_state(g_loss, sample_weight=count)
        metrics["d_real"].update_state(tf.reduce_mean(tf.sigmoid(real_logits)))
        metrics["d_fake"].update_state(tf.reduce_mean(tf.sigmoid(fake_logits)))

    return train_step


def run_tutorial(data, epochs: int, steps_per_call: int | None) -> list[float]:
    generator, discriminator = make_models()
    d_opt, g_opt = make_optimizers()
    d_opt.build(discriminator.trainable_variables)
    g_opt.build(generator.trainable_variables)
    metrics = {name: keras.metrics.Mean(name) for name in ("d_loss", "g_loss", "d_real", "d_fake")}
    step = make_tutorial_step(generator, discriminator, d_opt, g_opt, metrics)
    return handwritten_epochs(step, data, metrics, epochs, steps_per_call)


SIMULTANEOUS = ("beatloop simultaneous, spe=1", f"beatloop simultaneous, spe={MULTI_STEP}")
ALTERNATING = ("beatloop alternating, spe=1", f"beatloop alternating, spe={MULTI_STEP}")
LOOPS = {
    SIMULTANEOUS[0]: lambda data, epochs: run_beatloop(data, epochs, 1, "simultaneous"),
    SIMULTANEOUS[1]: lambda data, epochs: run_beatloop(data, epochs, MULTI_STEP, "simultaneous"),
    "tutorial step, per batch": lambda data, epochs: run_tutorial(data, epochs, None),
    f"tutorial step, {MULTI_STEP} steps/call": lambda data, epochs: run_tutorial(
        data, epochs, MULTI_STEP
    ),
    ALTERNATING[0]: lambda data, epochs: run_beatloop(data, epochs, 1, "alternating"),
    ALTERNATING[1]: lambda data, epochs: run_beatloop(data, epochs, MULTI_STEP, "alternating"),
}


def main(argv=None) -> int:
    median = race_main(argv, __doc__.splitlines()[0], make_data, LOOPS, "GAN", TARGET)
    for simultaneous, alternating in zip(SIMULTANEOUS, ALTERNATING, strict=True):
        ratio = median[simultaneous] / median[alternating]
        verdict = "ok" if ratio > 1.0 else "--"
        print(f"{simultaneous + ' / alternating':<44} {ratio:9.2f}x  >  1.0 {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
