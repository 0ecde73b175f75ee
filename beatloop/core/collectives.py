"""Losses that see the global batch under a distribution strategy: the cross-replica
gather ``models.all_gather`` makes, where a replica's rows sit in it, and a collective
op's failure in readable words (a ``CollectiveError``, not a data error).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import tensorflow as tf

from beatloop.core.batches import leading_dimension
from beatloop.core.errors import BeatloopError
from beatloop.core.replicas import batch_share


class CollectiveError(BeatloopError, RuntimeError):
    """A cross-replica collective op (``models.all_gather``, a gradient's all-reduce)
    that failed under a distribution strategy: names the op, what TensorFlow found and
    what to check. ``original`` is TensorFlow's error. (Here, beside the ops it is about,
    rather than in ``errors``.)"""


def _replicas() -> tf.distribute.ReplicaContext | None:
    """The replica context of a step on several replicas; ``None`` on one device."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context


def all_gather(x):
    """Every replica's ``x`` (a tensor or a structure of them) concatenated along axis 0
    in replica order; ``x`` itself on one device. TensorFlow's gather has a gradient:
    each replica receives the gradient of its own rows, summed over every replica's loss."""
    context = _replicas()
    return x if context is None else context.all_gather(x, axis=0)


def batch_offset(batch: Mapping[str, tf.Tensor] | None) -> tf.Tensor:
    """The row of the global batch where this replica's rows of ``batch`` start, as an
    int32 scalar (0 on one device): ``all_gather(x)[offset : offset + n]`` is ``x``."""
    if _replicas() is None:
        return tf.constant(0, tf.int32)
    if not batch:
        raise BeatloopError(
            "models.batch_offset was read where there is no batch (outside a loss or a "
            "group's forward); read it in the loss whose batch it locates"
        )
    return tf.cast(batch_share(leading_dimension(batch)).offset, tf.int32)


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
        "dtype and the same shape but for axis 0: a replica's batch is its share of the "
        "global batch, of static shape (None, ...), and shares may differ by a row, so "
        "gather per-example rows (embeddings), not a tensor with another dimension of the "
        "replica's batch size. TensorFlow's collective ops stay aborted in this process "
        "after such a failure: start a new one to run again."
    )
    found.original = error
    return found
