"""How the data are split across replicas and workers so that every step's global batch is
the one a single device takes, and the one warning where that cannot hold.

Measured with TensorFlow 2.21 (``tests/test_data_order.py``): on one worker
(``MirroredStrategy``) ``experimental_distribute_dataset`` cuts each global batch into
replica parts and shares the data set's shuffle seed generator (its passes continue the
original's reshuffles), so a seeded source keeps its order. Across workers tf.data's
auto-shard decides: ``DATA`` has every worker run the whole pipeline and keep its parts of
each global batch (one device's batches, when every worker draws the same order: a seeded
shuffle); ``FILE`` gives each worker files of its own, so no step's batch is one device's.
``AUTO`` picks ``FILE`` for a pipeline reading files, so a data set left on ``AUTO`` is
sharded by ``DATA`` here; one set to ``FILE`` (``tfrecord``'s ``shard=file``), ``OFF`` or
``HINT`` is kept, with a ``ReproducibilityWarning``.
"""

from __future__ import annotations

import warnings

import tensorflow as tf
from tensorflow.python.data.ops import shuffle_op

from beatloop.core.data.batches import pipeline
from beatloop.core.devices.workers import worker_of
from beatloop.core.failures.errors import ReproducibilityWarning

_POLICY = tf.data.experimental.AutoShardPolicy


def as_one_device(strategy: tf.distribute.Strategy | None, dataset: tf.data.Dataset | None):
    """``dataset`` sharded by data under several workers when its auto-shard policy is
    left on ``AUTO`` (each worker keeps its parts of the global batches one device would
    take); as it is otherwise."""
    if dataset is None or worker_of(strategy).count == 1 or _policy(dataset) != _POLICY.AUTO:
        return dataset
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = _POLICY.DATA
    return dataset.with_options(options)


def order_problems(strategy: tf.distribute.Strategy | None, dataset: tf.data.Dataset) -> list[str]:
    """Why the workers' global batches of ``dataset`` (as ``as_one_device`` leaves it)
    cannot be one device's: none on one worker."""
    workers = worker_of(strategy).count
    if workers == 1:
        return []
    problems = []
    policy = _policy(dataset)
    if policy not in (_POLICY.AUTO, _POLICY.DATA):
        problems.append(
            f"its auto-shard policy is {policy.name}: "
            + (
                "each worker reads files of its own, so every step's global batch is made "
                "of other examples than one device's"
                if policy == _POLICY.FILE
                else "the workers do not each take their part of one global batch"
            )
        )
    unseeded = unseeded_shuffles(dataset)
    if unseeded:
        problems.append(
            f"it shuffles without a seed ({unseeded} shuffle(s)): each worker draws its own "
            "order, so the workers' parts of a step are not one global batch and examples "
            "repeat or go missing within an epoch; give shuffle a seed"
        )
    return problems


def warn_if_not_one_device(
    strategy: tf.distribute.Strategy | None, dataset: tf.data.Dataset, label: str | None
) -> None:
    """One ``ReproducibilityWarning`` when the training data, split across workers,
    cannot give the global batches one device takes (``order_problems``)."""
    problems = order_problems(strategy, dataset)
    if not problems:
        return
    head = f"{label}: " if label else ""
    warnings.warn(
        f"{head}under {worker_of(strategy).count} workers the training data set cannot give "
        f"the global batches one device takes: {'; '.join(problems)}. The run trains, but "
        "not as on one device (see 'The same data on any number of devices' in "
        "docs/data-sources.md)",
        ReproducibilityWarning,
        stacklevel=2,
    )


def unseeded_shuffles(dataset: tf.data.Dataset) -> int:
    """How many shuffles in ``dataset``'s pipeline draw a new order in every process (no
    seed given and no global seed set when they were built); 0 when it cannot be read."""
    count = 0
    try:
        for current in pipeline(dataset):
            if isinstance(current, shuffle_op._ShuffleDataset):
                seeds = (tf.get_static_value(current._seed), tf.get_static_value(current._seed2))
                count += seeds == (0, 0)
    except Exception:  # a data set of a shape TensorFlow's private API does not show
        return 0
    return count


def _policy(dataset: tf.data.Dataset):
    return dataset.options().experimental_distribute.auto_shard_policy
