"""The supervised recipe on its built-in data and on a user's model and data."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_same_weights, classifier, dict_batches, model_weights, tuple_batches

import beatloop


@pytest.fixture(scope="module")
def default_run():
    return beatloop.fit("supervised", epochs=3, seed=0)


def test_default_run_learns_digits(default_run):
    history = default_run.history
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(len(values) == 3 for values in history.values())
    assert history["loss"][2] < history["loss"][0] * 0.7
    assert history["val_accuracy"][-1] > 0.8
    assert default_run.steps == 3 * 45  # 1437 training digits in batches of 32
    assert isinstance(default_run.models["model"], keras.Model)


def test_same_seed_same_run(default_run):
    again = beatloop.fit("supervised", epochs=3, seed=0)
    assert again.history == default_run.history
    assert_same_weights(
        model_weights(again.models["model"]), model_weights(default_run.models["model"])
    )


def test_users_model_optimizer_and_dict_data(small_digits):
    train, validation = small_digits
    model = classifier(hidden=8)
    optimizer = keras.optimizers.SGD(0.1)
    dict_data = dict_batches(train, 50)
    result = beatloop.fit(
        "supervised",
        data=(dict_data, tuple_batches(validation, 50)),
        models={"model": model},
        optimizers={"optimizer": optimizer},
        epochs=2,
        seed=0,
    )
    assert result.models["model"] is model and result.optimizers["optimizer"] is optimizer
    assert int(optimizer.iterations) == result.steps == 8
    assert result.history["loss"][1] < result.history["loss"][0]


def test_config_shapes_the_default_model_and_optimizer():
    recipe = beatloop.make_recipe(
        "supervised", {"hidden": 12, "optimizer": "sgd", "learning_rate": 0.5}
    )
    spec = {"x": tf.TensorSpec([None, 8, 8]), "y": tf.TensorSpec([None], tf.int32)}
    model = recipe.build_models(spec)["model"]
    assert model.input_shape == (None, 8, 8)
    assert tuple(model.trainable_variables[0].shape) == (64, 12)
    optimizer = recipe.build_optimizers()["optimizer"]
    assert isinstance(optimizer, keras.optimizers.SGD)
    assert float(optimizer.learning_rate) == pytest.approx(0.5)


def test_image_shaped_inputs_and_unbuilt_user_models(small_digits):
    train, _ = small_digits
    images = tf.data.Dataset.from_tensor_slices((train["x"].reshape(-1, 8, 8), train["y"])).batch(
        40
    )
    result = beatloop.fit("supervised", data=images, epochs=2, seed=0)
    assert result.models["model"].input_shape == (None, 8, 8)
    # A Sequential without an Input is built from the data's spec before binding.
    lazy = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(10)])
    result = beatloop.fit("supervised", data=images, models={"model": lazy}, epochs=1, seed=0)
    assert lazy.built and result.steps == 5


def test_regularisation_is_part_of_the_loss(small_digits):
    """The logged loss includes the L2 penalty of the model the beat updates."""
    train, _ = small_digits
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(10, kernel_regularizer=keras.regularizers.L2(10.0))]
    )
    penalty = 10.0 * float(tf.reduce_sum(tf.square(model.layers[0].kernel)))
    data = tuple_batches(train, 200)  # one batch: the logged loss is the step's loss
    logits = model(train["x"])
    plain = float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(train["y"], logits))
    result = beatloop.fit(
        "supervised",
        data=data,
        models={"model": model},
        optimizers={"optimizer": keras.optimizers.SGD(0.0)},
    )
    assert result.history["loss"][0] == pytest.approx(plain + penalty, rel=1e-5)


def test_sample_weights_weight_the_loss_as_in_fit(small_digits):
    train, _ = small_digits
    model = classifier()
    weights_ = np.where(np.arange(200) % 2 == 0, 3.0, 0.0).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((train["x"], train["y"], weights_)).batch(200)
    logits = model(train["x"])
    expected = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
        train["y"], logits, sample_weight=weights_
    )
    result = beatloop.fit(
        "supervised",
        data=data,
        models={"model": model},
        optimizers={"optimizer": keras.optimizers.SGD(0.0)},
    )
    assert result.history["loss"][0] == pytest.approx(float(expected), rel=1e-5)
    unweighted = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(train["y"], logits)
    assert abs(float(expected) - float(unweighted)) > 1e-3  # the weights made a difference
