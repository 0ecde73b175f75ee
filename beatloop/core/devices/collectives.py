"""Losses that see the global batch under a distribution strategy: the cross-replica
gather ``models.all_gather`` makes, where a replica's rows sit in it, and a collective
op's failure in readable words (a ``CollectiveError``, not a data error).

A collective op inside the engine's K-step loop keeps one instance every iteration, and
TensorFlow fixes its shape at the first: every replica must gather the same shape at
every step. Replicas' shares of a global batch differ (25 and 24 rows of 49; 1 and 0 of
a last batch of 1), so each replica pads its rows to one count fixed when the step is
traced (``Gathering.rows``: the largest share a batch of the data set can give), gathers
the padded rows with every replica's true count, and drops the padding.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping

import attrs
import tensorflow as tf

from beatloop.core.data.batches import batched_source, leading_dimension
from beatloop.core.data.paths import first_tensor
from beatloop.core.devices.replicas import batch_share
from beatloop.core.failures.errors import BeatloopError, ConfigError


class CollectiveError(BeatloopError, RuntimeError):
    """A cross-replica collective op (``models.all_gather``, a gradient's all-reduce)
    that failed under a distribution strategy: names the op, what TensorFlow found and
    what to check. ``original`` is TensorFlow's error. (Here, beside the ops it is about,
    rather than in ``errors``.)"""


@attrs.frozen
class Gathering:
    """How a compiled step's ``models.all_gather`` pads a replica's rows: to ``rows``, the
    largest share of a global batch its data set can give (``ceil(batch size /
    replicas)``, what ``experimental_distribute_dataset`` cuts a batch into), the same
    on every replica and at every step; ``None`` when TensorFlow cannot compute the data
    set's batch size. ``steps``: the most steps one compiled call runs (above 1 a step
    cannot pad to its own largest share); ``data``: the data set's role, for messages.
    Python values, fixed when the step is traced, handed to it by the engine."""

    rows: int | None
    steps: int = 1
    data: str = "training"

    @classmethod
    def of(cls, dataset, strategy, steps: int, data: str) -> Gathering | None:
        """The gathering of a step on ``dataset`` distributed by ``strategy``; ``None``
        without one (or with one replica: no gather to make)."""
        if strategy is None or dataset is None or strategy.num_replicas_in_sync == 1:
            return None
        size = global_batch_size(dataset)
        replicas = strategy.num_replicas_in_sync
        return cls(None if size is None else -(-size // replicas), steps, data)

    def covers(self, other: Gathering | None) -> bool:
        """Whether a step traced with this gathering gathers right on ``other``'s data (at
        no more steps per call): it pads to at least ``other``'s largest share, or to
        each step's own at one step per call."""
        if other is None or (self.rows is None and self.steps == 1):
            return True
        return self.rows is not None and other.rows is not None and other.rows <= self.rows


def even_sparse(grads: list, rows: tf.Tensor, gathering: Gathering | None) -> list:
    """``grads`` with each sparse gradient (an embedding lookup's ``IndexedSlices``, a
    row per lookup) padded with zero rows at index 0 to one row count on every replica
    and at every step of a K-step call: the optimizer sums a sparse gradient over
    replicas by gathering its rows, and a collective inside the loop must have one shape
    at every step. The count is ``gathering.rows`` (the largest share) times the lookups
    per example (every replica's lookups over every replica's ``rows``), or more if a
    replica has more. Zero rows add exactly nothing: Keras's optimizers scatter-add a
    sparse gradient's rows (and their squares), so its update is the unpadded one's."""
    context = _replicas()
    if gathering is None or context is None:
        return grads
    return [_even(g, rows, gathering, context) if isinstance(g, tf.IndexedSlices) else g
            for g in grads]  # fmt: skip


