"""A loss's own batch (``models.own_batch``) on one device, and the rule that one entry's
losses declare one size. On two replicas: tests/test_dqn.py (its worker splits dqn's
buffer sample across a MirroredStrategy)."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

import beatloop
from beatloop.core.compiled.forward import ModelCalls
from beatloop.core.devices.replicas import BatchShare, ReplicaRandom, declared, entry_weight


def test_on_one_device_an_own_batch_is_the_whole_batch_and_the_runs_generator():
    generator = tf.random.Generator.from_seed(3)
    sample = ModelCalls({"m": keras.Sequential([keras.layers.Dense(1)])}, frozenset(), generator)
    sample = sample.own_batch(8)
    assert (sample.size, sample.offset, sample.total) == (8, 0, 8)
    assert sample.random is generator  # the very draws one device makes
    rows = tf.range(8)
    assert sample.take(rows) is rows
    assert declared(generator) == 0 and entry_weight(generator, 0, None, "entry 'e'") is None


def share(local, total, offset=0) -> BatchShare:
    return BatchShare(*(tf.constant(v, tf.int64) for v in (local, total, offset)))


def test_an_entrys_weight_is_its_share_of_the_own_batch_it_declared_and_one_size_only():
    random = ReplicaRandom(tf.random.Generator.from_seed(0), share(1, 1))
    data_weight = tf.constant(1.0)
    assert entry_weight(random, 0, data_weight, "entry 'td'") is data_weight  # none declared
    random.own.append(share(16, 32, 16))
    assert float(entry_weight(random, 0, data_weight, "entry 'td'")) == 0.5
    random.own.append(share(5, 10))
    assert float(entry_weight(random, 1, data_weight, "entry 'other'")) == 0.5  # its own
    with pytest.raises(beatloop.BeatloopError, match=r"entry 'pair' declares own batches of"):
        entry_weight(random, 0, data_weight, "entry 'pair'")
