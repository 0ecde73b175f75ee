"""What a step needs to know when it runs on several replicas (``tf.distribute``).

Each replica computes its beats on its share of the global batch. Its loss is weighted
by its share (``local / global`` examples), so the gradients the optimizer sums over
replicas are those of the mean over the global batch — what ``tf.nn.compute_average_loss``
does for per-example losses, here for the mean losses recipes return, regularisation
included (it is added once per replica, then weighted). Random draws are made once over
the global batch and split by rows, so a distributed run draws what one device would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs
import tensorflow as tf

from beatloop.core.failures.errors import BeatloopError


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
    dimension of a draw's shape must be the replica's batch size (the data's, or that
    of the loss's own batch: ``own_batch``). Without a ``share`` (the only replica) a
    draw is made as asked.

    ``own`` lists the own batches declared through it (``own_batch``), in order: the
    step weights an entry whose losses declared one by its share of it."""

    def __init__(
        self, generator: tf.random.Generator, share: BatchShare | None, what: str = "batch"
    ):
        self._generator = generator
        self._share = share
        self._what = what
        self.own: list[BatchShare] = []

    def own_batch(self, rows) -> OwnBatch:
        """This replica's share of a batch of ``rows`` rows the loss makes itself,
        split as a data set's batch is (the first ``rows % replicas`` replicas take one
        more row), declared (``own``) so the step weights the loss by it. The only
        replica takes the whole batch, as one device does."""
        if self._share is None:
            return OwnBatch(rows, 0, rows, self)
        share = split_rows(rows)
        self.own.append(share)
        random = ReplicaRandom(self._generator, share, what="own batch")
        return OwnBatch(share.local, share.offset, share.total, random, whole=False)

    def normal(self, shape, *args, **kwargs) -> tf.Tensor:
        return self._draw("normal", shape, *args, **kwargs)

    def uniform(self, shape, *args, **kwargs) -> tf.Tensor:
        return self._draw("uniform", shape, *args, **kwargs)

    def truncated_normal(self, shape, *args, **kwargs) -> tf.Tensor:
        return self._draw("truncated_normal", shape, *args, **kwargs)

    def make_seeds(self, count: int = 1) -> tf.Tensor:
        """``count`` seed pairs for stateless random ops (``[2, count]`` int64), as
        ``tf.random.Generator.make_seeds``: the seeds one device would make, the same on
        every replica (a stateless draw from them over a replica's rows is not one
        device's rows: draw those with ``normal`` or ``uniform``)."""
        return self._whole("make_seeds", count)

    def __getattr__(self, name: str):
        """A generator method the view lacks: an error naming those it has."""
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"under a distribution strategy models.random draws through a replica's view of "
            f"the run's generator, which has normal, uniform, truncated_normal (each made "
            f"once over the global batch, this replica's rows taken), make_seeds and "
            f"own_batch; it has no {name!r}"
        )

    def _draw(self, method: str, shape, *args, **kwargs) -> tf.Tensor:
        share = self._share
        if share is None:  # the only replica: its batch is the global batch
            return self._whole(method, shape, *args, **kwargs)
        shape = tf.cast(tf.convert_to_tensor(shape), tf.int64)
        if shape.shape.rank != 1 or shape.shape[0] == 0:
            raise BeatloopError(
                f"under a distribution strategy, models.random.{method}({_shown(shape)}) in a "
                "loss draws no rows: each draw is made once over the global batch and split "
                "by rows, so its shape starts with the replica's batch size. Draw a "
                "scalar in an Act (it runs once a step for all replicas, with the run's "
                "generator), or draw rows of a batch the loss makes itself: "
                "sample = models.own_batch(n); sample.random.uniform([sample.size])"
            )
        checked = tf.debugging.assert_equal(
            shape[0],
            share.local,
            message=f"under a distribution strategy, models.random.{method}(shape) must draw "
            f"one row per example: shape[0] must be the replica's {self._what} size (for a "
            "batch the loss makes itself, such as a buffer sample, draw with "
            "models.own_batch(n).random)",
        )
        with tf.control_dependencies([checked]):
            whole = tf.concat([tf.reshape(share.total, [1]), shape[1:]], axis=0)
        drawn = self._whole(method, whole, *args, **kwargs)
        return drawn[share.offset : share.offset + share.local]

    def _whole(self, method: str, shape, *args, **kwargs) -> tf.Tensor:
        """The draw one device makes, made on this replica: each replica reads and
        advances its own copy of the generator's state (the copies stay equal), and
        TensorFlow's mixing of the replica's number into the key (which makes replicas
        draw apart) is left out, so every replica draws one device's numbers. No
        ``merge_call``: TensorFlow refuses one inside a conditional (a beat's ``every``).
        Replicas trace one at a time, so the key's mixing is off for this draw alone."""
        generator = self._generator
        generator._preprocess_key = _unmixed  # shadows the method for this draw
        try:
            return getattr(generator, method)(shape, *args, **kwargs)
        finally:
            del generator._preprocess_key


def _unmixed(key: tf.Tensor) -> tf.Tensor:
    """A generator's key as one device uses it (``Generator._preprocess_key`` mixes in
    the replica's number under a strategy)."""
    return key


def _shown(shape: tf.Tensor) -> str:
    static = tf.get_static_value(shape)
    return "shape" if static is None else str(list(static))


def _static(value) -> int | None:
    found = tf.get_static_value(value)
    return None if found is None else int(found)


