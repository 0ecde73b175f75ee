"""Augmented views of images for the contrastive recipe: a random shift (pad with zeros,
crop back), an optional horizontal flip and additive noise, every draw one row per
example from the run's generator (``models.random``), so a run under a distribution
strategy draws the views one device would (the generator draws for the global batch and
hands each replica its rows)."""

from __future__ import annotations

import math

import attrs
import tensorflow as tf


def square_side(features: int | None) -> int | None:
    """The side of the square image a flat row of ``features`` pixels is (8 for the
    64 of the digits); ``None`` when ``features`` is not a square."""
    if features is None:
        return None
    side = math.isqrt(features)
    return side if side * side == features else None


def as_images(x: tf.Tensor) -> tf.Tensor:
    """``x`` as images ``(n, height, width, channels)``: flat rows of a square number of
    pixels become one-channel squares, ``(n, height, width)`` gains a channel."""
    if x.shape.rank == 2:
        side = square_side(x.shape[-1])
        return tf.reshape(x, [-1, side, side, 1])
    if x.shape.rank == 3:
        return x[..., tf.newaxis]
    return x


def shifted(images: tf.Tensor, offsets: tf.Tensor, max_shift: int) -> tf.Tensor:
    """Each image moved by its own ``(down, right)`` offset in ``[-max_shift,
    max_shift]``: zero-padded by ``max_shift`` on every side, then cropped back to its
    size at the offset (``offsets``: int32, shape ``(n, 2)``)."""
    pad = [[0, 0], [max_shift, max_shift], [max_shift, max_shift], [0, 0]]
    padded = tf.pad(images, pad)
    rows = max_shift - offsets[:, :1] + tf.range(tf.shape(images)[1])[tf.newaxis]
    columns = max_shift - offsets[:, 1:] + tf.range(tf.shape(images)[2])[tf.newaxis]
    cropped = tf.gather(padded, rows, axis=1, batch_dims=1)
    return tf.gather(cropped, columns, axis=2, batch_dims=1)


@attrs.frozen
class Views:
    """How a view of a batch is drawn: shift by up to ``max_shift`` pixels, flip left to
    right with probability one half when ``flip``, add Gaussian noise of std ``noise``."""

    max_shift: int = 1
    noise: float = 0.1
    flip: bool = False

    def __call__(self, x: tf.Tensor, random) -> tf.Tensor:
        """One random view of each row of ``x`` (in ``x``'s shape), drawn from
        ``random`` (the run's generator): offsets, then flips, then noise."""
        images = as_images(x)
        rows = tf.shape(images)[0]
        if self.max_shift:
            limit = self.max_shift
            offsets = random.uniform([rows, 2], -limit, limit + 1, dtype=tf.int32)
            images = shifted(images, offsets, limit)
        if self.flip:
            flips = random.uniform([rows, 1, 1, 1]) < 0.5
            images = tf.where(flips, tf.reverse(images, axis=[2]), images)
        if self.noise:
            images = images + self.noise * random.normal(tf.shape(images))
        return tf.reshape(images, tf.shape(x))
