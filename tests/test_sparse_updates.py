"""Optimizers see the batch's true gradient on embedding models: an ``Embedding``'s
sparse gradient has its rows summed per index before any optimizer reads it. A token seen
three times moves by the learning rate at Adam's first step (Keras's own ``apply`` on
the raw rows moves it √3 times as far); batch N*B equals ``accumulate=N`` of batch B and
a hand-written loop handing Adam the dense gradient, for Adam, AdamW, RMSprop, Adagrad,
Adafactor and Lion, compiled, eagerly, with a clip, and on two replicas."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, find_block, largest_difference, run_python
from sparse_classifier import OneBeat, hand_written, text_classifier, token_batches

import beatloop

WORKER = Path(__file__).parent / "workers" / "sparse_mirrored.py"
LEARNING_RATE = 1e-3


def three_times_one() -> tuple[keras.Model, tf.data.Dataset]:
    """``Embedding(5, 2)`` under mean pooling and a ``Dense``, and one batch of one row
    looking id 1 up three times: each lookup's row gets the same gradient."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((3,), dtype="int64"), keras.layers.Embedding(5, 2),
         keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)]
    )  # fmt: skip
    batch = {"x": tf.constant([[1, 1, 1]], tf.int64), "y": tf.constant([0])}
    return model, tf.data.Dataset.from_tensors(batch)


def first_adam_step(how: dict) -> np.ndarray:
    """How far beatloop's first Adam step moves each entry of the table, in learning
    rates (``epsilon`` tiny: Adam's first step is then ``lr`` times the sign); a model
    for a mixed-precision run is built under its policy, to compute in it."""
    keras.mixed_precision.set_global_policy(how.get("precision", "float32"))
    try:
        model, data = three_times_one()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    before = model.layers[0].embeddings.numpy()
    optimizer = keras.optimizers.Adam(LEARNING_RATE, epsilon=1e-12)
    beatloop.fit(
        "supervised", data=(data, None), models={"model": model}, epochs=1, seed=0,
        optimizers={"optimizer": optimizer}, progress=False, steps_per_execution=1, **how,
    )  # fmt: skip
    return np.abs(model.layers[0].embeddings.numpy() - before) / LEARNING_RATE


@pytest.mark.parametrize(
    "how",
    [{}, {"debug": True}, {"precision": "mixed_float16"}, {"check_gradients": False}],
    ids=["compiled", "debug", "mixed_float16", "no-gradient-check"],
)
def test_a_token_seen_three_times_moves_by_the_learning_rate(how):
    moved = first_adam_step(how)
    np.testing.assert_allclose(moved[1], [1.0, 1.0], rtol=1e-5)
    assert not np.any(moved[[0, 2, 3, 4]])


def test_keras_s_own_apply_on_the_raw_rows_moves_it_root_three_times_as_far():
    """The difference from Keras ``fit`` (docs/schedules.md): Adam's second moment of the
    three rows is the sum of their squares, a third of the summed row's square."""
    model, data = three_times_one()
    before = model.layers[0].embeddings.numpy()
    optimizer = keras.optimizers.Adam(LEARNING_RATE, epsilon=1e-12)
    batch = next(iter(data))
    with tf.GradientTape() as tape:
        logits = model(batch["x"])
        loss = tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(batch["y"], logits, from_logits=True)
        )
    grads = tape.gradient(loss, model.trainable_variables)
    assert isinstance(grads[0], tf.IndexedSlices) and grads[0].values.shape[0] == 3
    optimizer.apply(grads, model.trainable_variables)
    moved = np.abs(model.layers[0].embeddings.numpy() - before) / LEARNING_RATE
    np.testing.assert_allclose(moved[1], [math.sqrt(3)] * 2, rtol=1e-5)


def test_the_schedules_page_block_prints_what_it_shows(capsys):
    """The reproduction on the schedules page ("Embeddings"): Keras's Adam and ``fit``
    move the row √3 learning rates, beatloop one; the page shows what the block prints."""
    block = find_block("by_beatloop")
    block.run({})
    printed = capsys.readouterr().out
    assert printed == block.shown_output
    assert printed.splitlines() == [
        "Keras's Adam: [1.732 1.732]",
        "fit: [1.732 1.732]",
        "beatloop: [1. 1.]",
    ]