def split_rows(rows) -> BatchShare:
    """This replica's part of ``rows`` rows (a Python int or an integer tensor), split as
    a data set's batch is: ``rows // n`` each, one more for the first ``rows % n``
    replicas (call in a replica)."""
    context = tf.distribute.get_replica_context()
    count, index = context.num_replicas_in_sync, context.replica_id_in_sync_group
    if isinstance(rows, int) and isinstance(index, int):
        base, extra = divmod(rows, count)
        local, offset = base + (index < extra), index * base + min(index, extra)
    else:
        rows = tf.cast(rows, tf.int64)
        base, extra = rows // count, rows % count
        index = tf.cast(index, tf.int64)
        local = base + tf.cast(index < extra, tf.int64)
        offset = index * base + tf.minimum(index, extra)
    as_int64 = lambda value: tf.cast(value, tf.int64)  # noqa: E731
    return BatchShare(as_int64(local), as_int64(rows), as_int64(offset))


@attrs.frozen
class OwnBatch:
    """A batch of ``total`` rows a loss makes itself rather than takes from the data (a
    minibatch sampled from a replay buffer in recipe state), and this replica's part of
    it: ``size`` rows from row ``offset``. ``random`` draws from the run's generator,
    each draw made once over all ``total`` rows, and gives this replica's rows (its
    shape starts with ``size``); ``take(x)`` is this replica's rows of an ``x`` of
    ``total`` rows. On one device it is the whole batch: ``size`` is ``total`` as given,
    ``random`` the run's generator itself, ``take`` the identity (``whole``)."""

    size: int | tf.Tensor
    offset: int | tf.Tensor
    total: int | tf.Tensor
    random: tf.random.Generator | ReplicaRandom
    whole: bool = True

    @classmethod
    def of_one_device(cls, rows, generator) -> OwnBatch:
        return cls(rows, 0, rows, generator)

    def take(self, x):
        """This replica's rows of ``x`` (a tensor or a structure of them, of ``total``
        rows each): ``x`` itself on one device."""
        if self.whole:
            return x
        return tf.nest.map_structure(lambda t: t[self.offset : self.offset + self.size], x)


def declared(random) -> int:
    """How many own batches ``random`` (a step's generator view) has had declared."""
    return len(random.own) if isinstance(random, ReplicaRandom) else 0


def entry_weight(random, since: int, weight, where: str):
    """The weight of an entry's losses on this replica: ``weight`` (its share of the
    data batch), or, when its losses or forward declared an own batch after the first
    ``since`` (``models.own_batch``), its share of that batch. The declarations of one
    entry must agree on the batch's size, else a ``BeatloopError`` naming ``where``."""
    if declared(random) == since:
        return weight
    shares = random.own[since:]
    totals = {_static(share.total) for share in shares}
    if len(totals) > 1 and None not in totals:
        raise BeatloopError(
            f"{where} declares own batches of {sorted(totals)} rows (models.own_batch): "
            "the losses of one entry are weighted by one share on each replica, so "
            "declare one size (the entry's losses each take their rows of it)"
        )
    return shares[-1].weight


def figure_size(size, share: BatchShare | None, weight, own_weight):
    """The weight a loss's figure enters its mean with: the replica's rows of the data
    batch, or for an entry with an own batch its share of the data batch's rows (its
    loss is the mean over its share of the own batch)."""
    if share is None or own_weight is weight:
        return size
    return tf.cast(own_weight, tf.float32) * tf.cast(share.total, tf.float32)


def once_per_step(
    state: Mapping[str, tf.Variable], fn: Callable, batch, step: tf.Tensor, every: int = 1
) -> None:
    """From inside a replica of the step: ``fn(global_batch, state)`` once for all
    replicas, in cross-replica context (``merge_call``), on the steps ``every``
    selects (``step`` is the step's number). ``fn`` gets the recipe's ``state`` as
    the first replica's copies, plain variables (so slices assign as on one device),
    and what it wrote is then copied to every other replica's copy: the state stays
    one agent's, the same on every replica. Random draws in ``fn`` use the run's
    generator directly, as on one device."""
    context = tf.distribute.get_replica_context()

    def merged(strategy, batch, step):
        whole = global_batch(strategy, batch)
        step = strategy.experimental_local_results(step)[0]
        own = {name: strategy.experimental_local_results(v)[0] for name, v in state.items()}

        def run():
            fn(whole, own)
            mirror(strategy, state)
            return tf.constant(0)

        if every == 1:
            run()
        else:
            tf.cond(tf.equal(step % every, 0), run, lambda: tf.constant(0))

    context.merge_call(merged, args=(batch, step))


def global_batch(strategy: tf.distribute.Strategy, batch):
    """The global batch from every replica's part (cross-replica context): the local
    parts concatenated in replica order; with replicas on other workers, the batch the
    step gathered already (``models.all_gather``), the same on every local replica."""
    parts = strategy.experimental_local_results(batch)
    if len(parts) != strategy.num_replicas_in_sync:
        return parts[0]
    return tf.nest.map_structure(lambda *rows: tf.concat(rows, axis=0), *parts)


def mirror(strategy: tf.distribute.Strategy, state: Mapping[str, tf.Variable]) -> None:
    """Each state variable's first local copy assigned to its other local copies."""
    for variable in state.values():
        first, *others = strategy.experimental_local_results(variable)
        for other in others:
            other.assign(first.read_value())
