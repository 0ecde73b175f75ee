"""Keras callbacks in ``beatloop.fit``: they see the recipe's primary model and its
optimizer (or those named with ``keras_callback``), through a view that changes nothing on
the model, and their events fire as Keras 3's ``fit`` fires them."""

import csv
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    TwoModels,
    assert_same_weights,
    classifier,
    gan_data,
    model_weights,
    tuple_batches,
)

import beatloop

# Figures and weights are compared bit for bit: both loops run the same float32 ops in the
# same order, with op determinism on for Keras's fit as beatloop.fit turns it on (without
# it the first fit of a process may differ in the last bits).
LR = 1e-2


def keras_reference(small_digits, callbacks, epochs, steps_per_execution=1):
    """Keras ``fit`` of the seeded classifier on the small digits, batches of 32."""
    train, validation = small_digits
    tf.config.experimental.enable_op_determinism()
    model = classifier()
    model.compile(
        optimizer=keras.optimizers.Adam(LR),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    history = model.fit(
        tuple_batches(train, 32),
        validation_data=tuple_batches(validation, 32),
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    ).history
    return model, history


def supervised(small_digits, callbacks, epochs, model=None, **options):
    """The same training as ``keras_reference``, as a beatloop supervised run."""
    train, validation = small_digits
    return beatloop.fit(
        "supervised",
        data=(tuple_batches(train, 32), tuple_batches(validation, 32)),
        models={"model": model if model is not None else classifier()},
        optimizers={"optimizer": keras.optimizers.Adam(LR)},
        epochs=epochs,
        seed=0,
        callbacks=callbacks,
        **options,
    )


def schedule(epoch, learning_rate):
    """Halve the learning rate from the second epoch on."""
    return learning_rate if epoch == 0 else learning_rate / 2


def plateau():
    """A ReduceLROnPlateau that reduces after every epoch but the first: no epoch's loss
    improves on the best by min_delta=10."""
    return keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=10)


def test_keras_callbacks_change_a_run_exactly_as_they_change_fit(small_digits):
    reference, keras_history = keras_reference(
        small_digits, [keras.callbacks.LearningRateScheduler(schedule), plateau()], epochs=4
    )
    ours = classifier()
    result = supervised(
        small_digits, [keras.callbacks.LearningRateScheduler(schedule), plateau()], 4, ours
    )
    # Scheduler: x1, x0.5, x0.5, x0.5; plateau: x0.5 after epochs 1, 2 (epoch 3 ends it).
    expected = [LR, LR / 2, LR / 8, LR / 32]
    np.testing.assert_allclose(result.history["learning_rate"], expected, rtol=1e-6)
    np.testing.assert_allclose(keras_history["learning_rate"], expected, rtol=1e-6)
    lr = float(result.bound.optimizers["optimizer"].learning_rate)
    assert lr == pytest.approx(LR / 64)  # the plateau's cut after epoch 3: in the optimizer
    assert lr == float(reference.optimizer.learning_rate)
    for name in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"):
        assert result.history[name] == keras_history[name], name
    assert_same_weights(model_weights(ours), model_weights(reference))
    # The callbacks changed the training: without them the weights end elsewhere.
    plain = classifier()
    supervised(small_digits, [], 4, plain)
    assert not np.allclose(model_weights(plain)[0], model_weights(ours)[0], atol=1e-3)
    # The user's model was given no optimizer (its checkpoint layout is unchanged).
    assert not hasattr(ours, "optimizer")


class Recorder(keras.callbacks.Callback):
    """Records the events it gets, in order, with their batch index and logs."""

    def __init__(self):
        super().__init__()
        self.events = []
        self.optimizers = []

    def set_params(self, params):
        super().set_params(params)
        self.events.append(("set_params", dict(params)))

    def on_train_begin(self, logs=None):
        self.events.append(("train_begin", dict(logs or {})))
        self.optimizers.append(self.model.optimizer)

    def on_train_end(self, logs=None):
        self.events.append(("train_end", dict(logs or {})))

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(("epoch_begin", epoch, dict(logs or {})))

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch, dict(logs)))

    def on_train_batch_begin(self, batch, logs=None):
        self.events.append(("batch_begin", batch, dict(logs or {})))

    def on_train_batch_end(self, batch, logs=None):
        logs = {name: value for name, value in logs.items() if not name.startswith("last_")}
        self.events.append(("batch_end", batch, logs))

    def on_test_begin(self, logs=None):
        self.events.append(("test_begin", dict(logs or {})))

    def on_test_end(self, logs=None):
        self.events.append(("test_end", dict(logs)))


def shape(events):
    """Each event's name, with its epoch or batch index."""
    return [event[:2] if event[0].startswith(("epoch", "batch")) else event[:1] for event in events]


