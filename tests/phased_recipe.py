"""A recipe in two phases, for tests (``tests/test_phases.py`` and the phased worker):
pretrain an encoder and decoder on reconstruction, then train a linear probe on the
frozen encoder. Its data: the first digits, in unshuffled batches."""

from __future__ import annotations

import attrs
import keras
import tensorflow as tf
from helpers import dict_batches

import beatloop
from beatloop.core.data.batches import DataSplit
from beatloop.datasets import digits_arrays

COUNT, BATCH = 160, 32


def models(seed: int = 0) -> dict[str, keras.Model]:
    """The encoder (64 -> 8), decoder (8 -> 64) and probe (8 -> 10), seeded, built."""
    keras.utils.set_random_seed(seed)
    return {
        "encoder": keras.Sequential([keras.Input((64,)), keras.layers.Dense(8, "tanh")]),
        "decoder": keras.Sequential([keras.Input((8,)), keras.layers.Dense(64)]),
        "probe": keras.Sequential([keras.Input((8,)), keras.layers.Dense(10)]),
    }


def data() -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """160 training digits and 64 validation digits, in unshuffled batches of 32."""
    train, validation = digits_arrays(seed=0)
    return dict_batches(train, BATCH, COUNT), dict_batches(validation, BATCH, 64)


def reconstruction(models, batch):
    return tf.reduce_mean(tf.square(models["decoder"](models["encoder"](batch["x"])) - batch["x"]))


def probe(models, batch):
    logits = models["probe"](models["encoder"](batch["x"]))
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(batch["y"], logits, from_logits=True)
    )


class PretrainThenProbe(beatloop.Recipe):
    """``pretrain_epochs`` epochs of reconstruction, then the probe for the rest."""

    name = "pretrain_then_probe_test"

    @attrs.frozen
    class Config:
        pretrain_epochs: int = 2
        probe_epochs: int | None = None

    def default_data(self, seed):
        return DataSplit(*data())

    def build_models(self, batch_spec):
        return models()

    def build_optimizers(self):
        return {"pretrain": keras.optimizers.Adam(1e-2), "probe": keras.optimizers.Adam(1e-2)}

    def losses(self):
        return {"reconstruction": reconstruction, "probe": probe}

    def schedule(self):
        pretrain = beatloop.Schedule(
            beatloop.Beat("reconstruction", "pretrain", updates=("encoder", "decoder")),
            frozen="probe",
        )
        probing = beatloop.Schedule(
            beatloop.Beat("probe", "probe", updates="probe"), frozen=("encoder", "decoder")
        )
        return beatloop.Phases(
            beatloop.Phase("pretrain", pretrain, epochs=self.config.pretrain_epochs),
            beatloop.Phase("probe", probing, epochs=self.config.probe_epochs),
        )
