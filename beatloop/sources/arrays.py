"""Arrays (one example per row) made into a ``DataSplit``: what the in-memory kinds
(``folder``, ``npz``) and plugins' kinds hand their arrays to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from beatloop.core.batches import DataSplit
from beatloop.core.errors import DataError


def split_arrays(
    arrays: Mapping[str, np.ndarray], config: Any, seed: int, batch_size: int, label: str
) -> DataSplit:
    """Arrays (one example per row) as a DataSplit: ``config.validation_fraction`` of the
    examples, drawn by ``seed``, held out for validation; training batches reshuffled
    every epoch by ``seed`` when ``config.shuffle`` (the built-in pipeline,
    ``beatloop.sources.digits.batches``)."""
    from beatloop.sources.digits import batches

    counts = {name: len(value) for name, value in arrays.items() if np.ndim(value) > 0}
    if len(counts) != len(arrays) or len(set(counts.values())) != 1:
        shapes = {name: np.shape(value) for name, value in arrays.items()}
        raise DataError(
            f"data source {label!r}: every array needs one example per row, the same number "
            f"of rows; found shapes {shapes}"
        )
    count = next(iter(counts.values()))
    if count == 0:
        raise DataError(f"data source {label!r}: it holds no examples")
    fraction = getattr(config, "validation_fraction", 0.0)
    held = round(count * fraction)
    if fraction and not 0 < held < count:
        raise DataError(
            f"data source {label!r}: validation_fraction={fraction} of {count} example(s) "
            f"leaves {count - held} for training and {held} for validation; both need some"
        )
    shuffle_seed = seed if getattr(config, "shuffle", True) else None
    if not held:
        return DataSplit(batches(arrays, batch_size, shuffle_seed=shuffle_seed))
    order = np.random.default_rng(seed).permutation(count)
    train = {name: value[order[held:]] for name, value in arrays.items()}
    validation = {name: value[order[:held]] for name, value in arrays.items()}
    return DataSplit(
        batches(train, batch_size, shuffle_seed=shuffle_seed),
        batches(validation, batch_size),
    )