def _even(grad: tf.IndexedSlices, rows, gathering: Gathering, context) -> tf.IndexedSlices:
    lookups = tf.shape(grad.values, out_type=tf.int64)[0]
    counts = context.all_gather(tf.stack([[lookups, tf.cast(rows, tf.int64)]]), axis=0)
    per_row = -(-tf.reduce_sum(counts[:, 0]) // tf.maximum(tf.reduce_sum(counts[:, 1]), 1))
    target = tf.reduce_max(counts[:, 0])
    if gathering.rows is not None:
        target = tf.maximum(target, gathering.rows * per_row)
    extra = target - lookups
    zeros = tf.zeros(tf.concat([[extra], tf.shape(grad.values, out_type=tf.int64)[1:]], 0))
    values = tf.concat([grad.values, tf.cast(zeros, grad.values.dtype)], axis=0)
    indices = tf.concat([grad.indices, tf.zeros([extra], grad.indices.dtype)], axis=0)
    return tf.IndexedSlices(values, indices, grad.dense_shape)


def global_batch_size(dataset: tf.data.Dataset) -> int | None:
    """The batch size of ``dataset`` as ``experimental_distribute_dataset`` computes it to
    cut batches into replica shares (no batch holds more rows), or ``None`` where
    TensorFlow cannot compute it (a ``map`` after the ``batch``, a generator's batches).
    Call eagerly; read once a data set (TensorFlow serialises the data set to read it)."""
    if dataset in _BATCH_SIZES:
        return _BATCH_SIZES[dataset]
    try:  # TensorFlow's own function for it, not in its public API
        from tensorflow.python.data.experimental.ops.distribute import compute_batch_size

        size = int(compute_batch_size(batched_source(dataset)))
    except Exception:  # no batch found, or a TensorFlow without the function
        size = -1
    _BATCH_SIZES[dataset] = size if size > 0 else None
    return _BATCH_SIZES[dataset]


#: ``global_batch_size`` by data set (each phase's loops, each evaluation ask again).
_BATCH_SIZES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _replicas() -> tf.distribute.ReplicaContext | None:
    """The replica context of a step on several replicas; ``None`` on one device."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context


def all_gather(x, batch: Mapping[str, tf.Tensor] | None, gathering: Gathering | None = None):
    """Every replica's ``x`` (a tensor or a structure of them, each with the replica's
    rows of ``batch`` on its first axis) concatenated along axis 0 in replica order; on
    one device ``x`` itself. Each replica receives the gradient of its own rows, summed
    over every replica's loss (TensorFlow's gather's gradient). ``gathering``: how the
    compiled step pads (``None``: a step outside the engine's loop, padded to its own
    largest share). A scalar, a ragged or sparse tensor, or a first axis that is not
    the replica's rows is refused, on one device too."""
    flat = [_dense(value) for value in tf.nest.flatten(x)]
    rows = _batch_rows(batch, "all_gather")
    unchecked = [t for t in flat if not _rows_known(t, batch)]
    context = _replicas()
    if context is None:
        return _on_one_device(x, flat, unchecked, rows)
    pad = None if gathering is None else gathering.rows
    if pad is None and gathering is not None and gathering.steps > 1:
        raise _unknown_batch_size(gathering)
    own = [rows, *(tf.shape(t, out_type=tf.int64)[0] for t in flat)]
    counts = context.all_gather(tf.reshape(tf.stack(own), [1, len(own)]), axis=0)
    shares = counts[:, 0]
    found = tf.reshape(counts[:, 1:], [-1])  # replica by replica, tensor by tensor
    checks = [
        tf.debugging.assert_equal(
            found, tf.repeat(shares, len(flat)),
            message=f"models.all_gather(x) {_WRONG_ROWS} ({_shapes(flat)}); x: the first "
            "axis of each tensor gathered on each replica, y: the rows of that replica",
        )
    ]  # fmt: skip
    if pad is None:
        pad = tf.reduce_max(shares)  # one step per call: its own largest share
    else:
        checks.append(
            tf.debugging.assert_less_equal(
                shares, tf.constant(pad, tf.int64),
                message=f"models.all_gather(x): a replica has more rows than a batch of "
                f"the {gathering.data} data gives one ({pad})",
            )
        )  # fmt: skip
    with tf.control_dependencies(checks):
        padded = [_padded(t, pad) for t in flat]
    gathered = context.all_gather(padded, axis=0)
    pad = tf.cast(pad, tf.int64)
    replicas = context.num_replicas_in_sync
    unpadded = [
        tf.concat([g[i * pad : i * pad + shares[i]] for i in range(replicas)], axis=0)
        for g in gathered
    ]
    return tf.nest.pack_sequence_as(x, unpadded)


_WRONG_ROWS = "takes rows of the batch: the first axis of x must be the rows of the batch"


def _shapes(flat: list[tf.Tensor]) -> str:
    """The shapes of ``flat`` as known when traced, in words."""
    shapes = [tuple(t.shape.as_list()) if t.shape.rank is not None else "?" for t in flat]
    return "shape " + ", ".join(map(str, shapes)) if len(flat) == 1 else f"shapes {shapes}"


def _dense(value) -> tf.Tensor:
    """``value`` as a dense tensor of rank 1 or more, or the error saying why not."""
    if isinstance(value, tf.RaggedTensor | tf.SparseTensor | tf.IndexedSlices):
        shape = tuple(value.shape.as_list()) if value.shape.rank is not None else "unknown"
        raise TypeError(
            f"models.all_gather(x) gathers dense tensors, got a tf.{type(value).__name__} of "
            f"shape {shape}: gather a dense tensor of the same shape on every replica but "
            "for its first axis (a ragged tensor's x.to_tensor(shape=[None, width]))"
        )
    tensor = tf.convert_to_tensor(value)
    if tensor.shape.rank == 0:
        raise ValueError(
            f"models.all_gather(x) gathers per-example rows, got a scalar (shape ()) of "
            f"{tensor.dtype.name}: gather a tensor with the replica's rows on its first "
            "axis, or reduce a scalar across replicas by gathering the rows it is made of"
        )
    return tensor


def _batch_rows(batch, call: str) -> tf.Tensor:
    if not batch:
        raise BeatloopError(
            f"models.{call} was read where there is no batch (outside a loss or a "
            "group's forward); read it in the loss whose batch it locates"
        )
    return leading_dimension(batch)