def fit(data, optimizer, epochs: int = 2, *, debug: bool = False, **beat) -> dict:
    """``OneBeat`` fitted one step a call: its final weights."""
    recipe = OneBeat(lambda: optimizer, **beat)
    result = beatloop.fit(
        recipe, data=(data, None), epochs=epochs, seed=0, progress=False, steps_per_execution=1,
        debug=debug,
    )  # fmt: skip
    return all_weights(result.models)


def hand(data, optimizer, form: str, epochs: int = 2, transform=None) -> dict:
    """The hand-written loop's final weights (``form``: ``"dense"`` or ``"keras"``)."""
    model = hand_written(data, epochs, optimizer, form, transform=transform)
    return all_weights({"model": model})


@functools.cache
def adam_at_32(form: str) -> dict:
    """``hand`` at batch 32 with a fresh ``Adam(1e-2)``, no transform, 2 epochs: the
    references of the "compiled" and "debug" cases below, the same run, made once."""
    return hand(token_batches(32), keras.optimizers.Adam(1e-2), form)


@pytest.mark.parametrize("case", ["compiled", "debug", "clip"])
def test_batch_32_equals_four_accumulated_batches_of_8_and_the_dense_gradient(case):
    """192 rows: 6 updates an epoch either way, 12 in all, Adam; the clip by value
    clips the summed rows, as it clips the dense gradient (clipping each token's row
    would clip less)."""
    transform = beatloop.ClipByValue(0.02) if case == "clip" else None
    beat = {} if transform is None else {"transform": transform}
    debug = case == "debug"
    adam = lambda: keras.optimizers.Adam(1e-2)  # noqa: E731
    big = fit(token_batches(32), adam(), debug=debug, **beat)
    accumulated = fit(token_batches(8), adam(), debug=debug, accumulate=4, **beat)
    if transform is None:
        dense, keras_form = adam_at_32("dense"), adam_at_32("keras")
    else:
        dense = hand(token_batches(32), adam(), "dense", transform=transform)
        keras_form = hand(token_batches(32), adam(), "keras", transform=transform)
    assert largest_difference(dense, all_weights({"model": text_classifier()})) > 5e-2
    assert largest_difference(big, dense) <= 1e-6
    assert largest_difference(accumulated, dense) <= 1e-6
    assert largest_difference(keras_form, dense) > 1e-3  # Keras's form is another run


OPTIMIZERS = {
    "adamw": lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(1e-2),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "adafactor": lambda: keras.optimizers.Adafactor(0.1),
    "lion": lambda: keras.optimizers.Lion(1e-3),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_other_optimizers_see_the_summed_rows_too(name):
    """One epoch at batch 32 equals the dense-gradient loop; Keras's form of the rows
    is another run, except for Lion, whose update is linear in the gradient (its
    moments never square it), so that Keras's form already sums the rows for it."""
    make = OPTIMIZERS[name]
    ours = fit(token_batches(32), make(), epochs=1)
    dense = hand(token_batches(32), make(), "dense", epochs=1)
    keras_form = hand(token_batches(32), make(), "keras", epochs=1)
    assert largest_difference(ours, all_weights({"model": text_classifier()})) > 1e-3
    assert largest_difference(ours, dense) <= 1e-6
    if name == "lion":
        assert largest_difference(keras_form, dense) <= 1e-6
    else:
        assert largest_difference(keras_form, dense) > 1e-4


@pytest.mark.slow
def test_two_replicas_sum_the_rows_of_the_global_batch_as_one_device(tmp_path):
    """MirroredStrategy over two logical CPUs (``workers/sparse_mirrored.py``): batches of
    33 (replica shares of 17 and 16 rows), four steps a call, plain, accumulating and
    clipped; each run ends where the dense-gradient loop on one device does."""
    out = tmp_path / "sparse.json"
    run_python(WORKER, out)
    report = json.loads(out.read_text())
    assert report["replicas"] == 2
    for name, figures in report["runs"].items():
        assert figures["moved"] > 5e-2, name
        assert figures["two_replicas"] <= 1e-6, (name, figures)
        assert figures["one_device"] <= 1e-6, (name, figures)
        assert figures["keras_form"] > 1e-3, (name, figures)
