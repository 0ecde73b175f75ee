"""Alternating multi-task step throughput: beatloop's `multitask` recipe with
``schedule=alternating`` beside the hand-written loop doing the same updates.

Each step applies one shared Adam twice: the digit beat (backbone and digit head on the
digit cross-entropy), then the ink beat (backbone and ink head on the ink regression),
and keeps the same metrics (each beat's loss, each task's loss, digit accuracy, ink
mean absolute error). Digits repeated to 180 batches of 64 per epoch; the first epoch
(tracing) is dropped, the fastest remaining one kept, the median over interleaved repeats.

    python benchmarks/multitask_step.py             # full run
    python benchmarks/multitask_step.py --quick     # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys

import keras
import tensorflow as tf
from common import handwritten_epochs, race_main, timed_fit

import beatloop
from beatloop.datasets import digits_arrays
from beatloop.recipes.multitask import Multitask

BATCH, PASSES, MULTI_STEP, TARGET = 64, 8, 32, 1.0
METRICS = ("task_digit", "task_ink", "digit_loss", "ink_loss")


def make_data() -> tf.data.Dataset:
    train, _ = digits_arrays(0)
    batches = tf.data.Dataset.from_tensor_slices(train).batch(BATCH)
    return batches.repeat(PASSES).prefetch(tf.data.AUTOTUNE)


class StepOnly(Multitask):
    """The alternating multitask recipe without its epoch-end weight figures."""

    def epoch_figures(self, run):
        return {}


def make_parts(data):
    """The recipe's own models and optimizer, built alike for both loops."""
    keras.utils.set_random_seed(0)
    recipe = StepOnly(beatloop.make_recipe("multitask", {"schedule": "alternating"}).config)
    models = recipe.build_models(data.element_spec)
    return recipe, models, recipe.build_optimizers()["optimizer"]


def run_beatloop(data, epochs: int, steps_per_execution: int) -> list[float]:
    recipe, models, optimizer = make_parts(data)
    parts = {"models": models, "optimizers": {"optimizer": optimizer}}
    return timed_fit(recipe, data, epochs, steps_per_execution, **parts)


def run_handwritten(data, epochs: int, steps_per_call: int | None) -> list[float]:
    _, models, optimizer = make_parts(data)
    backbone, digit_head, ink_head = models["backbone"], models["head_digit"], models["head_ink"]
    digit_vars = [*backbone.trainable_variables, *digit_head.trainable_variables]
    ink_vars = [*backbone.trainable_variables, *ink_head.trainable_variables]
    optimizer.build([*digit_vars, *ink_head.trainable_variables])
    weights = models["loss_weights"].variable
    metrics = {name: keras.metrics.Mean(name) for name in METRICS}
    metrics["digit_accuracy"] = keras.metrics.SparseCategoricalAccuracy()
    metrics["ink_mae"] = keras.metrics.MeanAbsoluteError()

    def step(batch):
        x, y = batch["x"], batch["y"]
        count = tf.shape(x)[0]
        ink = tf.reduce_mean(x, axis=1)
        with tf.GradientTape() as tape:
            logits = digit_head(backbone(x, training=True), training=True)
            digit_loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            )
            weighted = weights[0] * digit_loss
        optimizer.apply(tape.gradient(weighted, digit_vars), digit_vars)
        with tf.GradientTape() as tape:
            predicted = ink_head(backbone(x, training=True), training=True)
            ink_loss = tf.reduce_mean(tf.square(predicted[:, 0] - ink))
            weighted_ink = weights[1] * ink_loss
        optimizer.apply(tape.gradient(weighted_ink, ink_vars), ink_vars)
        metrics["task_digit"].update_state(weighted, sample_weight=count)
        metrics["task_ink"].update_state(weighted_ink, sample_weight=count)
        metrics["digit_loss"].update_state(digit_loss)
        metrics["ink_loss"].update_state(ink_loss)
        metrics["digit_accuracy"].update_state(y, logits)
        metrics["ink_mae"].update_state(ink, predicted[:, 0])

    return handwritten_epochs(step, data, metrics, epochs, steps_per_call)


LOOPS = {
    "beatloop multitask, spe=1": lambda data, epochs: run_beatloop(data, epochs, 1),
    f"beatloop multitask, spe={MULTI_STEP}": lambda data, epochs: run_beatloop(
        data, epochs, MULTI_STEP
    ),
    "hand-written two-apply step, per batch": lambda data, epochs: run_handwritten(
        data, epochs, None
    ),
    f"hand-written two-apply, {MULTI_STEP} steps/call": lambda data, epochs: run_handwritten(
        data, epochs, MULTI_STEP
    ),
}


def main(argv=None) -> int:
    race_main(argv, __doc__.splitlines()[0], make_data, LOOPS, "multitask", TARGET)
    return 0


if __name__ == "__main__":
    sys.exit(main())