def _rows_known(tensor: tf.Tensor, batch) -> bool:
    """Whether ``tensor``'s first axis is known, when traced, to be the batch's rows;
    a ValueError when it is known not to be."""
    first = first_tensor(batch)
    expected = first.shape[0] if first.shape.rank else None
    found = tensor.shape[0] if tensor.shape.rank else None
    if expected is not None and found is not None and expected != found:
        raise ValueError(
            f"models.all_gather(x) {_WRONG_ROWS}: x has {_shapes([tensor])}, the batch "
            f"{expected} rows"
        )
    return expected is not None and found is not None


def _on_one_device(x, flat: list[tf.Tensor], unknown: list[tf.Tensor], rows: tf.Tensor):
    """``x`` itself, the rows of its ``unknown`` tensors checked when the step runs (not
    in a step XLA compiles, which drops assertions, saying so on standard error)."""
    if _in_xla():
        return x
    checks = [
        tf.debugging.assert_equal(
            tf.shape(t, out_type=tf.int64)[0], rows,
            message=f"models.all_gather(x) {_WRONG_ROWS} (x: {_shapes([t])})",
        )
        for t in unknown
    ]  # fmt: skip
    if not checks or tf.executing_eagerly():
        return x
    with tf.control_dependencies(checks):
        return tf.nest.pack_sequence_as(x, [tf.identity(t) for t in flat])


def _in_xla() -> bool:
    """Whether the graph being traced is compiled by XLA (``jit_compile``)."""
    try:
        from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext

        return bool(GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except (ImportError, AttributeError):
        return False


def _padded(tensor: tf.Tensor, rows) -> tf.Tensor:
    """``tensor`` with zero rows added up to ``rows`` (static when ``rows`` is an int)."""
    missing = tf.cast(rows, tf.int64) - tf.shape(tensor, out_type=tf.int64)[0]
    first = tf.reshape(tf.stack([tf.zeros_like(missing), missing]), [1, 2])
    padded = tf.pad(tensor, tf.concat([first, tf.zeros([tf.rank(tensor) - 1, 2], tf.int64)], 0))
    if isinstance(rows, int) and tensor.shape.rank is not None:
        padded.set_shape([rows, *tensor.shape[1:]])
    return padded


def _unknown_batch_size(gathering: Gathering) -> ConfigError:
    return ConfigError(
        f"models.all_gather under a distribution strategy pads each replica's rows to the "
        f"largest share of a global batch, the same at every step of a compiled call "
        f"(here up to {gathering.steps} steps), but TensorFlow cannot compute the batch "
        f"size of the {gathering.data} data (a map after its .batch(n), batches a "
        "generator makes): batch it with .batch(n) after its last map, or pass "
        "steps_per_execution=1"
    )


def batch_offset(batch: Mapping[str, tf.Tensor] | None) -> tf.Tensor:
    """The row of the global batch where this replica's rows of ``batch`` start, as an
    int32 scalar (0 on one device): ``all_gather(x)[offset : offset + n]`` is ``x``."""
    if _replicas() is None:
        return tf.constant(0, tf.int32)
    return tf.cast(batch_share(_batch_rows(batch, "batch_offset")).offset, tf.int32)


# A collective op's node (CollectiveGatherV2, CollectiveReduceV2, ...), and the words
# TensorFlow uses when one member of a collective failed and the others were aborted.
_NODE = re.compile(r"(?:Detected at node |\{\{node )(\S*Collective\w*)")
_ABORTED = re.compile(r"Collective ops is aborted by: ([^\n]*)")
_KINDS = (("Gather", "all-gather"), ("Reduce", "all-reduce"), ("Bcast", "broadcast"))


def collective_error(
    error: tf.errors.OpError, role: str, label: str | None
) -> CollectiveError | None:
    """The CollectiveError for an op error a cross-replica collective op raised in a
    ``role`` step (training, validation), or ``None`` for any other error."""
    message = error.message or str(error)
    node, aborted = _NODE.search(message), _ABORTED.search(message)
    if node is None and aborted is None:
        return None
    if node is None:
        op = "a cross-replica collective op"
    else:
        kind = next((kind for word, kind in _KINDS if word in node[1]), "collective op")
        op = f"{node[1]} (a cross-replica {kind})"
    cause = aborted[1] if aborted else " ".join(message.strip().split("\n\n")[-1].split())
    head = f"{label}: " if label else ""
    found = CollectiveError(
        f"{head}a cross-replica collective op failed in a {role} step: {op}: {cause.strip()} "
        "Check that every replica calls the same collectives in the same order (no "
        "models.all_gather inside a branch only some replicas take) on tensors of the same "
        "dtype and the same shape but for axis 0 (models.all_gather pads the rows, whatever "
        "each replica's share of the global batch): gather per-example rows (embeddings), "
        "not a tensor with another dimension of the replica's batch size, which differs "
        "between replicas. TensorFlow's collective ops stay aborted in this process after "
        "such a failure: start a new one to run again."
    )
    found.original = error
    return found