def test_a_keras_callback_gets_the_events_fit_gives_it_in_order(small_digits):
    """Two epochs of 7 batches, 3 steps per compiled call: batch indices 0/2, 3/5, 6/8 as
    Keras 3 gives them, validation as test events, each log as fit's (``last_`` values,
    beatloop's own, left out)."""
    keras_events = Recorder()
    keras_reference(small_digits, [keras_events], epochs=2, steps_per_execution=3)
    ours = Recorder()
    result = supervised(small_digits, [ours], 2, steps_per_execution=3)

    assert shape(ours.events) == shape(keras_events.events)
    assert [e[1] for e in ours.events if e[0] == "batch_end"][:3] == [2, 5, 8]
    assert ours.events[0] == ("set_params", {"verbose": 0, "epochs": 2, "steps": 7})
    assert ours.events[0] == keras_events.events[0]
    for mine, theirs in zip(ours.events, keras_events.events, strict=True):
        logs, expected = mine[-1], theirs[-1]
        assert logs == expected, mine[0]
    # The epoch ends' logs are the run's history.
    assert [e[2]["val_loss"] for e in ours.events if e[0] == "epoch_end"] == (
        result.history["val_loss"]
    )
    assert ours.optimizers == [result.bound.optimizers["optimizer"]]


def test_csv_logger_writes_the_history(small_digits, tmp_path):
    path = tmp_path / "log.csv"
    result = supervised(small_digits, [keras.callbacks.CSVLogger(str(path))], 3)
    with path.open() as file:
        rows = list(csv.DictReader(file))
    assert [int(row["epoch"]) for row in rows] == [0, 1, 2]
    assert set(rows[0]) == {"epoch", *result.history}
    for name, values in result.history.items():
        assert [float(row[name]) for row in rows] == values


def test_early_stopping_stops_and_restores_the_best_weights(small_digits):
    # min_delta=10: only the first epoch improves (on infinity), so patience 1 runs out
    # at the end of the second, and the weights go back to the first epoch's end.
    stopping = keras.callbacks.EarlyStopping(
        monitor="loss", min_delta=10, patience=1, restore_best_weights=True
    )
    ours = classifier()
    result = supervised(small_digits, [stopping], 5, ours)
    assert result.epochs == 2 and len(result.history["loss"]) == 2
    assert stopping.stopped_epoch == 1
    one_epoch = classifier()
    supervised(small_digits, [], 1, one_epoch)
    assert_same_weights(model_weights(ours), model_weights(one_epoch))
    two_epochs = classifier()
    supervised(small_digits, [], 2, two_epochs)
    assert not np.allclose(model_weights(ours)[0], model_weights(two_epochs)[0], atol=1e-4)


