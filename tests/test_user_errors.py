"""Mistakes in a recipe's own code: reported in that code, with its cause kept; and a
model call's explicit ``training=`` inside a loss."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import dict_batches

import beatloop


class NormThenHead(beatloop.Recipe):
    """A frozen batch-normalisation model ``norm`` in front of a trained ``head``; the
    loss calls ``norm`` with ``norm_call`` keywords (test recipe)."""

    name = "norm_then_head_test"
    batch_keys = {"x": 2, "y": 1}

    def __init__(self, **norm_call):
        super().__init__()
        self.norm_call = norm_call

    def default_data(self, seed):
        raise NotImplementedError("a test passes its data")

    def build_models(self, batch_spec):
        keras.utils.set_random_seed(0)
        return {
            "norm": keras.Sequential([keras.Input((64,)), keras.layers.BatchNormalization()]),
            "head": keras.Sequential([keras.Input((64,)), keras.layers.Dense(1)]),
        }

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.01)}

    def losses(self):
        return {"fit": self.fit}

    def fit(self, models, batch):
        features = models["norm"](batch["x"], **self.norm_call)
        target = tf.cast(batch["y"], tf.float32)[:, None]
        return tf.reduce_mean(tf.square(models["head"](features) - target))

    def schedule(self):
        beat = beatloop.Beat(loss="fit", optimizer="sgd", updates="head")
        return beatloop.Schedule(beat, frozen=("norm",))


@pytest.mark.parametrize("debug", [False, True])
def test_explicit_training_keyword_overrides_the_beats_mode(small_digits, debug):
    train, _ = small_digits
    data = dict_batches(train, 50)
    moving_mean = lambda result: result.models["norm"].layers[0].moving_mean.numpy()  # noqa: E731

    default = beatloop.fit(NormThenHead(), data=data, seed=0, debug=debug)
    np.testing.assert_array_equal(moving_mean(default), np.zeros(64))  # inference: unchanged

    explicit = beatloop.fit(NormThenHead(training=True), data=data, seed=0, debug=debug)
    assert np.abs(moving_mean(explicit)).max() > 0.01  # training mode: the statistics moved
