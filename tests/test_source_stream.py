"""The streamed sources' shared pipeline (``beatloop.sources.stream``): the hold-out is
exact and seeded, and a buffer as large as the data shuffles like the in-memory
pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from beatloop import datasets as data
from beatloop.core.failures.errors import DataError
from beatloop.sources.stream import StreamConfig, stream_batches, stream_split

COUNT = 300


def records(count: int = COUNT) -> tf.data.Dataset:
    """``(index, text)`` pairs, the text being the index written out."""
    return tf.data.Dataset.from_tensor_slices([str(i) for i in range(count)]).enumerate()


def parse(batch: tf.Tensor) -> dict:
    return {"x": tf.strings.to_number(batch, tf.float32)}


def values(dataset: tf.data.Dataset) -> np.ndarray:
    return np.concatenate([batch["x"].numpy() for batch in dataset])


def test_a_buffer_as_large_as_the_data_shuffles_like_the_in_memory_pipeline():
    streamed = stream_batches(records(), COUNT, parse, 32, shuffle_seed=5, shuffle_buffer=10**4)
    in_memory = data.batches({"x": np.arange(COUNT, dtype=np.float32)}, 32, shuffle_seed=5)
    firsts = []
    for _ in range(3):  # each pass reshuffles, in the same order both ways
        ours, theirs = values(streamed), values(in_memory)
        np.testing.assert_array_equal(ours, theirs)
        firsts.append(ours[:8].tolist())
    assert firsts[0] != firsts[1] != firsts[2]
    assert int(streamed.cardinality()) == -(-COUNT // 32)


def test_a_small_buffer_still_gives_every_example_once_a_pass():
    streamed = stream_batches(records(), COUNT, parse, 32, shuffle_seed=5, shuffle_buffer=16)
    seen = values(streamed)
    assert sorted(seen.tolist()) == list(range(COUNT))
    assert seen.tolist() != list(range(COUNT))


def test_the_hold_out_is_exact_disjoint_and_drawn_by_the_seed():
    config = StreamConfig(validation_fraction=0.2)
    split = stream_split(records(), COUNT, parse, config, seed=3, batch_size=32, label="t:x")
    train, held = values(split.train), values(split.validation)
    assert len(held) == round(COUNT * 0.2) and len(train) == COUNT - len(held)
    assert sorted(np.concatenate([train, held]).tolist()) == list(range(COUNT))
    assert int(split.validation.cardinality()) == -(-len(held) // 32)
    again = stream_split(records(), COUNT, parse, config, seed=3, batch_size=32, label="t:x")
    other = stream_split(records(), COUNT, parse, config, seed=4, batch_size=32, label="t:x")
    assert values(again.validation).tolist() == held.tolist()  # in file order
    assert set(values(other.validation).tolist()) != set(held.tolist())


def test_a_hold_out_leaving_a_side_empty_is_refused():
    config = StreamConfig(validation_fraction=0.001)
    with pytest.raises(DataError, match=r"leaves 300 for training and 0 for validation"):
        stream_split(records(), COUNT, parse, config, seed=0, batch_size=32, label="t:x")
    with pytest.raises(DataError, match="holds no examples"):
        stream_split(records(0), 0, parse, StreamConfig(), seed=0, batch_size=32, label="t:x")
