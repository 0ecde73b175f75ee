"""The ``parquet`` source kind: Parquet files (``--data parquet:data/part-*.parquet``, a
file, a glob or a folder), streamed a batch of rows at a time through the shared pipeline
(``beatloop.sources.stream``), never read into memory whole.

Columns are chosen as ``csv`` chooses them (``beatloop.sources.columns``): ``label``,
``keys``, ``features``. Loading reads every file's footer (its schema and row count) and
then the chosen columns once, a row group at a time, to check what the schema cannot
say: no nulls, list columns of one length, integers within int32. A file that does not
open, a missing column, a column of another type, nulls or ragged lists are one
``DataError`` naming the file and the column, before the first step. Training reads the
files in sorted order, each row's chosen columns as one float64 vector (as ``csv``
decodes its values), so the hold-out, the bounded shuffle and the batches are the ones
``csv`` makes of the same table. ``pyarrow`` is imported only here, on load: the
``parquet`` extra.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from beatloop import ConfigError, DataError, DataSource, DataSplit
from beatloop.datasets import replayable
from beatloop.sources.columns import batch_columns, feature_columns
from beatloop.sources.stream import StreamConfig, sharded_by_data, stream_split

#: Rows read from a file at a time (a row group is read whole at most).
_READ_ROWS = 8192
_INT32 = (-(2**31), 2**31 - 1)


@attrs.frozen
class ParquetConfig(StreamConfig):
    """``label``: the column that becomes ``y`` (none by default); ``keys``: columns that
    become batch keys of their own name, or ``COLUMN:KEY`` items naming the key (a path
    ``x/NAME`` makes ``x`` a dict of named columns); ``features``: the columns gathered
    into ``x`` (by default every other column; a list column gives as many features as
    its lists hold); ``shuffle_buffer``: the rows the training shuffle draws from (the
    files are streamed: memory is bounded by it and one row group)."""

    label: str | None = None
    keys: tuple[str, ...] = ()
    features: tuple[str, ...] = ()


@attrs.frozen
class Column:
    """A chosen column as every file has it: its name, values per row (1, or a list's
    length) and whether its values are whole numbers within int32 (they become int32)."""

    name: str
    width: int
    whole: bool
    is_list: bool
    type: str = ""


@attrs.frozen
class Part:
    """One file: its path, row count and offset (the rows before it in the whole data)."""

    path: str
    count: int
    offset: int


def _pyarrow(label: str):
    """``pyarrow.parquet``, or a ``ConfigError`` naming the extra that brings it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f"data source {label!r}: reading Parquet needs pyarrow, which comes with the "
            'parquet extra: pip install "beatloop[parquet]"'
        ) from None
    return pq


