"""Retrieval figures over a whole catalogue in memory that grows with the items and the
batch, never users x items: the training data's seen pairs kept sparse (per user, the
sorted items it rated) and every item scored chunk by chunk.

Exact against scoring every item at once: each chunk is one matmul of the batch's
users against ``chunk`` items (the items padded with zeros to whole chunks, so every
matmul has the same shape), and each row's own score is read from a matmul of that same
shape, so a tie in the dense product is a tie here too. The loops run one chunk at a
time (``parallel_iterations=1``): never two chunks' scores held at once.
"""

from __future__ import annotations

import attrs
import numpy as np
import tensorflow as tf

#: Rows of a chunk are padded to a multiple of this, so no matmul is a thin special case.
_ALIGN = 16


@attrs.frozen
class SeenPairs:
    """The items each user rated in training, by lookup row: row ``r``'s item columns are
    ``items[starts[r]:starts[r + 1]]`` (row 0, unknown users, rated nothing)."""

    starts: np.ndarray  # int64, one more than the rows
    items: np.ndarray  # int32 item columns, sorted within each row

    @classmethod
    def from_pairs(cls, rows: np.ndarray, columns: np.ndarray, users: int) -> SeenPairs:
        """From the training rows' user lookup rows (1-based) and item columns; repeated
        pairs count once."""
        if users < 1:
            raise ValueError(f"seen pairs need at least one user, got {users}")
        width = int(columns.max(initial=0)) + 1
        pairs = np.unique(rows.astype(np.int64) * width + columns)
        row_of, column_of = np.divmod(pairs, width)
        per_row = np.bincount(row_of, minlength=users + 1)
        starts = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64)
        return cls(starts, column_of.astype(np.int32))

    def table(self, items: int) -> np.ndarray:
        """The same pairs as a rows x ``items`` table of bytes (1: rated)."""
        table = np.zeros([len(self.starts) - 1, items], np.uint8)
        table[np.repeat(np.arange(len(self.starts) - 1), np.diff(self.starts)), self.items] = 1
        return table

    def rated(self, row: int) -> np.ndarray:
        """The item columns lookup row ``row`` rated."""
        return self.items[self.starts[row] : self.starts[row + 1]]


