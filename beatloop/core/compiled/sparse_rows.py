"""An embedding's gradient as every optimizer sees it: its rows summed per index.

An ``Embedding``'s gradient is a ``tf.IndexedSlices``, a row per lookup: a token seen k
times in a batch has k rows. Keras 3's optimizers square those rows before they are
added into the table (Adam's, AdamW's, RMSprop's, Adagrad's, Adafactor's second
moments), so such a token gets Σg² where the batch's gradient has (Σg)², and a run would
depend on how its batches are cut (``accumulate``, replicas). The step sums each sparse
gradient's rows per index once, as it takes the gradients (``summed_rows``); the
optimizer, a transform, a combination, a condition, the sums of ``accumulate`` and the
NaN guard all read that one form.

The form keeps as many rows as it was given: one per distinct index, then zero rows at
index 0, a size XLA knows and the same at every step of a K-step call. A zero row
changes nothing: Keras's optimizers add a sparse gradient's rows, and their squares,
into the table, and 0 + x is x.

Under a strategy the rows are summed over the global batch. Each replica's rows (padded
to one count by ``even_sparse``) are gathered, the all-reduce TensorFlow makes of
``IndexedSlices``, and summed per index alike on every replica; each replica then keeps
its own part of those rows. The optimizer's own sum over replicas gathers the parts back
into the global batch's gradient, one row per index; so does a transform's, a
combination's or a condition's all-reduce; and the parts' squares summed over replicas
(the NaN guard's checks) are the global gradient's.
"""

from __future__ import annotations

import tensorflow as tf

from beatloop.core.compiled.applying import replicated
from beatloop.core.devices.collectives import Gathering, even_sparse


def summed_rows(grads: list, rows: tf.Tensor, gathering: Gathering | None) -> list:
    """``grads`` (one beat's, on this replica of ``rows`` examples) with each sparse
    gradient's rows summed per index over the global batch (on one device, the batch);
    a dense gradient (or ``None``) as it is."""
    grads = even_sparse(grads, rows, gathering)
    sparse = [index for index, grad in enumerate(grads) if isinstance(grad, tf.IndexedSlices)]
    if not sparse:
        return grads
    context = replicated()
    found = [grads[index] for index in sparse]
    if context is None:
        summed = [summed_per_index(grad) for grad in found]
    else:
        replicas = context.num_replicas_in_sync
        gathered = context.all_reduce(tf.distribute.ReduceOp.SUM, found)
        summed = [own_part(context, summed_per_index(g, replicas)) for g in gathered]
    grads = list(grads)
    for index, grad in zip(sparse, summed, strict=True):
        grads[index] = grad
    return grads


def summed_per_index(grad: tf.IndexedSlices, parts: int = 1) -> tf.IndexedSlices:
    """``grad`` with the rows of each index summed into one (in the order the rows
    come, as the dense gradient sums them), followed by zero rows at index 0: as many
    rows as ``grad`` has, rounded up to a multiple of ``parts``."""
    lookups = tf.shape(grad.indices)[0]
    count = -(-lookups // parts) * parts if parts > 1 else lookups
    _, positions = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, positions, count)
    # Each index sits in its own position; a position no row took holds the lowest
    # integer, made index 0 (its row is zeros).
    indices = tf.maximum(tf.math.unsorted_segment_max(grad.indices, positions, count), 0)
    return tf.IndexedSlices(values, indices, grad.dense_shape)


def own_part(context: tf.distribute.ReplicaContext, grad: tf.IndexedSlices) -> tf.IndexedSlices:
    """This replica's part of ``grad``'s rows (the same on every replica, a multiple of
    the replica count): replica r keeps the r-th of as many equal parts as replicas."""
    size = tf.shape(grad.indices)[0] // context.num_replicas_in_sync
    start = size * context.replica_id_in_sync_group
    part = slice(start, start + size)
    return tf.IndexedSlices(grad.values[part], grad.indices[part], grad.dense_shape)
