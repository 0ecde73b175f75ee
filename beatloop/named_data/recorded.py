"""The data a finished run trained on, as its ``run.json`` records it (``data_source``:
the ``--data``, ``--data-set`` and ``--validation-data`` it was given; ``data_files``:
the identity of its files), read again: ``export`` rebuilds a run on it, ``evaluate``
evaluates on its validation data (warning when its files changed), a resume compares
its files with the record (refusing a change unless accepted). Nothing here depends on
the kind of source."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any


def recorded_source(run_dir: Path):
    """The ``NamedData`` the run trained on when it was given ``--data`` (``run.json``'s
    ``data_source``), else ``None`` (no run.json, or one that names no data)."""
    from beatloop.named_data.load import NamedData

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
    from beatloop.core.failures.errors import BeatloopError, DataError

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
    from beatloop.core.data.batches import as_data_split
    from beatloop.core.data.paths import spec_record
    from beatloop.core.failures.errors import DataError

    split = as_data_split(read_recorded_source(run_dir, source, recipe, stored.seed))
    where = f"{Path(run_dir) / 'run.json'} records that the run trained on --data {source.source}"
    if split.validation is None:
        raise DataError(
            f"{where}, which holds out no validation data to evaluate on (it was given no "
            "validation_fraction and no --validation-data): pass data= (a batched "
            "tf.data.Dataset like its training data)"
        )
    built = spec_record(split.train.element_spec)
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


def data_facts(run_dir: Path | None, named, recipe, resumed: bool, accept: bool) -> dict:
    """What ``run.json`` records of the data ``named`` (a ``NamedData``; anything else:
    nothing): its ``data_source``, its files' identity (``data_files``) and the changes
    resumes accepted (``data_changes``). On a resume (``resumed``) the files are compared
    with those recorded: a change is a ``DataError`` naming the files and what changed,
    unless ``accept``, which records it with the time. A run dir recorded before files
    were (no ``data_files``) resumes as before."""
    from beatloop.core.failures.errors import DataError
    from beatloop.core.saving.record import read_run_json
    from beatloop.named_data.identity import changes, describe
    from beatloop.named_data.load import NamedData

    if run_dir is None or not isinstance(named, NamedData):
        return {}
    earlier = read_run_json(Path(run_dir) / "run.json") if resumed and run_dir else {}
    recorded = earlier.get("data_files")
    identity = named.identity(recipe, recorded or ())
    facts: dict[str, Any] = {"data_source": named.to_json()}
    if identity is not None:
        facts["data_files"] = identity
    accepted = list(earlier.get("data_changes") or ())
    found = changes(recorded, identity) if recorded and identity is not None else []
    if found and not accept:
        raise DataError(
            f"the data the run in {run_dir} trained on has changed since its run.json "
            f"recorded it: {describe(found)}; resuming would not continue the same run: "
            "put the data back as it was, start a new run dir, or pass "
            "accept_changed_data=True to go on "
            "with the data as it is now (run.json records the change)"
        )
    if found:
        accepted.append({"accepted_at": _now(), "changes": found})
    if accepted:
        facts["data_changes"] = accepted
    return facts


def warn_if_changed(run_dir: Path, named, recipe) -> None:
    """One ``DataChangedWarning`` line when the files of the data ``named`` (the run's
    recorded source) differ from those its ``run.json`` records; nothing when it records
    none (a run from before they were recorded)."""
    from beatloop.core.saving.record import read_run_json
    from beatloop.named_data.identity import DataChangedWarning, changes, describe

    recorded = read_run_json(Path(run_dir) / "run.json").get("data_files")
    if not recorded:
        return
    identity = named.identity(recipe, recorded)
    found = changes(recorded, identity) if identity is not None else []
    if found:
        warnings.warn(
            f"the data the run in {run_dir} trained on has changed since its run.json "
            f"recorded it ({describe(found)}): the figures need not be its last val_ figures",
            DataChangedWarning,
            stacklevel=4,  # the caller of beatloop.evaluate
        )


def _now() -> str:
    """The time now, as ``run.json`` writes times (UTC, ISO 8601)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