class ParquetSource(DataSource):
    """Parquet files (a file, a glob or a folder), streamed a batch of rows at a time: batches
    {x} (float32, (n, features)), plus y (the label column) and any columns named in keys,
    as csv gives them; list columns of one length are fixed-size features."""

    name = "parquet"
    Config = ParquetConfig

    def load(self, seed: int, batch_size: int) -> DataSplit:
        pq = _pyarrow(self.label)
        paths = self._paths()
        schemas = [self._open(pq, path).schema_arrow for path in paths]
        features = feature_columns(
            self.config, self.label, schemas[0].names, f"the file {paths[0]!r}"
        )
        keys = batch_columns(self.config, self.label)
        used = list(dict.fromkeys([*features, *(column for _, column in keys)]))
        columns, parts = self._scan(pq, paths, schemas, used)
        count = sum(part.count for part in parts)
        if count == 0:
            raise DataError(f"data source {self.label!r}: its files hold no rows")
        records = _records(pq, parts, columns)
        parse = _parser(columns, features, keys)
        split = stream_split(records, count, parse, self.config, seed, batch_size, self.label)
        return DataSplit(sharded_by_data(split.train), sharded_by_data(split.validation))

    def files(self) -> list[Path]:
        """Every file the path, glob or folder names."""
        return [Path(path) for path in self._matches()]

    def hint(self, missing: Sequence[str]) -> str:
        if "y" in missing:
            return "; name the label column: --data-set label=COLUMN"
        return f"; name the columns: --data-set keys={','.join(missing)}"

    # --- the files ------------------------------------------------------------------

    def _matches(self) -> list[str]:
        pattern = self.path
        if os.path.isdir(pattern):
            pattern = os.path.join(pattern, "**", "*.parquet")
        return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))

    def _paths(self) -> list[str]:
        paths = self._matches()
        if not paths:
            raise DataError(
                f"data source {self.label!r}: {self.path!r} matches no file; give a Parquet "
                "file, a folder of them or a glob, e.g. --data 'parquet:data/part-*.parquet'"
            )
        return paths

    def _open(self, pq, path: str):
        """The file's reader (footer read: schema, row groups); a ``DataError`` when it
        is not a readable Parquet file (cut short, not Parquet)."""
        import pyarrow as pa

        try:
            return pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as error:
            reason = " ".join(str(error).split())
            raise DataError(
                f"data source {self.label!r}: the file {path!r} is not a readable Parquet "
                f"file ({reason}); write it again, or remove it"
            ) from None

    # --- the scan -------------------------------------------------------------------

    def _scan(self, pq, paths, schemas, used) -> tuple[list[Column], list[Part]]:
        """Every file's chosen columns checked (types by the schema, values read a row
        group at a time) and agreeing across files; the columns and the files' rows."""
        found: dict[str, Column] = {}
        parts, offset = [], 0
        for path, schema in zip(paths, schemas, strict=True):
            absent = [name for name in used if name not in schema.names]
            if absent:
                raise DataError(
                    f"data source {self.label!r}: the file {path!r} has no column(s) "
                    f"{absent}; its columns: {schema.names}"
                )
            kinds = {name: self._kind(path, name, schema.field(name).type) for name in used}
            columns = self._values(pq, path, kinds)
            for column in columns:
                self._agrees(found.setdefault(column.name, column), column, path)
                if found[column.name].whole and not column.whole:
                    found[column.name] = column
            count = pq.ParquetFile(path).metadata.num_rows
            parts.append(Part(path, count, offset))
            offset += count
        return [found[name] for name in used], parts

    def _kind(self, path: str, name: str, kind) -> tuple[bool, bool, str]:
        """``(is_list, is_integer, type)`` of a column's Arrow type (a dictionary's
        values' type; a list's ``list<VALUES>``, of fixed size or not); a ``DataError``
        for a type a model cannot take as numbers."""
        import pyarrow.types as t

        def number(value) -> bool:
            return t.is_integer(value) or t.is_floating(value) or t.is_boolean(value)

        start = f"data source {self.label!r}: the file {path!r}, column {name!r}"
        if t.is_dictionary(kind) and not number(kind.value_type):
            raise DataError(
                f"{start} is dictionary-encoded {kind.value_type} (categories), not numbers; "
                "write its integer codes instead (pyarrow: column.indices), or leave it out "
                "with --data-set features=..."
            )
        if t.is_dictionary(kind):
            kind = kind.value_type  # numbers behind a dictionary: read as the numbers
        is_list = t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind)
        inner = kind.value_type if is_list else kind
        if not number(inner):
            what = f"lists of {inner}" if is_list else str(kind)
            raise DataError(
                f"{start} holds {what}, not numbers (or lists of numbers); convert it to "
                "numbers, or leave it out with --data-set features=..."
            )
        text = f"list<{inner}>" if is_list else str(kind)  # fixed or not, the name aside
        return is_list, not t.is_floating(inner), text

    def _values(self, pq, path: str, kinds) -> list[Column]:
        """The columns of one file, read a row group (a batch of rows at most) at a time:
        no nulls, a list column's lists of one length, whether integers stay within
        int32; a row group that does not read (a damaged page) named."""
        import pyarrow as pa

        names = list(kinds)
        widths: dict[str, set[int]] = {name: set() for name in names}
        whole = {name: kinds[name][1] for name in names}
        reader, row = pq.ParquetFile(path), 0
        for group in range(reader.num_row_groups):
            size = reader.metadata.row_group(group).num_rows
            try:
                for batch in reader.iter_batches(_READ_ROWS, [group], names):
                    for name, values in zip(names, batch.columns, strict=True):
                        self._check(path, name, values, row, kinds[name][0], widths, whole)
                    row += batch.num_rows
            except (pa.ArrowException, OSError) as error:  # a damaged page: OSError
                raise DataError(
                    f"data source {self.label!r}: the file {path!r} does not read: its row "
                    f"group {group} (rows {row} to {row + size - 1}) fails "
                    f"({' '.join(str(error).split())}); write it again, or remove it"
                ) from None
        columns = []
        start = f"data source {self.label!r}: the file {path!r}"
        for name in names:
            if kinds[name][0] and len(widths[name]) > 1:
                raise DataError(
                    f"{start}, column {name!r} holds lists of lengths "
                    f"{sorted(widths[name])}; a list column must hold lists of one length "
                    "(pad or cut them), or be left out with --data-set features=..."
                )
            width = next(iter(widths[name])) if kinds[name][0] and widths[name] else 1
            columns.append(Column(name, width, whole[name], kinds[name][0], kinds[name][2]))
        return columns

    def _check(self, path, name, values, row: int, is_list: bool, widths, whole) -> None:
        """One batch of a column's values: a ``DataError`` for nulls (naming the first
        null's row in the file); the list lengths and whether it stays within int32
        noted in ``widths`` and ``whole``."""
        import pyarrow as pa
        import pyarrow.compute as pc

        start = f"data source {self.label!r}: the file {path!r}, column {name!r}"
        if pa.types.is_dictionary(values.type):
            values = values.dictionary_decode()
        if values.null_count:
            first = row + int(np.argmax(values.is_null().to_numpy(False)))
            raise DataError(
                f"{start} holds nulls (the first in row {first} of the file); fill them "
                "(pyarrow.compute.fill_null) or drop those rows"
            )
        if is_list:
            widths[name] |= set(pc.list_value_length(values).unique().to_pylist())
            values = pc.list_flatten(values)
            if values.null_count:
                raise DataError(
                    f"{start} holds lists with null values; fill them "
                    "(pyarrow.compute.fill_null) or drop those rows"
                )
        if whole[name] and len(values):
            low, high = pc.min_max(values).values()
            whole[name] = _INT32[0] <= low.as_py() and high.as_py() <= _INT32[1]

    def _agrees(self, first: Column, column: Column, path: str) -> None:
        """A ``DataError`` when a file's column has another type or shape than the first
        file's."""
        if (first.type, first.width) != (column.type, column.width):

            def shape(c: Column) -> str:
                return f"{c.type} (lists of {c.width})" if c.is_list else c.type

            raise DataError(
                f"data source {self.label!r}: the file {path!r}, column {column.name!r} "
                f"holds {shape(column)}, the first file's {shape(first)}; write the files "
                "with one schema"
            )


