"""Shared fixtures. TensorFlow is imported once per test process, quietly."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest


@pytest.fixture(scope="session")
def digits():
    """The built-in digits split as arrays: ({"x", "y"} train, {"x", "y"} validation)."""
    from beatloop.data import digits_arrays

    return digits_arrays(seed=0)


@pytest.fixture(scope="session")
def small_digits(digits):
    """The first 200 training and 100 validation digits: enough to learn, fast to run."""
    train, validation = digits
    return (
        {k: v[:200] for k, v in train.items()},
        {k: v[:100] for k, v in validation.items()},
    )


def tuple_batches(arrays, batch_size):
    """An unshuffled ``(x, y)`` pipeline, the way a user would build one."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((arrays["x"], arrays["y"])).batch(batch_size)


def classifier(hidden=16, seed=0, extra_layers=()):
    """A small seeded digits classifier, built (so its initial weights are fixed)."""
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"), *extra_layers]
    return keras.Sequential([*layers, keras.layers.Dense(10)])


def weights(model):
    return [v.numpy() for v in model.weights]
