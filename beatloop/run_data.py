"""The data a finished run trained on, as its ``run.json`` records it (``data_source``:
the ``--data``, ``--data-set`` and ``--validation-data`` it was given), read again:
``export`` rebuilds a run on it, ``evaluate`` evaluates on its validation data. Nothing
here depends on the kind of source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def recorded_source(run_dir: Path):
    """The ``NamedData`` the run trained on when it was given ``--data`` (``run.json``'s
    ``data_source``), else ``None`` (no run.json, or one that names no data)."""
    from beatloop.sources import NamedData

    try:
        recorded = json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    source = recorded.get("data_source") if isinstance(recorded, dict) else None
    if not isinstance(source, dict) or not isinstance(source.get("data"), str):
        return None
    return NamedData(
        source["data"], tuple(source.get("data_set") or ()), source.get("validation_data")
    )


def read_recorded_source(run_dir: Path, source, recipe, seed: int):
    """The batches ``source`` (the run's recorded ``--data``) gives now; a ``DataError``
    saying where it was recorded and what to do when it cannot be read."""
    from beatloop.core.errors import BeatloopError, DataError

    try:
        return source(recipe, seed)
    except BeatloopError as error:
        raise DataError(
            f"{Path(run_dir) / 'run.json'} records that the run trained on --data "
            f"{source.source}, which cannot be read now: {error}; name its data as it is now "
            "with --data KIND:PATH (and --data-set NAME=VALUE; data= in Python)"
        ) from error


def recorded_validation(run_dir: Path, source, recipe, stored: Any):
    """The ``DataSplit`` to evaluate a run on: its recorded source read with the run's
    seed, whose validation data (its ``validation_fraction`` held out, or its
    ``--validation-data``) is what the run validated on each epoch. A ``DataError`` when
    it gives no validation data or other batches than the run trained on."""
    from beatloop.core.batches import as_data_split
    from beatloop.core.errors import DataError

    split = as_data_split(read_recorded_source(run_dir, source, recipe, stored.seed))
    where = f"{Path(run_dir) / 'run.json'} records that the run trained on --data {source.source}"
    if split.validation is None:
        raise DataError(
            f"{where}, which holds out no validation data to evaluate on (it was given no "
            "validation_fraction and no --validation-data): pass data= (a batched "
            "tf.data.Dataset like its training data)"
        )
    built = {key: str(spec) for key, spec in split.train.element_spec.items()}
    if built != stored.data:
        differences = spec_differences(stored.data, built, "now")
        raise DataError(
            f"{where}, which now gives other batches ({differences}): pass data= (a batched "
            "tf.data.Dataset like its training data)"
        )
    return split


def spec_differences(run: dict[str, str], other: dict[str, str], where: str = "there") -> str:
    """Where two recorded batch specs (each key's ``TensorSpec`` as text) differ."""
    return "; ".join(
        f"{key!r} is {run.get(key, 'absent')} in the run, {other.get(key, 'absent')} {where}"
        for key in sorted(set(run) | set(other))
        if run.get(key) != other.get(key)
    )
