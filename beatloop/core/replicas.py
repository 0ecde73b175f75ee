"""What a step needs to know when it runs on several replicas (``tf.distribute``).

Each replica computes its beats on its share of the global batch. Its loss is weighted
by its share (``local / global`` examples), so the gradients the optimizer sums over
replicas are those of the mean over the global batch — what ``tf.nn.compute_average_loss``
does for per-example losses, here for the mean losses recipes return, regularisation
included (it is added once per replica, then weighted). Random draws are made once over
the global batch and split by rows, so a distributed run draws what one device would.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import tensorflow as tf


@attrs.frozen
class BatchShare:
    """This replica's part of the global batch: ``local`` rows from row ``offset`` of
    ``total``, as int64 tensors."""

    local: tf.Tensor
    total: tf.Tensor
    offset: tf.Tensor

    @property
    def weight(self) -> tf.Tensor:
        """The factor on this replica's mean loss: its fraction of the global batch."""
        return tf.cast(self.local, tf.float32) / tf.cast(self.total, tf.float32)


def splits_batches(strategy: tf.distribute.Strategy | None) -> bool:
    """Whether ``strategy`` cuts each global batch into one part per replica: a strategy
    of several replicas. A strategy of one replica takes whole batches, so its data are
    read as without a strategy (a plain iterator, passes of known length, the loop
    traced as a concrete function): a distributed data set's iterator made every step
    of a one-replica run about twice as slow (``benchmarks/strategy_overhead.py``)."""
    return strategy is not None and strategy.num_replicas_in_sync > 1


def on_replicas(strategy: tf.distribute.Strategy | None, fn: Callable, *args) -> tuple:
    """Run ``fn(*args)`` on one device, or on every replica of ``strategy`` and sum what
    it returns (batch sizes; checks, where a NaN or inf on any replica stays)."""
    if strategy is None:
        return fn(*args)
    per_replica = strategy.run(fn, args=args)
    return tuple(
        strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) for value in per_replica
    )


def replica_view(strategy, generator: tf.random.Generator, local: tf.Tensor):
    """``(share, random)`` for a step on ``local`` examples: on one device no share and
    the run's generator itself; on a replica its ``BatchShare`` and a
    ``ReplicaRandom`` over the generator. The one replica of a strategy that does not
    split batches has the whole batch: no share either (nothing to weight, gather or
    cut: the step's graph is the one-device step's, which a benchmark measures) and
    draws made whole, in cross-replica context."""
    if strategy is None:
        return None, generator
    if not splits_batches(strategy):
        return None, ReplicaRandom(generator, None)
    share = batch_share(local)
    return share, ReplicaRandom(generator, share)


def batch_share(local: tf.Tensor) -> BatchShare:
    """Every replica's batch size, gathered: this replica's share (call in a replica)."""
    context = tf.distribute.get_replica_context()
    sizes = context.all_gather(tf.reshape(local, [1]), axis=0)
    index = context.replica_id_in_sync_group
    offset = tf.reduce_sum(sizes[:index]) if isinstance(index, int) else _prefix(sizes, index)
    return BatchShare(local, tf.reduce_sum(sizes), offset)


def _prefix(sizes: tf.Tensor, index) -> tf.Tensor:
    before = tf.range(tf.shape(sizes, out_type=tf.int64)[0]) < tf.cast(index, tf.int64)
    return tf.reduce_sum(tf.where(before, sizes, tf.zeros_like(sizes)))


class ReplicaRandom:
    """The run's generator as one replica sees it: each draw is made once, over the
    global batch (in cross-replica context), and this replica takes its rows. The first
    dimension of a draw's shape must be the replica's batch size. Without a ``share``
    (the only replica) a draw is made as asked."""

    def __init__(self, generator: tf.random.Generator, share: BatchShare | None):
        self._generator = generator
        self._share = share

    def normal(self, shape, *args, **kwargs) -> tf.Tensor:
        return self._draw("normal", shape, *args, **kwargs)

    def uniform(self, shape, *args, **kwargs) -> tf.Tensor:
        return self._draw("uniform", shape, *args, **kwargs)

    def truncated_normal(self, shape, *args, **kwargs) -> tf.Tensor:
        return self._draw("truncated_normal", shape, *args, **kwargs)

    def _draw(self, method: str, shape, *args, **kwargs) -> tf.Tensor:
        share = self._share
        if share is None:  # the only replica: its batch is the global batch

            def draw_whole(strategy):
                return getattr(self._generator, method)(shape, *args, **kwargs)

            return tf.distribute.get_replica_context().merge_call(draw_whole)
        shape = tf.cast(tf.convert_to_tensor(shape), tf.int64)
        checked = tf.debugging.assert_equal(
            shape[0],
            share.local,
            message=f"under a distribution strategy, models.random.{method}(shape) must draw "
            "one row per example: shape[0] must be the replica's batch size",
        )
        with tf.control_dependencies([checked]):
            whole = tf.concat([tf.reshape(share.total, [1]), shape[1:]], axis=0)

        def draw(strategy, whole):
            shape = strategy.experimental_local_results(whole)[0]  # the same in every replica
            return getattr(self._generator, method)(shape, *args, **kwargs)

        drawn = tf.distribute.get_replica_context().merge_call(draw, args=(whole,))
        return drawn[share.offset : share.offset + share.local]
