"""A finished run as ``export`` and ``evaluate`` read it: its recipe rebuilt from the
latest checkpoint's record, and the data it was named with (``run.json``'s
``data_source``), read again."""

from __future__ import annotations

import json
from pathlib import Path


def recorded_recipe(run_dir: Path, verb: str):
    """The run's record (latest readable checkpoint) and its recipe, configured as it
    was; a ``CheckpointError`` when there is none to ``verb``."""
    from beatloop.core.checkpoints import latest_record
    from beatloop.core.errors import CheckpointError
    from beatloop.fitting import config_overrides, make_recipe
    from beatloop.plugins.registry import get_recipe

    record = latest_record(run_dir)
    if record is None:
        raise CheckpointError(f"{run_dir} holds no readable checkpoint to {verb}")
    cls = get_recipe(record.recipe)
    return record, make_recipe(cls, config_overrides(cls, record.config))


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
            "with --data KIND:PATH (and --data-set NAME=VALUE)"
        ) from error