class SeesLosses(keras.callbacks.TerminateOnNaN):
    """TerminateOnNaN that records the losses it looked at."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_batch_end(self, batch, logs=None):
        self.losses.append(logs["loss"])
        super().on_batch_end(batch, logs)


def test_the_nan_guard_stops_a_run_before_terminate_on_nan_sees_a_nan(small_digits):
    """beatloop's NaN guard checks each step inside the compiled call: a learning rate of
    1e20 makes step 2's loss NaN, and the run stops with NumericsError before any
    callback sees that step; TerminateOnNaN only ever saw the first, finite, loss."""
    terminate = SeesLosses()
    train, validation = small_digits
    with pytest.raises(beatloop.NumericsError, match=r"non-finite loss .* at step 2"):
        beatloop.fit(
            "supervised",
            data=(tuple_batches(train, 32), tuple_batches(validation, 32)),
            models={"model": classifier()},
            optimizers={"optimizer": keras.optimizers.SGD(1e20)},
            epochs=2,
            seed=0,
            callbacks=[terminate],
        )
    assert len(terminate.losses) == 1 and np.isfinite(terminate.losses[0])


def test_keras_callback_reaches_the_named_model_and_optimizer():
    """In a GAN, a scheduler given the discriminator changes d_optimizer only; one passed
    as it is sees the generator (the recipe's primary model) and changes g_optimizer."""
    seen = {}

    class Sees(keras.callbacks.Callback):
        def __init__(self, key):
            super().__init__()
            self.key = key

        def on_train_begin(self, logs=None):
            seen[self.key] = self.model.name

    tenth = lambda epoch, learning_rate: learning_rate / 10  # noqa: E731
    result = beatloop.fit(
        "gan",
        data=gan_data(64),
        epochs=2,
        seed=0,
        callbacks=[
            beatloop.keras_callback(
                keras.callbacks.LearningRateScheduler(tenth),
                model="discriminator",
                optimizer="d_optimizer",
            ),
            beatloop.keras_callback(Sees("d"), model="discriminator"),
            Sees("default"),
        ],
    )
    config = result.config
    optimizers = result.bound.optimizers
    assert float(optimizers["d_optimizer"].learning_rate) == pytest.approx(
        config.d_learning_rate / 100
    )
    assert float(optimizers["g_optimizer"].learning_rate) == pytest.approx(config.g_learning_rate)
    models = result.bound.models
    assert seen == {"d": models["discriminator"].name, "default": models["generator"].name}


def test_the_default_model_of_a_recipe_without_primary_model_must_be_unambiguous(small_digits):
    train, _ = small_digits
    data = tuple_batches(train, 32).map(lambda x, y: {"x": x, "y": y})
    scheduler = keras.callbacks.LearningRateScheduler(schedule)
    with pytest.raises(beatloop.CallbackError, match=r"declares no primary_model .* 2 models"):
        beatloop.fit(TwoModels(), data=data, seed=0, callbacks=[scheduler])
    with pytest.raises(beatloop.CallbackError, match=r"no model of that name \(did you mean 'a'"):
        beatloop.fit(
            TwoModels(),
            data=data,
            seed=0,
            callbacks=[beatloop.keras_callback(scheduler, model="aa")],
        )
    # Named, it reaches that model's optimizer: opt_b's rate stays, opt_a's halves.
    result = beatloop.fit(
        TwoModels(),
        data=data,
        epochs=2,
        seed=0,
        callbacks=[beatloop.keras_callback(scheduler, model="a")],
    )
    assert float(result.bound.optimizers["opt_a"].learning_rate) == pytest.approx(0.05)
    assert float(result.bound.optimizers["opt_b"].learning_rate) == pytest.approx(0.1)


def test_other_objects_are_still_refused():
    with pytest.raises(beatloop.CallbackError, match=r"beatloop\.Callback or keras\.callbacks"):
        beatloop.fit("supervised", callbacks=[object()], seed=0)
    with pytest.raises(beatloop.CallbackError, match=r"takes a keras\.callbacks\.Callback"):
        beatloop.keras_callback(beatloop.History())


def test_a_resumed_run_warns_that_keras_callbacks_start_afresh(small_digits, tmp_path):
    supervised(small_digits, [keras.callbacks.LearningRateScheduler(schedule)], 2, run_dir=tmp_path)
    with pytest.warns(beatloop.ResumeWarning, match=r"Keras callbacks \(EarlyStopping\)"):
        result = supervised(
            small_digits, [keras.callbacks.EarlyStopping(monitor="loss")], 3, run_dir=tmp_path
        )
    assert result.resumed_from is not None and result.epochs == 3
    # The learning rate a Keras callback set is the optimizer's, so it is checkpointed.
    assert float(result.bound.optimizers["optimizer"].learning_rate) == pytest.approx(LR / 2)


def test_the_guide_runs(capsys):
    """docs/keras-callbacks.md's example: its scheduler really lowered the rate."""
    guide = Path(__file__).resolve().parents[1] / "docs" / "keras-callbacks.md"
    (block,) = re.findall(r"```python\n(.*?)```", guide.read_text(), flags=re.S)
    namespace = {}
    exec(compile(block, str(guide), "exec"), namespace)
    rates = namespace["result"].history["learning_rate"]
    assert len(rates) == namespace["result"].epochs
    assert rates[-1] < rates[0] and rates == sorted(rates, reverse=True)
    last = float(namespace["result"].bound.optimizers["optimizer"].learning_rate)
    assert capsys.readouterr().out == f"{rates}\n{last}\n"


class Fails(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise ValueError("no such figure")


class ReplacesTheOptimizer(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.model.optimizer = keras.optimizers.SGD()


def test_misused_keras_callbacks_are_named(small_digits):
    train, _ = small_digits
    data = tuple_batches(train, 100).map(lambda x, y: {"x": x, "y": y})
    with pytest.raises(beatloop.UserCodeError, match=r"'Fails \(a Keras callback\)' in on_epoch_"):
        beatloop.fit(
            TwoModels(), data=data, seed=0, callbacks=[beatloop.keras_callback(Fails(), model="a")]
        )
    with pytest.raises(beatloop.CallbackError, match="cannot replace the optimizer"):
        beatloop.fit(
            TwoModels(),
            data=data,
            seed=0,
            callbacks=[beatloop.keras_callback(ReplacesTheOptimizer(), model="b")],
        )
    # A KerasCallback serves another run afresh: its default model is resolved per run.
    wrapped = beatloop.keras_callback(Recorder())
    result = supervised(small_digits, [wrapped], 1)
    assert wrapped.callback.optimizers == [result.bound.optimizers["optimizer"]]
    with pytest.raises(beatloop.CallbackError, match=r"declares no primary_model"):
        beatloop.fit(TwoModels(), data=data, seed=0, callbacks=[wrapped])
