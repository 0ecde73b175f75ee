"""The ``csv`` data source, streamed: the file is read through ``tf.data`` a batch of lines
at a time, never whole.

Loading scans the file once, in C++ and in large batches: it counts the data rows (the
pipeline's cardinality), checks every row parses, and finds which columns hold only whole
numbers (those become int32). Training then reads the lines again each pass, through
``beatloop.sources.stream`` (hold-out by the seed's permutation of row indexes, bounded
shuffle, batches parsed with ``tf.io.decode_csv``). A file that does not parse is read
again in Python, only on that error path, to name the line and the column.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path

import attrs
import tensorflow as tf

from beatloop import DataError, DataSource, DataSplit
from beatloop.sources.columns import feature_columns, key_columns
from beatloop.sources.stream import StreamConfig, sharded_by_data, stream_split

#: Values decoded per scan batch (rows = this / columns): memory stays bounded by it.
_SCAN_VALUES = 2**18
#: File lines read and masked at a time when streaming the data rows.
_CHUNK_LINES = 4096
#: The whole numbers a column may hold and still become int32.
_INT32_MAX = 2**31 - 1


def _delimiter(instance, attribute, value) -> None:
    if len(value) != 1 or value in '"\r\n':
        raise ValueError(f"delimiter must be one character (not a quote or newline), got {value!r}")


@attrs.frozen
class CsvConfig(StreamConfig):
    """``label``: the column that becomes ``y`` (none by default); ``keys``: columns that
    become batch keys of their own name (e.g. ``risk``), or ``COLUMN:KEY`` items naming
    the key (``userId:user``; a path ``x/NAME`` makes ``x`` a dict of named columns, a
    model's named inputs); ``features``: the columns
    gathered into ``x`` (by default every other column); ``delimiter``: the separator;
    ``shuffle_buffer``: how many rows the training shuffle draws from (the file is
    streamed: memory is bounded by it; a buffer at least as large as the file shuffles it
    uniformly)."""

    label: str | None = None
    keys: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    delimiter: str = attrs.field(default=",", validator=_delimiter)


@attrs.frozen
class CsvHeader:
    """The header row: its column names and the file line it ends on (1-based; the data
    rows start after it)."""

    names: tuple[str, ...]
    line: int


@attrs.frozen
class CsvLayout:
    """What the load-time scan found: the header, the number of data rows, and per
    column whether every value is a whole number (in int32's range)."""

    header: CsvHeader
    count: int
    whole: tuple[bool, ...]


class CsvSource(DataSource):
    """A CSV file with a header row of column names, streamed: batches {x} (float32, (n,
    features)), plus y (the label column) and any columns named in keys (no x when keys
    name every column and there is no label; x a dict when keys name x/NAME paths)."""

    name = "csv"
    Config = CsvConfig

    def load(self, seed: int, batch_size: int) -> DataSplit:
        header = self._header()
        features = self._features(header.names)
        layout = self._scan(header)
        if layout.count == 0:
            raise DataError(
                f"data source {self.label!r}: the CSV needs a header row and at least one row "
                "of values; it has 1 row(s)"
            )
        parse = self._parser(layout, features)
        split = stream_split(
            self._records(header), layout.count, parse, self.config, seed, batch_size, self.label
        )
        return DataSplit(sharded_by_data(split.train), sharded_by_data(split.validation))

    def files(self) -> list[Path]:
        """The CSV file."""
        return [Path(self.path)] if Path(self.path).is_file() else []

    def hint(self, missing: Sequence[str]) -> str:
        if "y" in missing:
            return "; name the label column: --data-set label=COLUMN"
        return f"; name the columns: --data-set keys={','.join(missing)}"

    # --- the header and the columns ------------------------------------------------------

    def _header(self) -> CsvHeader:
        """The first non-blank row (read in Python: one line)."""
        path = Path(self.path)
        if not path.is_file():
            what = "a folder, not a file" if path.is_dir() else "not there"
            raise DataError(f"data source {self.label!r}: {self.path!r} is {what}")
        try:
            with path.open(newline="", encoding="utf-8") as handle:
                reader = csv.reader(handle, delimiter=self.config.delimiter)
                row = next((row for row in reader if row), None)
        except UnicodeDecodeError as error:
            raise DataError(
                f"data source {self.label!r}: the file is not UTF-8 text ({error.reason} at "
                f"byte {error.start}); save the CSV as UTF-8"
            ) from None
        if row is None:
            raise DataError(
                f"data source {self.label!r}: the CSV needs a header row and at least one row "
                "of values; it has 0 row(s)"
            )
        return CsvHeader(tuple(name.strip() for name in row), reader.line_num)

    def _features(self, header: Sequence[str]) -> list[str]:
        """The columns gathered into ``x``; every column named must exist."""
        return feature_columns(self.config, self.label, header, "the CSV")

    def _key_columns(self) -> list[tuple[str, str]]:
        """``(column, batch key)`` of each ``keys`` item (``columns.key_columns``)."""
        return key_columns(self.config, self.label)

    # --- the streamed pipeline -----------------------------------------------------------

    def _chunks(self, header: CsvHeader, rows: int):
        """The data rows' lines in file order, ``rows`` lines of the file at a time, blank
        lines dropped (each chunk masked at once: a per-line filter is many times slower)."""
        lines = tf.data.TextLineDataset(self.path).skip(header.line).batch(rows)
        return lines.map(lambda chunk: tf.boolean_mask(chunk, tf.strings.length(chunk) > 0))

    def _records(self, header: CsvHeader):
        """``(index, line)`` pairs, ``index`` the data row's position in the file."""
        return self._chunks(header, _CHUNK_LINES).unbatch().enumerate()

    def _decode(self, lines, columns: int, select: Sequence[int] | None = None):
        """The columns (all, or those in ``select``) of a batch of lines, as float64 (so
        each value rounds as Python's ``float`` does)."""
        wanted = columns if select is None else len(select)
        return tf.io.decode_csv(
            lines,
            record_defaults=[tf.constant([], tf.float64)] * wanted,
            field_delim=self.config.delimiter,
            select_cols=None if select is None else list(select),
        )

    def _parser(self, layout: CsvLayout, features: Sequence[str]):
        """``parse(lines) -> batch``: x the feature columns stacked as float32; y and the
        keys int32 when their column is all whole numbers, else float32."""
        config, header = self.config, list(layout.header.names)
        keys = ([("y", config.label)] if config.label is not None else []) + [
            (key, column) for column, key in self._key_columns()
        ]
        used = sorted({header.index(name) for name in [*features, *(c for _, c in keys)]})
        place = {header[column]: position for position, column in enumerate(used)}

        def parse(lines):
            values = self._decode(lines, len(header), used)
            batch = {}
            if features:
                stacked = tf.stack([values[place[n]] for n in features], 1)
                batch["x"] = tf.cast(stacked, tf.float32)
            for key, name in keys:
                whole = layout.whole[header.index(name)]
                batch[key] = tf.cast(values[place[name]], tf.int32 if whole else tf.float32)
            return batch

        return parse

    # --- the scan and its errors ---------------------------------------------------------

    def _scan(self, header: CsvHeader) -> CsvLayout:
        """Every data row decoded once, in big batches: their count and which columns
        are whole numbers; a ``DataError`` naming the first bad line otherwise."""
        columns = len(header.names)

        def whole(values):
            fits = tf.math.is_finite(values) & (tf.abs(values) <= _INT32_MAX)
            return tf.reduce_all(fits & tf.equal(values, tf.round(values)))

        def summary(lines):
            values = self._decode(lines, columns)
            return tf.size(lines, tf.int64), tf.stack([whole(column) for column in values])

        batches = self._chunks(header, max(64, _SCAN_VALUES // columns))
        batches = batches.map(summary, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        start = (tf.constant(0, tf.int64), tf.ones([columns], tf.bool))
        try:
            count, whole = batches.reduce(start, lambda a, b: (a[0] + b[0], a[1] & b[1]))
        except tf.errors.InvalidArgumentError as error:
            raise self._bad_line(header.names, error) from None
        return CsvLayout(header, int(count), tuple(bool(w) for w in whole.numpy()))

    def _bad_line(self, header: Sequence[str], error: Exception) -> DataError:
        """The ``DataError`` naming the first line (1-based, in the file) that has the
        wrong number of values or a value that is not a number, found by reading the file
        again in Python: only on this error path."""
        with Path(self.path).open(newline="", encoding="utf-8", errors="replace") as handle:
            reader = csv.reader(handle, delimiter=self.config.delimiter)
            rows = (row for row in reader if row)
            next(rows)  # the header
            for row in rows:
                line = reader.line_num
                if len(row) != len(header):
                    return DataError(
                        f"data source {self.label!r}: line {line} has {len(row)} values, the "
                        f"header {len(header)} columns"
                    )
                for name, text in zip(header, row, strict=True):
                    if not _is_number(text):
                        return DataError(
                            f"data source {self.label!r}: line {line}, column {name!r} holds "
                            f"{text!r}, not a number"
                        )
        return DataError(
            f"data source {self.label!r}: a line does not parse as {len(header)} numbers "
            f"({_reason(error)}); every row needs one number per column"
        )


def _is_number(text: str) -> bool:
    """Whether ``tf.io.decode_csv`` reads ``text`` as a float64 (as Python's ``float``
    does, but for digit separators, which it refuses, and hexadecimal, which it reads)."""
    if "_" in text:
        return False
    for read in (float, float.fromhex):
        try:
            read(text)
            return True
        except ValueError:
            pass
    return False


def _reason(error: Exception) -> str:
    """TensorFlow's words for a failed decode, without the function and op names."""
    text = " ".join((getattr(error, "message", None) or str(error)).split())
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", re.sub(r"\{\{[^}]*\}\}\s*", "", text))
