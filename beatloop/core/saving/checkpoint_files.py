"""A run's checkpoint files on disk, read without restoring anything: the prefixes
listed by the index (or found by their files when it is missing), the run record one
holds, its models' weights as values, and what saves killed half-way left behind."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import tensorflow as tf

from beatloop.core.failures.errors import CheckpointError
from beatloop.core.saving.record import RunRecord

PREFIX = "ckpt"
#: What reading a damaged checkpoint raises: TensorFlow's errors (data loss, not found),
#: and the reader's IndexError/ValueError on garbled bytes.
UNREADABLE = (tf.errors.OpError, ValueError, IndexError, KeyError, RuntimeError, TypeError)
_RECORD_KEY = "record/.ATTRIBUTES/VARIABLE_VALUE"


def listed_checkpoints(directory: Path) -> list[str]:
    """Checkpoint prefixes in ``directory``, oldest first: the index's list, or the files
    found when the index is missing or unreadable."""
    state = tf.train.get_checkpoint_state(str(directory))
    listed = list(state.all_model_checkpoint_paths) if state else []
    return listed or checkpoint_files(directory)


def remove_leftovers(directory: Path) -> list[str]:
    """Remove what saves killed half-way left in ``directory``: TensorFlow's
    ``ckpt-N_temp`` folders and a half-written index (``checkpoint.partial``). Called when
    a run starts, with the run dir's lock held; returns the names removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [*directory.glob(f"{PREFIX}-*_temp"), *directory.glob("checkpoint.partial")]
    for leftover in found:
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    return sorted(leftover.name for leftover in found)


def checkpoint_files(directory: Path) -> list[str]:
    """Checkpoint prefixes found on disk (by their ``.index`` files), oldest first."""
    found = [str(p.with_suffix("")) for p in Path(directory).glob(f"{PREFIX}-*.index")]
    return sorted(found, key=number_of)


def read_record(path: str) -> RunRecord:
    """The run record stored in one checkpoint, read without restoring anything."""
    value = tf.train.load_checkpoint(path).get_tensor(_RECORD_KEY)
    return RunRecord.from_json(
        json.loads(value.decode("utf-8") if isinstance(value, bytes) else value)
    )


def latest_record(run_dir: Path) -> RunRecord | None:
    """The record of the newest readable checkpoint under ``run_dir``, if any."""
    directory = Path(run_dir) / "checkpoints"
    if not directory.is_dir():
        return None
    for path in reversed(listed_checkpoints(directory)):
        try:
            return read_record(path)
        except UNREADABLE:
            continue
    return None


def model_values(path: str, models: Mapping) -> dict[str, list[np.ndarray]]:
    """Each model's variables' values in the checkpoint at ``path`` (its
    ``model_variables`` part: every variable of each model, in ``model.variables``'
    order), read without restoring anything; a ``CheckpointError`` when it cannot be read
    or its variables are not ``models``' (other names, counts or shapes)."""
    try:
        reader = tf.train.load_checkpoint(path)
        stored = dict(tf.train.list_variables(path))
    except UNREADABLE as error:
        raise CheckpointError(f"checkpoint {path} could not be read: {first_line(error)}") from None
    values = {}
    for name, model in models.items():
        values[name] = []
        for index, variable in enumerate(model.variables):
            key = f"model_variables/{_escaped(name)}/{index}/.ATTRIBUTES/VARIABLE_VALUE"
            if key not in stored or list(stored[key]) != list(variable.shape):
                where = getattr(variable, "path", variable.name)
                raise CheckpointError(
                    f"checkpoint {path} holds no variable {index} of model {name!r} of shape "
                    f"{tuple(variable.shape)} ({where}): it is another run's"
                )
            values[name].append(reader.get_tensor(key))
    return values


def _escaped(name: str) -> str:
    """A model's name as a checkpoint key spells it (TensorFlow's ``escape_local_name``:
    ``.`` doubled, ``/`` as ``.S``)."""
    return name.replace(".", "..").replace("/", ".S")


def number_of(path: str) -> int:
    """A checkpoint's number (``ckpt-N``), 0 for a path that is not one."""
    match = re.search(rf"{PREFIX}-(\d+)$", str(path))
    return int(match.group(1)) if match else 0


class UnreadableCheckpoint(CheckpointError):
    """The one checkpoint a restore was asked for cannot be read (there is no other to try)."""


def warn_unreadable(path: str, error: Exception, only: str | None = None) -> None:
    """Warn that ``path`` is skipped; with ``only`` (the one asked for) raise instead."""
    if only is not None:
        raise UnreadableCheckpoint(
            f"checkpoint {path} could not be read ({first_line(error)}); it is left as it is"
        ) from error
    warnings.warn(
        f"checkpoint {path} could not be read ({first_line(error)}); trying the one before",
        RuntimeWarning,
        stacklevel=3,
    )


def first_line(error: Exception) -> str:
    message = getattr(error, "message", None) or str(error)
    message = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", message)  # TF's op wrapper
    return " ".join(message.strip().splitlines()[:1])[:300]


def jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
