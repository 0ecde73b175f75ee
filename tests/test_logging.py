"""What is logged: the epoch mean or the last step's value of each beat's loss, and each
compiled call's last step's losses for ``on_execution_end``, against hand computation."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TwoModels

import beatloop

RATE = 0.01


def linear_losses(kernel, bias, x, y, updates: int) -> list[float]:
    """Squared-error losses of ``updates`` SGD steps of ``x @ kernel + bias`` on one
    batch, in float64: what the beat's repeats see, each after the ones before."""
    kernel, bias = kernel.astype(np.float64), bias.astype(np.float64)
    losses = []
    for _ in range(updates):
        error = x @ kernel + bias - y[:, None]
        losses.append(float(np.mean(error**2)))
        kernel = kernel - RATE * 2 * x.T @ error / len(x)
        bias = bias - RATE * 2 * error.mean(axis=0)
    return losses


class StepLogs(beatloop.Callback):
    """Every logged figure offered to ``on_execution_end``, and the weights of model
    ``a`` before each call."""

    def __init__(self, model: str = "a"):
        self.model = model
        self.logs: list[dict[str, float]] = []
        self.weights_before: list[list[np.ndarray]] = []

    def on_execution_start(self, run):
        self.weights_before.append(run.models[self.model].get_weights())

    def on_execution_end(self, run, steps, logs):
        self.logs.append(dict(logs))


def one_batch(small_digits, rows=8):
    train, _ = small_digits
    x, y = train["x"][:rows], train["y"][:rows].astype(np.float32)
    return x, y, tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(rows)


@pytest.mark.parametrize("log", ["mean", "last"])
def test_a_repeated_beat_logs_the_mean_of_its_repeats_or_the_last_one(small_digits, log):
    x, y, data = one_batch(small_digits)
    recipe = TwoModels(
        beatloop.Schedule(
            (TwoModels.beat("a", repeat=3, log=log), TwoModels.beat("b")),
        ),
        learning_rate=RATE,
    )
    steps = StepLogs()
    result = beatloop.fit(recipe, data=data, epochs=1, seed=0, callbacks=[steps], progress=False)
    kernel, bias = steps.weights_before[0]
    expected = linear_losses(kernel, bias, x, y, updates=3)
    assert expected[2] < expected[0]  # the repeats train: mean and last differ
    logged = result.history["fit_a"][0]
    wanted = np.mean(expected) if log == "mean" else expected[-1]
    np.testing.assert_allclose(logged, wanted, rtol=1e-5)
    (call,) = steps.logs
    np.testing.assert_allclose(call["last_fit_a"], expected[-1], rtol=1e-5)
    np.testing.assert_allclose(call["fit_a"], wanted, rtol=1e-5)


def test_each_call_offers_its_last_steps_loss_and_the_running_mean(small_digits):
    train, _ = small_digits
    x, y = train["x"][:40], train["y"][:40].astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(16)  # 16, 16, 8
    recipe = TwoModels(learning_rate=RATE)
    steps = StepLogs()
    result = beatloop.fit(recipe, data=data, epochs=1, seed=0, callbacks=[steps], progress=False)
    per_step = []
    for start, (kernel, bias) in zip(range(0, 40, 16), steps.weights_before, strict=True):
        rows = slice(start, start + 16)
        per_step.append(linear_losses(kernel, bias, x[rows], y[rows], updates=1)[0])
    logged = [call["last_fit_a"] for call in steps.logs]
    np.testing.assert_allclose(logged, per_step, rtol=1e-5)
    assert len(set(logged)) == 3
    # The running mean is weighted by batch size, and the epoch logs it.
    running = np.average(per_step, weights=[16, 16, 8])
    np.testing.assert_allclose(steps.logs[-1]["fit_a"], running, rtol=1e-5)
    np.testing.assert_allclose(result.history["fit_a"][0], running, rtol=1e-5)
    assert not any(name.startswith("last_") for name in result.history)


def test_a_group_beat_logs_its_last_value_when_asked():
    """Log choices hold inside a simultaneous group too (the gan's two beats)."""
    from helpers import gan_data

    data = gan_data(48, 16)
    recipe = beatloop.make_recipe("gan", {"update": "simultaneous", "quality_samples": 16})
    schedule = recipe.schedule()
    (group,) = schedule.beats
    beats = tuple(
        beatloop.Beat(b.loss, b.optimizer, b.updates, log="last" if b.loss == "g_loss" else "mean")
        for b in group.beats
    )
    recipe.schedule = lambda: beatloop.Schedule(
        beatloop.Group(forward=group.forward, beats=beats, training=group.training)
    )
    steps = StepLogs("generator")
    keras.utils.set_random_seed(0)
    result = beatloop.fit(recipe, data=data, epochs=1, seed=0, callbacks=[steps], progress=False)
    last = steps.logs[-1]
    assert result.history["g_loss"][0] == pytest.approx(last["last_g_loss"], rel=1e-6)
    assert result.history["d_loss"][0] == pytest.approx(last["d_loss"], rel=1e-6)
    assert result.history["d_loss"][0] != pytest.approx(last["last_d_loss"], rel=1e-3)


def test_a_beat_that_skips_steps_keeps_its_last_value_across_epochs(small_digits):
    """``every=2`` on three steps an epoch: the second epoch's first step (number 3)
    skips the beat, whose last value is still step 2's, not a reset zero."""
    train, _ = small_digits
    data = tf.data.Dataset.from_tensor_slices(
        {"x": train["x"][:12], "y": train["y"][:12].astype(np.float32)}
    ).batch(4)
    schedule = beatloop.Schedule((TwoModels.beat("a"), TwoModels.beat("b", every=2)))
    steps = StepLogs()
    beatloop.fit(
        TwoModels(schedule, learning_rate=RATE), data=data, epochs=2, seed=0,
        callbacks=[steps], progress=False,
    )  # fmt: skip
    values = [call["last_fit_b"] for call in steps.logs]
    assert values[0] > 0 and values[1] == values[0] and values[2] != values[1]
    assert values[3] == values[2]  # step 3: skipped, kept across the epoch's end
    assert values[4] != values[3]
