"""Averaged weights evaluated (``EMA(evaluated=True)``, the supervised recipe's
``ema_decay``): validation, ``evaluate``, ``export`` and ``keep_best`` use the average,
exactly as a model holding the average's values does, while training goes on with the
model's own weights."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_same_weights, classifier, model_weights, run_python, tuple_batches

import beatloop

DECAY = 0.9
# Keras's evaluate and beatloop's validation run the same float32 ops (test_parity.py).
RTOL, ATOL = 1e-6, 1e-7


def _fit(small_digits, run_dir=None, epochs=2, decay=DECAY, **options):
    train, validation = small_digits
    model = classifier()
    # A model passed in place of the recipe's needs its average's model passed too; the
    # recipe starts it at the model's values.
    models = {"model": model, "ema": keras.models.clone_model(model)} if decay else {"model": model}
    return beatloop.fit(
        "supervised",
        data=(tuple_batches(train, 32), tuple_batches(validation, 32)),
        models=models,
        optimizers={"optimizer": keras.optimizers.Adam(1e-2)},
        config={"ema_decay": decay},
        epochs=epochs,
        seed=0,
        run_dir=run_dir,
        progress=False,
        **options,
    )


@pytest.fixture(scope="module")
def averaged(small_digits, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("averaged") / "run"
    return _fit(small_digits, run_dir)


def _holding(model, trainable_values):
    """A copy of ``model`` whose trainable variables hold ``trainable_values``."""
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    for variable, value in zip(copy.trainable_variables, trainable_values, strict=True):
        variable.assign(value)
    copy.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    return copy


def _keras_evaluate(model, small_digits):
    return model.evaluate(tuple_batches(small_digits[1], 32), verbose=0, return_dict=True)


def test_validation_is_the_average_and_the_models_own_is_logged_raw(averaged, small_digits):
    model, average = averaged.models["model"], averaged.models["ema"]
    by_hand = _keras_evaluate(_holding(model, average.trainable_variables), small_digits)
    own = _keras_evaluate(_holding(model, model.trainable_variables), small_digits)
    history = averaged.history
    np.testing.assert_allclose(history["val_loss"][-1], by_hand["loss"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(history["val_accuracy"][-1], by_hand["accuracy"], rtol=RTOL)
    np.testing.assert_allclose(history["val_raw_loss"][-1], own["loss"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(history["val_raw_accuracy"][-1], own["accuracy"], rtol=RTOL)
    # Two different sets of weights: the figures differ.
    assert abs(history["val_loss"][-1] - history["val_raw_loss"][-1]) > 1e-3
    # evaluate() gives the same figures, without the prefix.
    figures = averaged.evaluate()
    assert figures["loss"] == history["val_loss"][-1]
    assert figures["raw_loss"] == history["val_raw_loss"][-1]


def test_training_goes_on_with_the_models_own_weights(averaged, small_digits):
    """The swap leaves training alone: the model equals one trained without an average,
    and the average is the EMA of its values step by step, started at its first values."""
    train, _ = small_digits
    plain = _fit(small_digits, decay=0.0)
    assert "ema" not in plain.models and "val_raw_loss" not in plain.history
    assert plain.history["val_loss"] == averaged.history["val_raw_loss"]
    assert_same_weights(
        model_weights(averaged.models["model"]), model_weights(plain.models["model"])
    )

    # The average by hand: Keras's fit, the same EMA after every batch.
    reference = classifier()
    average = [v.numpy() for v in reference.trainable_variables]
    keep, mix = np.float32(DECAY), np.float32(1 - DECAY)

    class Average(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            for i, variable in enumerate(reference.trainable_variables):
                average[i] = keep * average[i] + mix * variable.numpy()

    reference.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    reference.fit(tuple_batches(train, 32), epochs=2, shuffle=False, verbose=0,
                  callbacks=[Average()])  # fmt: skip
    ours = [v.numpy() for v in averaged.models["ema"].trainable_variables]
    for mine, theirs in zip(ours, average, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)


def test_export_writes_the_average_and_puts_the_model_back(averaged, tmp_path):
    model, average = averaged.models["model"], averaged.models["ema"]
    before = model_weights(model)
    paths = averaged.export(tmp_path / "out")
    assert_same_weights(model_weights(model), before)
    loaded = tf.saved_model.load(str(paths["model"]))  # kept: its variables live in it
    served = loaded.serve
    x = tf.constant(np.random.default_rng(0).normal(size=(5, 64)), tf.float32)
    expected = _holding(model, average.trainable_variables)(x)
    np.testing.assert_array_equal(served(x).numpy(), np.asarray(expected))
    assert not np.array_equal(served(x).numpy(), np.asarray(model(x)))


def test_the_best_is_chosen_by_the_average_and_restored_with_it(small_digits, tmp_path):
    """The recipe's own models (restore rebuilds them): its average starts at its model."""
    train, validation = small_digits
    result = beatloop.fit(
        "supervised",
        data=(tuple_batches(train, 32), tuple_batches(validation, 32)),
        config={"ema_decay": DECAY, "hidden": 16, "learning_rate": 1e-2},
        epochs=3, seed=0, run_dir=tmp_path / "run", progress=False, keep_best="val_loss:min",
    )  # fmt: skip
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    best = record["best"]
    assert best["figure"] == "val_loss"
    assert best["value"] == min(result.history["val_loss"])
    assert "2. ema: EMA source=model target=ema decay=0.9 every=1 evaluated" in record["schedule"]
    restored = beatloop.restore(tmp_path / "run", data=(tuple_batches(train, 32),
                                tuple_batches(validation, 32)), best=True)  # fmt: skip
    assert restored.evaluate()["loss"] == best["value"]


