"""A functional model of named inputs shaped like a KerasHub text classifier (token ids,
segment ids, a padding mask; an ``Embedding``, attention, a pooled head), and data for
it: what a user fine-tuning a pretrained model passes in, small enough for the suite."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

VOCABULARY, LENGTH, CLASSES = 40, 10, 3


def text_classifier(seed: int = 0, width: int = 16) -> keras.Model:
    """Inputs ``token_ids``, ``segment_ids`` (int32) and ``padding_mask`` (bool), each of
    shape (batch, LENGTH); logits of CLASSES classes."""
    keras.utils.set_random_seed(seed)
    token_ids = keras.Input((LENGTH,), dtype="int32", name="token_ids")
    segment_ids = keras.Input((LENGTH,), dtype="int32", name="segment_ids")
    padding_mask = keras.Input((LENGTH,), dtype="bool", name="padding_mask")
    tokens = keras.layers.Embedding(VOCABULARY, width, name="token_embedding")(token_ids)
    segments = keras.layers.Embedding(2, width, name="segment_embedding")(segment_ids)
    hidden = keras.layers.Add()([tokens, segments])
    attended = keras.layers.MultiHeadAttention(2, width // 2, name="attention")(
        hidden, hidden, attention_mask=padding_mask[:, None, :]
    )
    hidden = keras.layers.LayerNormalization()(keras.layers.Add()([hidden, attended]))
    pooled = keras.layers.GlobalAveragePooling1D()(hidden, mask=padding_mask)
    logits = keras.layers.Dense(CLASSES, name="logits")(pooled)
    inputs = {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}
    return keras.Model(inputs, logits, name="text_classifier")


def text_arrays(count: int = 96, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``(features, labels)``: sentences of 3 to LENGTH tokens (id 0 pads), two segments
    each, the label a function of the first token (learnable)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, LENGTH + 1, count)
    mask = np.arange(LENGTH)[None, :] < lengths[:, None]
    tokens = np.where(mask, rng.integers(1, VOCABULARY, (count, LENGTH)), 0).astype(np.int32)
    segments = ((np.arange(LENGTH)[None, :] >= (lengths // 2)[:, None]) & mask).astype(np.int32)
    labels = (tokens[:, 0] % CLASSES).astype(np.int32)
    return {"token_ids": tokens, "segment_ids": segments, "padding_mask": mask}, labels


def text_batches(count: int = 96, batch_size: int = 16, seed: int = 0) -> tf.data.Dataset:
    """``(features, labels)`` batches, unshuffled, as a user builds them for ``fit``."""
    features, labels = text_arrays(count, seed)
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch_size)
