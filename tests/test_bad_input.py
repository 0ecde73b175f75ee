"""Bad input reads as a sentence naming what was expected and found, never a
TensorFlow traceback."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import classifier, tuple_batches

import beatloop
from beatloop import ConfigError, DataError


def test_unknown_config_field_names_the_closest():
    with pytest.raises(ConfigError, match=r"no config field 'hiden' \(did you mean 'hidden'\?\)"):
        beatloop.fit("supervised", config={"hiden": 8})


@pytest.mark.parametrize(
    "config, message",
    [
        ({"hidden": "128"}, "'hidden' expects int, got str '128'"),
        ({"hidden": 1.5}, "'hidden' expects int, got float"),
        ({"hidden": True}, "'hidden' expects int, got bool"),
        ({"hidden": 0}, "hidden"),
        ({"optimizer": "adamax"}, "'optimizer' expects 'adam' | 'adamw' | 'sgd' | 'rmsprop'"),
        ({"learning_rate": -1.0}, "learning_rate"),
    ],
)
def test_config_values_are_checked(config, message):
    with pytest.raises(ConfigError, match=message.replace("|", r"\|")):
        beatloop.make_recipe("supervised", config)


def test_ints_widen_to_float_fields():
    recipe = beatloop.make_recipe("supervised", {"learning_rate": 1})
    assert recipe.config.learning_rate == 1.0 and isinstance(recipe.config.learning_rate, float)


@pytest.mark.parametrize("epochs", [0, -2, 1.5, "3", True])
def test_epochs_must_be_a_positive_integer(epochs):
    with pytest.raises(ConfigError, match="epochs must be an integer >= 1"):
        beatloop.fit("supervised", epochs=epochs)


def test_steps_per_execution_must_be_positive():
    with pytest.raises(ConfigError, match="steps_per_execution"):
        beatloop.fit("supervised", steps_per_execution=0)


def test_wrong_batch_keys(small_digits):
    train, _ = small_digits
    data = tf.data.Dataset.from_tensor_slices({"image": train["x"], "label": train["y"]}).batch(8)
    with pytest.raises(
        DataError, match=r"expects training batches with keys \['x', 'y'\].*\['image', 'label'\]"
    ):
        beatloop.fit("supervised", data=data)


def test_unbatched_data_is_recognised(small_digits):
    train, _ = small_digits
    data = tf.data.Dataset.from_tensor_slices((train["x"], train["y"]))
    with pytest.raises(DataError, match=r"'y' with at least 1 dimension.*Call \.batch\(n\)"):
        beatloop.fit("supervised", data=data)


def test_empty_data_set():
    data = tf.data.Dataset.from_tensor_slices(
        (np.zeros((0, 64), np.float32), np.zeros(0, np.int32))
    )
    with pytest.raises(DataError, match="training data set is empty"):
        beatloop.fit("supervised", data=data.batch(8))


def test_data_that_empties_at_run_time(small_digits):
    train, _ = small_digits
    data = tuple_batches(train, 8).filter(lambda x, y: tf.reduce_all(y > 100))  # length unknown
    with pytest.raises(DataError, match="gave no batches in epoch 0"):
        beatloop.fit("supervised", data=data)


def test_model_that_does_not_fit_the_data(small_digits):
    train, _ = small_digits
    wrong = keras.Sequential([keras.Input((32,)), keras.layers.Dense(10)])
    with pytest.raises(DataError) as caught:
        beatloop.fit("supervised", data=tuple_batches(train, 8), models={"model": wrong})
    message = str(caught.value)
    # found before the first step, from the model's declared input: no Keras text
    assert message.startswith(
        "recipe 'supervised': model 'model' expects input 0 of shape (None, 32) float32, "
        "but the training data gives (None, 64) float32 (batch key 'x') — called from "
    )
    assert "supervised.py:" in message  # the line of the loss that called the model
    assert "\x1b" not in message and "Arguments received" not in message


def test_unknown_part_names_are_refused(small_digits):
    train, _ = small_digits
    with pytest.raises(ConfigError, match=r"no model named 'modle' \(did you mean 'model'\?\)"):
        beatloop.fit("supervised", data=tuple_batches(train, 8), models={"modle": classifier()})
    with pytest.raises(ConfigError, match=r"optimizer .optimizer. must be a keras"):
        beatloop.fit("supervised", data=tuple_batches(train, 8), optimizers={"optimizer": "adam"})


def test_data_that_is_not_a_dataset(small_digits):
    train, _ = small_digits
    with pytest.raises(DataError, match=r"the training entry is ndarray.*from_tensor_slices"):
        beatloop.fit("supervised", data=(train["x"], train["y"]))


def test_validation_shape_must_match_training(small_digits):
    train, validation = small_digits
    narrow = tf.data.Dataset.from_tensor_slices((validation["x"][:, :32], validation["y"])).batch(8)
    with pytest.raises(DataError, match="validation batch 'x'"):
        beatloop.fit("supervised", data=(tuple_batches(train, 8), narrow))


def test_endless_data_needs_steps_per_epoch(small_digits):
    train, _ = small_digits
    endless = tuple_batches(train, 50).repeat()
    with pytest.raises(DataError, match=r"repeats forever.*steps_per_epoch"):
        beatloop.fit("supervised", data=endless)
    result = beatloop.fit("supervised", data=endless, steps_per_epoch=3, epochs=3, seed=0)
    assert result.steps == 9 and len(result.history["loss"]) == 3


def test_label_out_of_range_is_a_data_error(small_digits):
    train, _ = small_digits
    labels = train["y"].copy()
    labels[5] = 12  # the default model has 10 classes
    data = tf.data.Dataset.from_tensor_slices((train["x"], labels)).batch(50)
    # TensorFlow words it differently once op determinism is on (any seeded fit before);
    # the message is beatloop's either way (tests/test_mismatch.py tries both).
    message = (
        "recipe 'supervised': the training data has label 12 in 'y', outside [0, 10) — the "
        "config field classes is 10; fix the labels or set classes (--set classes=13)"
    )
    with pytest.raises(DataError) as caught:
        beatloop.fit("supervised", data=data)
    assert str(caught.value) == message


def test_tuple_fields_read_from_the_command_line():
    from beatloop.core.config import parse_settings, type_name
    from beatloop.recipes.multitask import MultitaskConfig

    settings = parse_settings(["tasks=digit, ink", "weights=1,0.5"], MultitaskConfig, "multitask")
    assert settings == {"tasks": ("digit", "ink"), "weights": (1.0, 0.5)}
    assert type_name(tuple[str, ...]) == "tuple[str, ...]"