def _records(pq, parts: Sequence[Part], columns: Sequence[Column]):
    """``(index, row)`` pairs: each row's chosen columns as one float64 vector (a list
    column's values in place), the files in order, a batch of rows read at a time, one
    row group at a time (pyarrow's ``iter_batches`` over a whole file reads every row
    group's chunks ahead: memory would grow with the file)."""
    import tensorflow as tf

    names = [column.name for column in columns]
    width = sum(column.width for column in columns)

    def matrix(batch, rows: int) -> np.ndarray:
        out = np.empty((rows, width), np.float64)
        place = 0
        for column, values in zip(columns, batch.columns, strict=True):
            if hasattr(values, "dictionary_decode"):
                values = values.dictionary_decode()
            if column.is_list:
                values = values.flatten()
            flat = values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
            out[:, place : place + column.width] = flat.reshape(rows, column.width)
            place += column.width
        return out

    def rows():
        for part in parts:
            start, reader = part.offset, pq.ParquetFile(part.path)
            for group in range(reader.num_row_groups):  # one at a time: memory bounded
                for batch in reader.iter_batches(_READ_ROWS, [group], names):
                    count = batch.num_rows
                    yield np.arange(start, start + count, dtype=np.int64), matrix(batch, count)
                    start += count

    signature = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, width], tf.float64))
    # Each pass starts the generator again, at the first file's first row: a resumed run
    # reopening its passes reads what the interrupted one read (no warning needed).
    generated = tf.data.Dataset.from_generator(rows, output_signature=signature)
    return replayable(generated).unbatch()


def _parser(columns: Sequence[Column], features: Sequence[str], keys):
    """``parse(rows) -> batch``: x the feature columns side by side as float32; y and the
    keys int32 when their column is whole numbers within int32, else float32 (as csv)."""
    import tensorflow as tf

    place, start = {}, 0
    for column in columns:
        place[column.name] = (start, column)
        start += column.width
    x_indexes = [
        start + offset
        for name in features
        for start, column in [place[name]]
        for offset in range(column.width)
    ]

    def parse(rows):
        batch = {}
        if features:
            batch["x"] = tf.cast(tf.gather(rows, x_indexes, axis=1), tf.float32)
        for key, name in keys:
            start, column = place[name]
            values = rows[:, start : start + column.width]
            values = values if column.is_list else values[:, 0]
            batch[key] = tf.cast(values, tf.int32 if column.whole else tf.float32)
        return batch

    return parse
