"""The docs' MAML recipe (docs/schedules.md, ``models.raw`` and ``stateless_call``)
against the same second-order MAML written as a plain TensorFlow loop, in a fresh
process (graph names, and so Grappler's sums, depend on what the process built before).

``OUT``: runs the docs block (its own training included), then trains twin learners
for two epochs, one with beatloop and one with the loop, with one step per compiled call
(as the loop runs) and with the engine's default, and writes JSON: each time the
largest weight difference between them and how far training moved the weights.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import keras
import tensorflow as tf
from helpers import all_weights, find_block, largest_difference, twin_models

import beatloop


def hand_written_maml(learner, data, epochs: int, inner_rate: float) -> None:
    """MAML as a TensorFlow user writes it: an inner tape inside the outer one, one
    ``tf.function`` step traced for the data's shapes, Adam on the learner."""
    optimizer = keras.optimizers.Adam(1e-3)
    weights = list(learner.trainable_variables)
    optimizer.build(weights)

    @tf.function(input_signature=[data.element_spec])
    def step(batch):
        half = tf.shape(batch["x"])[0] // 2
        with tf.GradientTape() as outer:
            fixed = list(learner.non_trainable_variables)
            with tf.GradientTape() as inner:
                predicted, _ = learner.stateless_call(
                    weights, fixed, batch["x"][:half], training=True
                )
                support_loss = tf.reduce_mean(tf.square(predicted - batch["y"][:half]))
            steps = inner.gradient(support_loss, weights)
            adapted = [w - inner_rate * g for w, g in zip(weights, steps, strict=True)]
            predicted, _ = learner.stateless_call(adapted, fixed, batch["x"][half:], training=True)
            loss = tf.reduce_mean(tf.square(predicted - batch["y"][half:]))
        optimizer.apply_gradients(zip(outer.gradient(loss, weights), weights, strict=True))

    for _ in range(epochs):
        for batch in data:
            step(batch)


def compare(recipe, data, **fit_options) -> dict[str, float]:
    """Twin learners trained two epochs, by beatloop and by the loop."""
    ours, theirs = twin_models(recipe, data)
    start = all_weights(ours)
    beatloop.fit(recipe, data=data, models=ours, epochs=2, seed=0, progress=False, **fit_options)
    hand_written_maml(theirs["learner"], data, epochs=2, inner_rate=recipe.inner_rate)
    return {
        "max_difference": largest_difference(all_weights(ours), all_weights(theirs)),
        "moved": largest_difference(all_weights(ours), start, same_names=True),
    }


def main(out: str) -> None:
    namespace: dict = {}
    find_block("class Maml").run(namespace)
    recipe, data = namespace["Maml"](), namespace["sine_tasks"](1)
    report = {
        "block_losses": namespace["result"].history["query"],
        # one step per compiled call, as the loop runs it; then the engine's default
        "spe=1": compare(recipe, data, steps_per_execution=1),
        "spe=auto": compare(recipe, data),
    }
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
