"""Models and optimizers passed to a run under a distribution strategy must be made in
its scope: one made outside is refused before the first step with a ``ConfigError``
naming it and saying where to make it (not a data error printing the variable's values);
made inside, they train."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import beatloop
from beatloop.core.failures.errors import ConfigError, DataError


def small_model() -> keras.Model:
    dense = keras.layers.Dense
    return keras.Sequential([keras.Input((64,)), dense(8, "relu"), dense(10)])


@pytest.fixture(scope="module")
def strategy():
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def fit(strategy, small_digits, **parts):
    train, validation = small_digits
    data = tuple(tf.data.Dataset.from_tensor_slices(s).batch(50) for s in (train, validation))
    return beatloop.fit(
        "supervised", data=data, seed=0, progress=False, strategy=strategy, steps_per_epoch=2,
        **parts,
    )  # fmt: skip


def test_a_model_made_outside_the_scope_is_a_config_error_naming_it(strategy, small_digits):
    with pytest.raises(ConfigError) as caught:
        fit(strategy, small_digits, models={"model": small_model()})
    error = caught.value
    assert not isinstance(error, DataError) and error.exit_code == 2
    message = str(error)
    assert message.startswith("recipe 'supervised': model 'model' (its variable 'sequential"), (
        message
    )
    assert "made outside the distribution strategy's scope" in message
    assert "inside `with strategy.scope():`" in message
    assert "numpy=" not in message  # no variable's values


def test_an_optimizer_made_outside_the_scope_is_named_with_the_model(strategy, small_digits):
    with pytest.raises(ConfigError) as caught:
        fit(
            strategy,
            small_digits,
            models={"model": small_model()},
            optimizers={"optimizer": keras.optimizers.Adam(1e-3)},
        )
    message = str(caught.value)
    assert "model 'model' (its variable" in message
    assert "; optimizer 'optimizer' (its variable 'adam" in message
    assert "were made outside" in message


def test_parts_made_inside_the_scope_train(strategy, small_digits):
    with strategy.scope():
        model, optimizer = small_model(), keras.optimizers.Adam(1e-2)
    before = [w.numpy().copy() for w in model.weights]
    parts = {"models": {"model": model}, "optimizers": {"optimizer": optimizer}}
    result = fit(strategy, small_digits, **parts)
    assert result.models["model"] is model and result.steps == 2
    moved = max(
        float(np.abs(w.numpy() - b).max()) for w, b in zip(model.weights, before, strict=True)
    )
    assert moved > 1e-3