def chunk_width(items: int, chunk: int) -> int:
    """Items scored at once: ``chunk``, or all the items when fewer, rounded up to a
    multiple of ``_ALIGN``."""
    return -(-min(chunk, items) // _ALIGN) * _ALIGN


def count_unseen_above(
    users: tf.Tensor,
    item_vectors: tf.Tensor,
    own: tf.Tensor,
    user_rows: tf.Tensor,
    seen: tuple[tf.Tensor, tf.Tensor] | tf.Tensor,
    chunk: int,
) -> tf.Tensor:
    """For each row, how many items its user did not rate score strictly above the row's
    own item (``own``: its column, any value where the item is unknown), with
    ``users`` ``[B, d]``, ``item_vectors`` ``[I, d]`` (static ``I``) and ``user_rows``
    the users' lookup rows. ``seen``: ``SeenPairs``' ``(starts, items)``, or for a small
    catalogue its ``table`` (one gather instead of the batch's pairs). Peak memory:
    ``B x chunk`` scores and the batch's seen pairs."""
    count, width = item_vectors.shape[0], chunk_width(item_vectors.shape[0], chunk)
    dense = not isinstance(seen, tuple)
    if width >= count:  # one chunk: the dense product itself, each row's own score in it
        scores = tf.matmul(users, item_vectors, transpose_b=True)
        own_score = tf.gather(scores, own, batch_dims=1)
        if dense:
            return _above_unrated(scores, own_score, tf.gather(seen, user_rows))
        seen_row, seen_column = _batch_seen(user_rows, *seen)
        return _above_in(scores, own_score, 0, count, count, seen_row, seen_column)
    chunks = -(-count // width)
    padded = tf.pad(item_vectors, [[0, chunks * width - count], [0, 0]])
    own_score = _own_scores(users, tf.gather(item_vectors, own), width)
    if dense:  # the padding counts as rated: never above
        rated = tf.pad(
            tf.gather(seen, user_rows), [[0, 0], [0, chunks * width - count]], constant_values=1
        )
    else:
        seen_row, seen_column = _batch_seen(user_rows, *seen)

    def body(index, above):
        start = index * width
        scores = tf.matmul(users, padded[start : start + width], transpose_b=True)
        if dense:
            above += _above_unrated(scores, own_score, rated[:, start : start + width])
        else:
            above += _above_in(scores, own_score, start, width, count, seen_row, seen_column)
        return index + 1, tf.ensure_shape(above, users.shape[:1])

    start = (tf.constant(0), tf.zeros(tf.shape(users)[:1], tf.int32))
    return tf.while_loop(lambda index, _: index < chunks, body, start, parallel_iterations=1)[1]


def _above_unrated(scores, own_score, rated) -> tf.Tensor:
    """Per row, the items scoring above its own that ``rated`` (a table's rows) marks 0."""
    higher = tf.logical_and(scores > own_score[:, None], tf.equal(rated, 0))
    return tf.reduce_sum(tf.cast(higher, tf.int32), axis=1)


def _above_in(scores, own_score, start, width, count, seen_row, seen_column) -> tf.Tensor:
    """Per row, the items its user did not rate in ``scores`` (``width`` items from
    ``start``, of ``count`` in all) that score above its own: all above, less the rated
    ones above."""
    real = tf.range(width) < count - start
    higher = tf.logical_and(scores > own_score[:, None], real[None, :])
    inside = tf.logical_and(seen_column >= start, seen_column < start + width)
    where = tf.stack([seen_row, tf.clip_by_value(seen_column - start, 0, width - 1)], axis=1)
    seen_higher = tf.logical_and(
        inside, tf.gather_nd(scores, where) > tf.gather(own_score, seen_row)
    )
    seen_above = tf.math.unsorted_segment_sum(
        tf.cast(seen_higher, tf.int32), seen_row, tf.shape(scores)[0]
    )
    return tf.reduce_sum(tf.cast(higher, tf.int32), axis=1) - seen_above


def _own_scores(users: tf.Tensor, own_vectors: tf.Tensor, width: int) -> tf.Tensor:
    """Each row's score of its own item, from matmuls ``[B, width]`` like the chunks'
    (row ``b`` against its item in column ``b % width``)."""
    rows = tf.shape(users)[0]
    blocks = (rows + width - 1) // width
    padded = tf.pad(own_vectors, [[0, blocks * width - rows], [0, 0]])

    def body(index, found):
        scores = tf.matmul(users, padded[index * width : (index + 1) * width], transpose_b=True)
        mine = tf.range(rows) // width == index
        column = tf.where(mine, tf.range(rows) % width, 0)
        found = tf.where(mine, tf.gather(scores, column, batch_dims=1), found)
        return index + 1, tf.ensure_shape(found, users.shape[:1])

    start = (tf.constant(0), tf.zeros([rows], users.dtype))
    return tf.while_loop(lambda index, _: index < blocks, body, start, parallel_iterations=1)[1]


def _batch_seen(user_rows, seen_starts, seen_items) -> tuple[tf.Tensor, tf.Tensor]:
    """The batch's seen pairs: each one's row in the batch and its item column."""
    rows = tf.cast(user_rows, tf.int64)
    spans = tf.ragged.range(tf.gather(seen_starts, rows), tf.gather(seen_starts, rows + 1))
    return tf.cast(spans.value_rowids(), tf.int32), tf.gather(seen_items, spans.flat_values)


def running_top_k(
    users: tf.Tensor, item_vectors: tf.Tensor, k: int, chunk: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """The ``k`` best-scored items of each row, as ``tf.math.top_k`` over every item gives
    them (values, indices; ties to the lower index), merging one chunk at a time."""
    count, width = item_vectors.shape[0], chunk_width(item_vectors.shape[0], chunk)
    chunks = -(-count // width)
    padded = tf.pad(item_vectors, [[0, chunks * width - count], [0, 0]])
    lowest = tf.fill([tf.shape(users)[0], k], tf.constant(-np.inf, users.dtype))

    def body(index, values, indices):
        start = index * width
        scores = tf.matmul(users, padded[start : start + width], transpose_b=True)
        real = tf.range(width) < count - start
        scores = tf.where(real[None, :], scores, tf.constant(-np.inf, users.dtype))
        positions = tf.broadcast_to(start + tf.range(width), tf.shape(scores))
        best = tf.math.top_k(tf.concat([values, scores], axis=1), k=k)
        merged = tf.gather(tf.concat([indices, positions], axis=1), best.indices, batch_dims=1)
        shape = [*users.shape[:1], k]
        return index + 1, tf.ensure_shape(best.values, shape), tf.ensure_shape(merged, shape)

    start = (tf.constant(0), lowest, tf.zeros(tf.shape(lowest), tf.int32))
    loop = tf.while_loop(lambda index, *_: index < chunks, body, start, parallel_iterations=1)
    _, values, indices = loop
    return values, indices
