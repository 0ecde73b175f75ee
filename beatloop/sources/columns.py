"""Which columns of a table become which batch keys, for the table kinds (``csv``,
``parquet``): one rule for both, so a table read from either file gives the same batch
keys. ``label`` becomes ``y``; each ``keys`` item ``COLUMN`` or ``COLUMN:KEY`` a key
(``x/NAME`` paths gather into a dict ``x``); ``features`` (by default every other
column) are stacked into ``x``."""

from __future__ import annotations

from collections.abc import Sequence

from beatloop import DataError


def key_columns(config, label: str) -> list[tuple[str, str]]:
    """``(column, batch key)`` of each ``config.keys`` item: ``COLUMN`` or
    ``COLUMN:KEY``; the batch keys distinct, none of them ``x`` or the label's ``y``."""
    pairs = [tuple(item.split(":", 1)) if ":" in item else (item, item) for item in config.keys]
    taken = ["x"] + (["y"] if config.label is not None else [])
    for column, key in pairs:
        renamed = column != key
        named = all(part.isidentifier() for part in key.split("/"))
        if not column or (renamed and not named) or key in taken:
            why = f"the batch key {key!r} is taken" if key in taken else "not COLUMN:KEY"
            raise DataError(
                f"data source {label!r}: --data-set keys expects COLUMN or "
                f"COLUMN:KEY items (e.g. keys=userId:user,rating), got {column}:{key} "
                f"({why})"
            )
        taken.append(key)
    return pairs


def feature_columns(config, label: str, header: Sequence[str], table: str) -> list[str]:
    """The columns gathered into ``x``; every column named must exist in ``header``
    (``table`` says which, in the error: ``the CSV``)."""
    named = ([config.label] if config.label is not None else []) + [
        column for column, _ in key_columns(config, label)
    ]
    absent = [name for name in [*named, *config.features] if name not in header]
    if absent:
        raise DataError(
            f"data source {label!r}: {table} has no column(s) {absent}; its columns: {list(header)}"
        )
    into_x = [key for _, key in key_columns(config, label) if key.startswith("x/")]
    if into_x and config.features:
        raise DataError(
            f"data source {label!r}: x is either the feature columns stacked "
            f"(features={','.join(config.features)}) or a dict of named columns (keys "
            f"{', '.join(into_x)}); leave out one"
        )
    if into_x:
        return []  # x is a dict of the columns the keys name: a model's named inputs
    features = list(config.features) or [name for name in header if name not in named]
    if not features and config.label is None and config.keys:
        return []  # keys alone (user, item, rating): batches without x
    if not features:
        raise DataError(
            f"data source {label!r}: no columns are left for 'x' (every column is "
            "the label or a key)"
        )
    return features


def batch_columns(config, label: str) -> list[tuple[str, str]]:
    """``(batch key, column)`` of the label (``y``) and of each key."""
    keys = [("y", config.label)] if config.label is not None else []
    return keys + [(key, column) for column, key in key_columns(config, label)]
