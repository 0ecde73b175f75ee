"""Streamed sources' shared pipeline: records read from files in order, held out for
validation by a seeded index permutation, shuffled in a bounded buffer, batched, then
parsed a batch at a time in parallel; nothing is read into memory whole.

A streamed source (``csv``, ``parquet``, ``tfds``, ``tfrecord``) hands ``stream_split`` a
data set of ``(index, record)`` pairs: ``index`` the record's position in the whole data (int64,
the same on every worker whichever files it reads), ``record`` a scalar string (a CSV
line, a serialized ``tf.train.Example``), a vector (a Parquet row) or a dict of tensors (a
TFDS example), and a ``parse`` function making a batch of
records into a dict batch. Membership of the validation split depends on the index and
the seed alone (``tf.random.experimental.index_shuffle``), so it needs no memory per
example and is the same after a resume or under any sharding.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import tensorflow as tf

from beatloop import DataError, DataSplit, SourceConfig

#: Records per chunk when the held-out ones are picked out (vectorised, not per record).
_CHUNK = 4096

Parse = Callable[[tf.Tensor], dict]


def _positive(instance, attribute, value) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


@attrs.frozen
class StreamConfig(SourceConfig):
    """``shuffle_buffer``: how many examples the training shuffle draws from (memory is
    bounded by it; a buffer at least as large as the data shuffles it uniformly, as the
    in-memory sources do)."""

    shuffle_buffer: int = attrs.field(default=10_000, validator=_positive)


def held_count(count: int, fraction: float, label: str) -> int:
    """How many of ``count`` examples ``fraction`` holds out; a ``DataError`` when
    either side would be empty."""
    if count == 0:
        raise DataError(f"data source {label!r}: it holds no examples")
    held = round(count * fraction)
    if fraction and not 0 < held < count:
        raise DataError(
            f"data source {label!r}: validation_fraction={fraction} of {count} example(s) "
            f"leaves {count - held} for training and {held} for validation; both need some"
        )
    return held


def held_out(
    records: tf.data.Dataset, count: int, held: int, seed: int
) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """``(training, validation)`` records of ``(index, record)`` pairs: the record at
    ``index`` is held out when the seed's permutation of ``0..count-1`` maps it below
    ``held`` (exactly ``held`` of them)."""
    key = tf.constant([seed % 2**63, 0x62656174], tf.int64)  # the second word: "beat"

    def side(validation: bool) -> tf.data.Dataset:
        def pick(index, record):
            place = tf.random.experimental.index_shuffle(index, key, count - 1)
            chosen = place < held if validation else place >= held
            kept = tf.nest.map_structure(lambda part: tf.boolean_mask(part, chosen), record)
            return tf.boolean_mask(index, chosen), kept

        return records.batch(_CHUNK).map(pick).unbatch()

    return side(False), side(True)


def stream_batches(
    records: tf.data.Dataset,
    count: int,
    parse: Parse,
    batch_size: int,
    shuffle_seed: int | None = None,
    shuffle_buffer: int = 10_000,
    parse_rows: int | None = None,
) -> tf.data.Dataset:
    """``count`` records (``(index, record)`` pairs, or records alone: a source that holds
    nothing out by record need not index them) as parsed dict batches: shuffled in
    a buffer of ``min(shuffle_buffer, count)`` by ``shuffle_seed`` each pass (when
    given), batched with the short last batch kept, parsed in parallel in order,
    prefetched; its cardinality is the batch count. ``parse_rows``: records parsed per
    call (rounded down to whole batches, then cut into batches: the same batches, fewer
    calls of a parse whose cost is mostly per call, as ``tf.io.parse_example``'s is)."""
    dataset = records
    if shuffle_seed is not None:
        dataset = dataset.shuffle(
            min(shuffle_buffer, count), seed=shuffle_seed, reshuffle_each_iteration=True
        )
    rows = max(1, (parse_rows or batch_size) // batch_size) * batch_size
    dataset = dataset.batch(rows)
    paired = isinstance(records.element_spec, tuple)
    parse_batch = (lambda index, record: parse(record)) if paired else parse
    dataset = dataset.map(parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if rows != batch_size:
        dataset = dataset.rebatch(batch_size)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(-(-count // batch_size)))
    return dataset.prefetch(tf.data.AUTOTUNE)


def stream_split(
    records: tf.data.Dataset,
    count: int,
    parse: Parse,
    config: StreamConfig,
    seed: int,
    batch_size: int,
    label: str,
    parse_rows: int | None = None,
) -> DataSplit:
    """A streamed source's ``DataSplit``: ``config.validation_fraction`` of the ``count``
    records held out by ``seed`` (``held_out``), the training records shuffled by
    ``seed`` each pass when ``config.shuffle``, both batched and parsed (``parse_rows``
    at a time, see ``stream_batches``)."""
    held = held_count(count, config.validation_fraction, label)
    shuffle_seed = seed if config.shuffle else None
    buffer = config.shuffle_buffer
    if not held:
        return DataSplit(
            stream_batches(records, count, parse, batch_size, shuffle_seed, buffer, parse_rows)
        )
    train, validation = held_out(records, count, held, seed)
    return DataSplit(
        stream_batches(train, count - held, parse, batch_size, shuffle_seed, buffer, parse_rows),
        stream_batches(validation, held, parse, batch_size, parse_rows=parse_rows),
    )


def sharded_by_data(dataset):
    """``dataset`` sharded by example under a multi-worker strategy (``csv``, ``parquet``,
    ``tfds``: sharding by file would leave a worker without data when files are few)."""
    if dataset is None:
        return None
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)
