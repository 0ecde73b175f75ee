"""The ``tfrecord`` source kind: sharded files of serialized ``tf.train.Example`` records
(``--data tfrecord:data/train-*.tfrecord``), streamed through the shared pipeline
(``beatloop.sources.stream``), never read into memory whole.

At load time every file is scanned once (in TensorFlow's C++ reader, a batch of records
at a time): its record count, which gives each record its index in the whole data (the
file's offset plus its place in the file), and its first record, checked against the
feature spec (inferred from the first file's first record unless given by hand,
``beatloop.sources.example_spec``). A file that is not a TFRecord file, is cut short or whose
first record does not match is a ``DataError`` naming it. Training reads the files
interleaved, deterministically, so a pass is the same on every run and an interrupted
run resumes exactly; under a multi-worker strategy every worker reads every file and
keeps its part of each global batch, so the batches are one device's (``shard=file``
gives each worker whole files of its own instead).
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import attrs
import numpy as np

from beatloop import ConfigError, DataError, DataSource, DataSplit
from beatloop.sources.example_spec import (
    FeatureSpec,
    SpecError,
    check_record,
    infer_spec,
    parse_batch,
    parse_spec,
    spec_text,
    with_image_shapes,
)
from beatloop.sources.folder import SCALES, op_reason
from beatloop.sources.stream import StreamConfig, held_count, stream_batches, stream_split

#: Feature names that become ``x`` and ``y`` when no feature has that name.
ALIASES = {
    "x": ("image", "img", "image_raw", "pixels"),
    "y": ("label", "labels", "target", "class"),
}
#: Records per batch of the load-time scan.
_SCAN_BATCH = 1024
#: The most records, and about the most bytes of parsed values, one parse call makes.
_PARSE_ROWS = 512
_PARSE_BYTES = 8 << 20


def _positive(instance, attribute, value) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


@attrs.frozen
class TfrecordConfig(StreamConfig):
    """``features``: the feature spec, NAME=KIND[:SHAPE] items (KIND int64, float32,
    bytes or png/jpeg/image; e.g. image=png,label=int64 or x=float32:64; by default
    inferred from the first record); ``keys``: FEATURE:KEY items naming the batch key of
    a feature (by default its own name, image/img/image_raw/pixels become x and
    label/labels/target/class y; a path x/NAME makes x a dict of named features, a
    model's named inputs); ``validation_files``: a glob of the files, or the
    fraction of files (drawn by the seed), held out as validation data;
    ``value_range``: decoded images' pixels in [0, 1] (unit), [-1, 1] (signed) or
    [0, 255] (raw); ``compression``: '' or GZIP (or ZLIB); ``cycle_length``: files read
    at a time, a record from each in turn (1: one file after another);
    ``parallel_reads``: read those files in threads of their own (for slow storage; on a
    local disk it costs more CPU than it saves); ``shuffle_buffer``: the examples the
    training shuffle draws from (memory is bounded by it); ``shard``: how a multi-worker
    run splits the records: ``data`` (every worker reads every file and takes its part of
    each global batch: the batches one device takes) or ``file`` (each worker reads whole
    files of its own: a worker's share of the reading, but other global batches than one
    device's, which a ReproducibilityWarning says)."""

    features: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    validation_files: str = ""
    value_range: Literal["unit", "signed", "raw"] = attrs.field(
        default="unit", validator=attrs.validators.in_(tuple(SCALES))
    )
    compression: Literal["", "GZIP", "ZLIB"] = attrs.field(
        default="", validator=attrs.validators.in_(("", "GZIP", "ZLIB"))
    )
    cycle_length: int = attrs.field(default=4, validator=_positive)
    parallel_reads: bool = False
    shard: Literal["data", "file"] = attrs.field(
        default="data", validator=attrs.validators.in_(("data", "file"))
    )


@attrs.frozen
class Shard:
    """One scanned file: its path, record count, offset (the records before it in the
    whole data) and first record (``b""`` when it has none)."""

    path: str
    count: int
    offset: int
    first: bytes


class TfrecordSource(DataSource):
    """TFRecord files of tf.train.Example records (a glob): one batch key per feature
    (int64 as int32, float32, PNG/JPEG bytes decoded to float32 images), streamed."""

    name = "tfrecord"
    Config = TfrecordConfig
    #: What the last ``load`` found (the spec, feature -> batch key), for ``hint``.
    _found: tuple | None = None
    _skipped: tuple[str, ...] = ()

    def load(self, seed: int, batch_size: int) -> DataSplit:
        config = self.config
        train_paths, validation_paths = self._split_files(seed)
        train = self._scan(train_paths)
        validation = self._scan(validation_paths) if validation_paths else []
        spec = self._spec(train + validation)
        keys = self._keys(spec)
        self._found = (spec, keys)
        parse = parse_batch(spec, keys, SCALES[config.value_range])
        rows = _parse_rows(spec)
        if not validation_paths:
            count = sum(shard.count for shard in train)
            records = self._records(train, indexed=bool(config.validation_fraction))
            split = stream_split(records, count, parse, config, seed, batch_size, self.label, rows)
            return DataSplit(
                _sharded(split.train, train, config.shard),
                _sharded(split.validation, train, config.shard),
            )
        parts = []
        for shards, shuffle_seed in ((train, seed if config.shuffle else None), (validation, None)):
            count = sum(shard.count for shard in shards)
            held_count(count, 0.0, self.label)
            records = self._records(shards, indexed=False)
            buffer = config.shuffle_buffer
            batches = stream_batches(records, count, parse, batch_size, shuffle_seed, buffer, rows)
            parts.append(_sharded(batches, shards, config.shard))
        return DataSplit(*parts)

    # --- files ----------------------------------------------------------------------

    def files(self) -> list[Path]:
        """Every file the glob matches, and those a ``validation_files`` glob does."""
        patterns = [self.path]
        held = self.config.validation_files.strip()
        try:
            float(held or "0")
        except ValueError:
            patterns.append(held)
        found = {p for pattern in patterns for p in glob.glob(pattern, recursive=True)}
        return sorted(Path(p) for p in found if os.path.isfile(p))

    def _files(self, pattern: str, what: str) -> list[str]:
        paths = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not paths:
            raise DataError(
                f"data source {self.label!r}: {what} {pattern!r} matches no file; give the "
                "TFRecord files as a glob, e.g. --data 'tfrecord:data/train-*.tfrecord'"
            )
        return paths

    def _split_files(self, seed: int) -> tuple[list[str], list[str]]:
        """The training files and those ``validation_files`` holds out (by glob or
        fraction); ``[]`` for the latter when it is not set."""
        paths = self._files(self.path, "the glob")
        held = self.config.validation_files.strip()
        if not held:
            return paths, []
        if self.config.validation_fraction:
            raise ConfigError(
                f"data source {self.label!r}: --data-set validation_files={held} and "
                f"validation_fraction={self.config.validation_fraction} both hold out "
                "validation data; use one"
            )
        try:
            fraction = float(held)
        except ValueError:
            chosen = set(self._files(held, "validation_files"))
        else:
            chosen = set(self._fraction_of_files(paths, fraction, seed))
        train = [path for path in paths if path not in chosen]
        if not train:
            raise DataError(
                f"data source {self.label!r}: validation_files={held} holds out every one of "
                f"its {len(paths)} file(s); training needs some"
            )
        return train, sorted(chosen)

    def _fraction_of_files(self, paths: list[str], fraction: float, seed: int) -> list[str]:
        held = round(len(paths) * fraction)
        if not 0 < fraction < 1 or not 0 < held < len(paths):
            raise DataError(
                f"data source {self.label!r}: validation_files={fraction} of {len(paths)} "
                f"file(s) holds out {held}; it must leave files on both sides (a fraction in "
                "(0, 1), or a glob of the validation files)"
            )
        order = np.random.default_rng(seed).permutation(len(paths))
        return [paths[index] for index in order[:held]]

    def _scan(self, paths: Sequence[str]) -> list[Shard]:
        """Each file's record count, offset and first record; a ``DataError`` naming the
        first file that is not a readable TFRecord file."""
        import tensorflow as tf

        shards, offset = [], 0
        for path in paths:
            try:
                count, first = _count(path, self.config.compression)
            except tf.errors.OpError as error:
                raise self._unreadable(path, error) from None
            shards.append(Shard(path, count, offset, first))
            offset += count
        return shards

    def _unreadable(self, path: str, error) -> DataError:
        """The ``DataError`` for a file TensorFlow's reader stopped in: truncated (its last
        record cut short) or corrupt (a record failing its checksum) at a byte offset
        when TensorFlow says so, else not a TFRecord file at all, in TensorFlow's words."""
        damage = re.search(r"\b(truncated|corrupted) record at (\d+)", str(error))
        start = f"data source {self.label!r}: the file {path!r}"
        if damage and damage[1] == "truncated":
            return DataError(
                f"{start} is truncated: its record at byte {damage[2]} is cut short (the file "
                "was not written to its end); write the file again, or remove it"
            )
        if damage and damage[2] != "0":
            return DataError(
                f"{start} is corrupt at byte {damage[2]} (a record there fails its checksum); "
                "write the file again, or remove it"
            )
        return DataError(
            f"{start} is not a readable TFRecord file{self._compression_words()}: "
            f"{op_reason(error)}; replace or remove it (a compressed file needs --data-set "
            "compression=GZIP)"
        )

    def _compression_words(self) -> str:
        compression = self.config.compression
        return f" (compression={compression})" if compression else ""

    # --- spec and keys --------------------------------------------------------------

    def _spec(self, shards: Sequence[Shard]) -> tuple[FeatureSpec, ...]:
        """The spec given or inferred from the first record, checked against every
        file's first record (a ``DataError`` naming the file and the feature)."""
        filled = [shard for shard in shards if shard.count]
        if not filled:
            raise DataError(f"data source {self.label!r}: its files hold no records")
        given = self.config.features
        try:
            spec = parse_spec(given) if given else None
        except SpecError as error:
            raise ConfigError(f"data source {self.label!r}: --data-set {error}") from None
        for shard in filled:
            try:
                if spec is None:
                    spec, skipped = infer_spec(shard.first)
                    self._skipped = tuple(skipped)
                elif any(feature.shape is None for feature in spec):
                    spec = with_image_shapes(spec, shard.first)
                check_record(spec, shard.first)
            except SpecError as error:
                raise DataError(
                    f"data source {self.label!r}: the first record of the file "
                    f"{shard.path!r} does not fit the feature spec "
                    f"{spec_text(spec) if spec else '(none yet)'}: {error}"
                ) from None
        if not spec:
            raise DataError(
                f"data source {self.label!r}: its records hold no feature a model can take "
                f"(bytes features left out: {list(self._skipped)})"
            )
        return spec

    def _keys(self, spec: Sequence[FeatureSpec]) -> dict[str, str]:
        """Feature name -> batch key: ``keys`` given, then the aliases of ``x`` and
        ``y`` for a feature alone in taking that name; the others keep their names."""
        names = [feature.name for feature in spec]
        mapping = {}
        for item in self.config.keys:
            feature, sep, key = (part.strip() for part in item.partition(":"))
            if not sep or not feature or not key:
                raise ConfigError(
                    f"data source {self.label!r}: --data-set keys expects FEATURE:KEY items "
                    f"(e.g. keys=image:x,label:y), got {item!r}"
                )
            if feature not in names:
                raise DataError(
                    f"data source {self.label!r}: keys names the feature {feature!r}; the "
                    f"records have {names}"
                )
            mapping[feature] = key
        for key, aliases in ALIASES.items():
            taken = set(mapping.values()) | {name for name in names if name not in mapping}
            taken |= {value.split("/")[0] for value in mapping.values()}  # x/NAME: x's
            found = [name for name in names if name in aliases and name not in mapping]
            if key not in taken and len(found) == 1:
                mapping[found[0]] = key
        batch_keys = [mapping.get(name, name) for name in names]
        if len(set(batch_keys)) != len(batch_keys):
            raise ConfigError(
                f"data source {self.label!r}: --data-set keys gives two features one batch "
                f"key: {dict(zip(names, batch_keys, strict=True))}"
            )
        return mapping

    def hint(self, missing: Sequence[str]) -> str:
        if self._found is None:
            return ""
        spec, keys = self._found
        unmapped = [feature.name for feature in spec if feature.name not in keys]
        example = ",".join(f"{name}:{key}" for name, key in zip(unmapped, missing, strict=False))
        return (
            f"; the records' features are {spec_text(spec)}: name the batch keys of "
            f"features with --data-set keys=FEATURE:KEY (e.g. keys={example or 'image:x'})"
        )

    # --- the pipeline ---------------------------------------------------------------

    def _records(self, shards: Sequence[Shard], indexed: bool):
        """Every record in ``shards``, as ``(index, record)`` pairs when ``indexed`` (for
        a hold-out by record; the index costs as much as reading), the files read
        ``cycle_length`` at a time, a record from each in turn (deterministic)."""
        import tensorflow as tf

        compression = self.config.compression
        paths = tf.constant([shard.path for shard in shards])
        offsets = tf.constant([shard.offset for shard in shards], tf.int64)

        def read(path, offset):
            records = tf.data.TFRecordDataset(path, compression)
            if not indexed:
                return records
            indices = tf.data.Dataset.range(offset, np.iinfo(np.int64).max)
            return tf.data.Dataset.zip((indices, records))

        cycle = min(self.config.cycle_length, len(shards))
        threads = cycle if self.config.parallel_reads else None
        return tf.data.Dataset.from_tensor_slices((paths, offsets)).interleave(
            read, cycle_length=cycle, block_length=1, num_parallel_calls=threads,
            deterministic=True if threads else None,
        )  # fmt: skip


def _parse_rows(spec: Sequence[FeatureSpec]) -> int:
    """Records per parse call: ``_PARSE_ROWS``, fewer when their parsed values would
    pass ``_PARSE_BYTES`` (large images)."""
    import math

    example_bytes = sum(4 * math.prod(feature.shape or (1,)) for feature in spec)
    return max(1, min(_PARSE_ROWS, _PARSE_BYTES // max(example_bytes, 1)))


def _count(path: str, compression: str) -> tuple[int, bytes]:
    """A file's record count and first record (``b""`` when it has none), read a batch
    of records at a time by TensorFlow's reader."""
    import tensorflow as tf

    count, first = 0, b""
    for batch in tf.data.TFRecordDataset(path, compression).batch(_SCAN_BATCH):
        if not count:
            first = batch[0].numpy()
        count += int(batch.shape[0])
    return count, first


def _sharded(dataset, shards: Sequence[Shard], shard: str):
    """``dataset`` as a multi-worker strategy splits it: by data (every worker reads every
    file and keeps its part of each global batch: one device's batches), or with
    ``shard="file"`` by file (tf.distribute's FILE auto-shard: each worker reads whole
    files of its own) when there are at least as many files as workers (FILE sharding
    would fail with fewer: by data then)."""
    if dataset is None:
        return None
    import tensorflow as tf

    by_file = shard == "file" and len(shards) >= _workers()
    policy = tf.data.experimental.AutoShardPolicy
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy.FILE if by_file else policy.DATA
    return dataset.with_options(options)


def _workers() -> int:
    """How many workers ``TF_CONFIG`` names (chief included); 1 without one."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    except (ValueError, AttributeError):
        return 1
    return max(1, len(cluster.get("worker", [])) + len(cluster.get("chief", [])))
