"""Gradient transforms and combinations against hand-written TensorFlow loops, bit for
bit, for ``test_combine.py``: ``python combine_reference.py OUT``.

Runs first in a fresh process because the comparison is exact (see
``tutorial_dcgan.py``'s docstring: graphs traced earlier in a process can shift node
names, and grappler's sums with them); the test runs it through ``pcgrad_mirrored.py
OUT REFERENCE_OUT``, which calls ``main`` before it traces anything. Each comparison
trains twin models (same initial weights, same data order) with beatloop and with a
``tf.function`` / ``GradientTape`` loop, and writes the largest weight difference and
how far training moved the weights to OUT (JSON).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import keras
import numpy as np
import tensorflow as tf
from helpers import TwoModels, all_weights, dict_batches, largest_difference

import beatloop
from beatloop.datasets import digits_arrays

#: Three tasks on the shared backbone: the digit, its ink (regression) and its parity.
PCGRAD = {
    "tasks": ("digit", "ink", "odd=classification:2"),
    "combine": "pcgrad",
    "hidden": 16,
    "learning_rate": 0.01,
}
EPOCHS = 2


def three_task_data() -> tf.data.Dataset:
    """320 training digits with an ``odd`` label, unshuffled batches of 32 (10 steps)."""
    train, _ = digits_arrays(0)
    return dict_batches(train, 32, 320, odd=(train["y"] % 2).astype(np.int32))


def clip_kernels(gradients, variables):
    """The user's transform: clip each kernel's gradient to norm 0.05, biases as they are."""
    return [
        tf.clip_by_norm(g, 0.05) if v.path.endswith("kernel") else g
        for g, v in zip(gradients, variables, strict=True)
    ]


def figures(ours: dict, theirs: dict, start: dict) -> dict[str, float]:
    return {
        "max_difference": largest_difference(all_weights(ours), all_weights(theirs)),
        "moved": largest_difference(all_weights(ours), start, same_names=True),
    }


def handwritten_pcgrad(models, recipe, data, epochs: int) -> None:
    """The multitask recipe's pcgrad step by hand: one tape per task over one backbone
    pass, PCGrad on the backbone's gradients, one Adam update of everything."""
    tasks, backbone = recipe.tasks, models["backbone"]
    heads = [models[f"head_{task.name}"] for task in tasks]
    weights = models["loss_weights"].variable
    shared = list(backbone.trainable_variables)
    per_task = [shared + list(head.trainable_variables) for head in heads]
    variables = shared + [v for head in heads for v in head.trainable_variables]
    optimizer = keras.optimizers.Adam(recipe.config.learning_rate)
    pcgrad = beatloop.PCGrad()

    @tf.function(input_signature=[data.element_spec])
    def train_step(batch):
        with contextlib.ExitStack() as stack:
            tapes = [stack.enter_context(tf.GradientTape()) for _ in tasks]
            features = backbone(batch["x"], training=True)
            losses = [
                weights[i] * task.loss(heads[i](features, training=True), batch)
                for i, task in enumerate(tasks)
            ]
        triples = zip(tapes, losses, per_task, strict=True)
        grads = [tape.gradient(loss, own) for tape, loss, own in triples]
        combined = pcgrad([g[: len(shared)] for g in grads], shared)
        optimizer.apply(combined + [g for task in grads for g in task[len(shared) :]], variables)

    for _ in range(epochs):
        for batch in data:
            train_step(batch)


def compare_pcgrad(steps_per_execution: int) -> dict[str, float]:
    data = three_task_data()
    recipe = beatloop.make_recipe("multitask", PCGRAD)
    keras.utils.set_random_seed(3)
    ours = recipe.build_models(data.element_spec)
    keras.utils.set_random_seed(3)
    theirs = recipe.build_models(data.element_spec)
    start = all_weights(ours)
    beatloop.fit(
        recipe, data=data, models=ours, epochs=EPOCHS, seed=0, progress=False,
        steps_per_execution=steps_per_execution,
    )  # fmt: skip
    handwritten_pcgrad(theirs, recipe, data, EPOCHS)
    return figures(ours, theirs, start)


def compare_transform() -> dict[str, float]:
    """A plain function as ``transform=`` against the same function in a loop."""
    train, _ = digits_arrays(0)
    data = dict_batches(train, 32, 320)
    schedule = beatloop.Schedule((TwoModels.beat("a", transform=clip_kernels), TwoModels.beat("b")))
    recipe = TwoModels(schedule, learning_rate=0.01)
    ours, theirs = recipe.build_models(data.element_spec), recipe.build_models(data.element_spec)
    start = all_weights(ours)
    beatloop.fit(recipe, data=data, models=ours, epochs=EPOCHS, seed=0, progress=False)
    optimizers = {name: keras.optimizers.SGD(recipe.learning_rate) for name in "ab"}

    @tf.function(input_signature=[data.element_spec])
    def train_step(batch):
        target = tf.cast(batch["y"], tf.float32)[:, None]
        for name in "ab":
            model = theirs[name]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(batch["x"], training=True) - target))
            grads = tape.gradient(loss, model.trainable_variables)
            if name == "a":
                grads = clip_kernels(grads, model.trainable_variables)
            optimizers[name].apply(grads, model.trainable_variables)

    for _ in range(EPOCHS):
        for batch in data:
            train_step(batch)
    unclipped = recipe.build_models(data.element_spec)
    plain = beatloop.Schedule((TwoModels.beat("a"), TwoModels.beat("b")))
    beatloop.fit(TwoModels(plain, learning_rate=0.01), data=data, models=unclipped,
                 epochs=EPOCHS, seed=0, progress=False)  # fmt: skip
    return {
        **figures(ours, theirs, start),
        "transform_mattered": largest_difference(all_weights(ours), all_weights(unclipped)),
    }


def main(out: str) -> None:
    report = {"transform": compare_transform()}
    report.update({f"pcgrad spe={k}": compare_pcgrad(k) for k in (1, 4)})
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