def test_keep_best_takes_the_raw_figures_and_names_them(small_digits, tmp_path):
    with pytest.raises(beatloop.ConfigError, match="val_raw_loss"):
        _fit(small_digits, tmp_path / "a", epochs=1, keep_best="val_ema_loss:min")
    result = _fit(small_digits, tmp_path / "b", epochs=1, keep_best="val_raw_accuracy:max")
    record = json.loads((tmp_path / "b" / "run.json").read_text())
    assert record["best"]["value"] == result.history["val_raw_accuracy"][-1]


def test_a_resumed_run_keeps_its_average(averaged, small_digits, tmp_path):
    """One epoch, then a resume to two: the average comes from the checkpoint, not from
    the model's values again; everything equals the uninterrupted run."""
    _fit(small_digits, tmp_path / "run", epochs=1)
    resumed = _fit(small_digits, tmp_path / "run", epochs=2)
    assert resumed.resumed_from is not None
    assert resumed.history["val_loss"] == averaged.history["val_loss"]
    for name in ("model", "ema"):
        assert_same_weights(
            model_weights(resumed.models[name]), model_weights(averaged.models[name])
        )


def test_two_averages_of_one_variable_are_refused():
    ema = beatloop.EMA("model", "ema", 0.9, evaluated=True)
    other = beatloop.EMA("model", "other", 0.5, evaluated=True, name="other")
    source, one, two = (classifier(seed=s) for s in range(3))
    schedule = beatloop.Schedule([beatloop.Beat("loss", "optimizer", updates="model"), ema, other])
    with pytest.raises(beatloop.ScheduleError, match="both evaluated=True"):
        beatloop.bind(
            schedule,
            {"model": source, "ema": one, "other": two},
            {"optimizer": keras.optimizers.Adam()},
            {"loss": lambda models, batch: tf.reduce_mean(models["model"](batch["x"]))},
        )
    with pytest.raises(beatloop.ScheduleError, match="True or False"):
        beatloop.EMA("model", "ema", 0.9, evaluated="yes")


@pytest.mark.slow
def test_the_average_on_two_replicas_equals_one_device(tmp_path):
    """MirroredStrategy over two logical CPUs (``workers/averaged_mirrored.py``): the
    swap assigns mirrored variables on every replica, and puts them back."""
    out = tmp_path / "mirrored.json"
    run_python(Path(__file__).parent / "workers" / "averaged_mirrored.py", out)
    report = json.loads(out.read_text())
    assert report["replicas"] == 2
    one, two = report["figures"]
    assert one.keys() == two.keys() and "val_raw_loss" in one
    for name in one:
        assert abs(one[name] - two[name]) < 1e-5, name
    assert one["val_loss"] != one["val_raw_loss"]
    assert report["max_weight_difference"] < 1e-6
    assert report["max_served_difference"] < 1e-5
