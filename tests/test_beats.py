"""Beats, schedules and gradient transforms: values that validate themselves."""

import numpy as np
import pytest
import tensorflow as tf

from beatloop import Beat, ClipByGlobalNorm, ClipByNorm, ClipByValue, Schedule


def test_beat_defaults_and_selectors():
    beat = Beat(loss="d_loss", optimizer="d_opt", updates="discriminator")
    assert beat.name == "d_loss"
    assert beat.updates == ("discriminator",)
    assert beat.repeat == 1 and beat.every == 1 and beat.training is None
    other = Beat(loss="g", optimizer="o", updates=["gen:dense/*", "head"], name="g_beat")
    assert other.updates == ("gen:dense/*", "head")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"repeat": 0}, "repeat"),
        ({"every": -1}, "every"),
        ({"updates": ()}, "updates no variables"),
        ({"loss": "not a name"}, "Python-style name"),
        ({"transform": "clip"}, "transform"),
    ],
)
def test_beat_rejects_bad_values(kwargs, message):
    values = {"loss": "loss", "optimizer": "opt", "updates": "model", **kwargs}
    with pytest.raises((ValueError, TypeError), match=message):
        Beat(**values)


def test_beats_are_frozen_values():
    beat = Beat(loss="loss", optimizer="opt", updates="model")
    with pytest.raises(AttributeError):
        beat.repeat = 3
    assert beat == Beat(loss="loss", optimizer="opt", updates=("model",))


def test_schedule_refuses_repeated_beat_names_and_emptiness():
    beat = Beat(loss="loss", optimizer="opt", updates="model")
    with pytest.raises(ValueError, match="unique"):
        Schedule((beat, beat))
    with pytest.raises(ValueError, match="at least one beat"):
        Schedule(())


def test_schedule_describe_lists_every_beat():
    schedule = Schedule(
        (
            Beat(loss="d_loss", optimizer="d_opt", updates="disc", repeat=5),
            Beat(loss="g_loss", optimizer="g_opt", updates="gen", transform=ClipByNorm(1.0)),
        ),
        frozen="features",
    )
    text = schedule.describe()
    assert "1. d_loss: loss=d_loss optimizer=d_opt updates=disc repeat=5" in text
    assert "2. g_loss" in text and "clip each tensor to norm 1" in text
    assert "frozen: features" in text
    assert schedule.loss_names == ("d_loss", "g_loss")


def test_gradient_transforms_match_numpy():
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(3, 4)).astype(np.float32) * 10, rng.normal(size=5).astype(np.float32)]
    tensors = [tf.constant(g) for g in grads]

    global_norm = np.sqrt(sum((g**2).sum() for g in grads))
    clipped = ClipByGlobalNorm(2.0)(tensors)
    for out, g in zip(clipped, grads, strict=True):
        np.testing.assert_allclose(out, g * 2.0 / global_norm, rtol=1e-5)

    for out, g in zip(ClipByNorm(1.5)(tensors), grads, strict=True):
        norm = np.linalg.norm(g)
        np.testing.assert_allclose(out, g * min(1.0, 1.5 / norm), rtol=1e-5)

    for out, g in zip(ClipByValue(0.5)(tensors), grads, strict=True):
        np.testing.assert_allclose(out, np.clip(g, -0.5, 0.5))
