"""A run's checkpoints: everything needed to continue exactly, saved atomically.

One ``tf.train.Checkpoint`` holds every model (with every variable, including the
dropout seed states ``tf.train.Checkpoint`` would not find through the model), every
optimizer, the run's counters (step, epoch, data position), the run's random
generator, the training metrics (each beat's last loss value apart), with the divergence
guard on its window of recent losses, the recipe's state when it has any
(``Recipe.build_state``), and two JSON strings: the Python-side state of the
callbacks and the run's record (``RunRecord``) that a resume
is checked against. TensorFlow writes the files first and the index
(``checkpoint``) last with an atomic rename, so "latest" never names a half-written
checkpoint.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from beatloop.core.failures.errors import CheckpointError
from beatloop.core.saving.checkpoint_files import (  # noqa: F401  (latest_record, remove_leftovers: re-exported)
    PREFIX,
    UNREADABLE,
    checkpoint_files,
    first_line,
    jsonable,
    latest_record,
    listed_checkpoints,
    number_of,
    read_record,
    remove_leftovers,
    warn_unreadable,
)
from beatloop.core.saving.layout import refuse_other_optimizers
from beatloop.core.saving.record import RunRecord
from beatloop.core.saving.run_dir import writing

#: The checkpoint key of each beat's last loss value (kept since issue 14).
LAST_VALUES = "last_values"
#: The checkpoint key of the recipe's state (``Recipe.build_state``; only a recipe that
#: has state writes it).
RECIPE_STATE = "recipe_state"
#: The checkpoint key of the divergence guard's window (only a run with the guard on
#: writes it).
DIVERGENCE = "divergence"
#: The part holding the gradient sums of accumulating entries, in checkpoints of runs
#: that have them.
ACCUMULATED = "accumulated"


class RunCheckpoints:
    """Saves and restores one run's state in ``directory`` (``RUN_DIR/checkpoints``).

    ``read_from``: where restores read (default: ``directory``); a multi-worker run's
    other workers save into a dir of their own and restore the chief's checkpoints
    (``core/devices/workers.py``), numbering theirs like the chief's and naming them by the
    chief's paths."""

    def __init__(
        self,
        directory: Path,
        *,
        models: Mapping[str, keras.Layer],
        optimizers: Mapping[str, keras.optimizers.Optimizer],
        counters: Mapping[str, tf.Variable],
        random: tf.random.Generator,
        metric_variables: Sequence,
        last_values: Sequence = (),
        divergence: Sequence = (),
        recipe_state: Mapping[str, tf.Variable] | None = None,
        accumulated: Sequence = (),
        max_to_keep: int = 3,
        read_from: Path | None = None,
    ):
        self.directory = Path(directory)  # created by the first save
        self.read_directory = self.directory if read_from is None else Path(read_from)
        self._restored: str | None = None  # the path restored last (read_directory's)
        self._host = tf.Variable("", dtype=tf.string, trainable=False, name="host_state")
        self._record = tf.Variable("", dtype=tf.string, trainable=False, name="run_record")
        self._parts = {
            "models": dict(models),
            "model_variables": {name: list(model.variables) for name, model in models.items()},
            "optimizers": dict(optimizers),
            "state": dict(counters),
            "random": random,
            "metrics": list(metric_variables),
            "host": self._host,
            "record": self._record,
            LAST_VALUES: list(last_values),
        }
        if divergence:  # without the guard, checkpoints are as they were before it
            self._parts[DIVERGENCE] = list(divergence)
        if recipe_state:  # a recipe without state writes checkpoints as before
            self._parts[RECIPE_STATE] = dict(recipe_state)
        if accumulated:  # gradient sums part-way through an accumulation (``accumulate=``)
            self._parts[ACCUMULATED] = list(accumulated)
        self.checkpoint = tf.train.Checkpoint(**self._parts)
        self.max_to_keep = max_to_keep
        #: Whether each checkpoint is readable, as far as this process knows: those it
        #: wrote or restored are, those it could not read are not (``_prune``).
        self._readable: dict[str, bool] = {}
        #: The best epoch's checkpoint (its name; ``keep_best``): kept beside the newest
        #: ``max_to_keep`` when it is not one of them.
        self.protected: str | None = None
        self.manager = self._manager()

    def _manager(self) -> tf.train.CheckpointManager:
        """TensorFlow's manager, keeping every checkpoint: ``_prune`` chooses which go."""
        return tf.train.CheckpointManager(
            self.checkpoint, str(self.directory), max_to_keep=None, checkpoint_name=PREFIX
        )

    # --- reading -------------------------------------------------------------------------

    def paths(self) -> list[str]:
        """Checkpoint prefixes, oldest first: the index's list, or the files found when
        the index is missing or unreadable."""
        listed = list(self.manager.checkpoints)
        return listed or checkpoint_files(self.directory)

    def read_paths(self) -> list[str]:
        """The prefixes restores choose from, oldest first (``read_directory``'s)."""
        if self.read_directory == self.directory:
            return self.paths()
        return listed_checkpoints(self.read_directory)

    @property
    def latest(self) -> str | None:
        """The newest checkpoint, by its path where restores read it."""
        paths = self.paths()
        return self._as_read(paths[-1]) if paths else self._restored

    def _as_read(self, path: str) -> str:
        return str(self.read_directory / Path(path).name)

    def restore_latest(self, expected: RunRecord, only: str | None = None):
        """Restore the newest readable checkpoint and return ``(path, host state)``;
        ``None`` when there is none. A checkpoint that cannot be read is skipped with a
        warning (the previous one is tried); one whose record differs from ``expected``
        is refused with a CheckpointError, never half-restored. ``only``: the checkpoint
        (by name) to restore instead, none other."""
        failures, paths = [], self.read_paths()
        if only is not None:
            paths = [p for p in paths if Path(p).name == Path(only).name]
            if not paths:
                raise CheckpointError(f"{self.read_directory} holds no checkpoint {only}")
        for path in reversed(paths):
            try:
                record = read_record(path)
            except UNREADABLE as error:
                failures.append(path)
                self._readable[path] = False
                warn_unreadable(path, error, only)
                continue
            record.refuse_if_different(expected, self.read_directory)
            try:
                refuse_other_optimizers(path, self._parts["optimizers"])
                status = self._reader(path).read(path)
                status.assert_existing_objects_matched().expect_partial()
                host = json.loads(self._host.numpy().decode("utf-8"))
            except (*UNREADABLE, AssertionError) as error:
                failures.append(path)
                self._readable[path] = False
                warn_unreadable(path, error, only)
                continue
            self._readable[path] = True
            self._restored = path
            return path, host
        if failures:
            raise CheckpointError(
                f"none of the checkpoints in {self.read_directory} could be read "
                f"({', '.join(Path(p).name for p in failures)}); they are left as they are"
            )
        return None

    def _reader(self, path: str) -> tf.train.Checkpoint:
        """The checkpoint object to read ``path`` with: all parts, or all but those
        ``path`` lacks: each beat's last loss value (written before those were kept) and
        the divergence guard's window (written with the guard off, or by earlier code;
        the window then stays as it is, empty at the start of a run). A window of another
        length (another ``divergence_window``) is left out too, with a warning."""
        shapes = dict(tf.train.list_variables(path))
        left_out = {
            key
            for key in (LAST_VALUES, DIVERGENCE)
            if key in self._parts and not any(name.startswith(f"{key}/") for name in shapes)
        }
        if DIVERGENCE in self._parts and DIVERGENCE not in left_out:
            ours = [list(v.shape) for v in self._parts[DIVERGENCE]]  # a pair per phase
            stored = [
                shapes.get(f"{DIVERGENCE}/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in range(len(ours))
            ]
            if stored != ours:
                left_out.add(DIVERGENCE)
                warnings.warn(
                    f"checkpoint {path} holds a divergence window of shape {stored[0]}, this "
                    f"run keeps {ours[0]} (another divergence_window): the window is not "
                    "restored",
                    RuntimeWarning,
                    stacklevel=4,
                )
        if not left_out:
            return self.checkpoint
        parts = {key: part for key, part in self._parts.items() if key not in left_out}
        return tf.train.Checkpoint(**parts)

    # --- writing -------------------------------------------------------------------------

    def save(self, host: Mapping[str, Any], record: RunRecord) -> str:
        """Write a new checkpoint (numbered after every existing one, so none is ever
        overwritten) and return its path. A failed write (disk full, no permission)
        removes its partial files and raises a CheckpointError; earlier checkpoints are
        untouched."""
        self._host.assign(json.dumps(host, default=jsonable))
        self._record.assign(json.dumps(record.to_json()))
        number = 1 + max((number_of(p) for p in [*self.paths(), self._restored or ""]), default=0)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._rebuild_index()
            path = self.manager.save(checkpoint_number=number)
        except (tf.errors.OpError, OSError) as error:
            self._remove_partial(number)
            kept = ", ".join(Path(p).name for p in self.paths()) or "none"
            raise CheckpointError(
                f"could not write checkpoint {PREFIX}-{number} in {self.directory}: "
                f"{first_line(error)}; earlier checkpoints are intact ({kept})"
            ) from None
        self._readable[path] = True
        with writing(self.directory / "checkpoint", "remove the oldest checkpoints beside"):
            self._prune()
        return self._as_read(path)

    def _rebuild_index(self) -> None:
        """An index (``checkpoint``) that was deleted or damaged while checkpoint files
        remain is written anew from the files, oldest first, so ``max_to_keep`` counts
        them and the oldest are removed as usual instead of left behind."""
        found = checkpoint_files(self.directory)
        if list(self.manager.checkpoints) or not found:
            return
        self._write_index(found)

    def protect(self, name: str | None) -> None:
        """Make ``name`` the checkpoint kept beside the newest (the best epoch's) and
        delete the one it replaces if it is not among the newest ``max_to_keep``."""
        self.protected = name
        with writing(self.directory / "checkpoint", "remove the oldest checkpoints beside"):
            self._prune()

    def _prune(self) -> None:
        """Keep the newest ``max_to_keep`` readable checkpoints, and any unreadable one
        newer than the oldest of those: a damaged checkpoint never displaces a good one,
        and goes once good ones newer than it are enough; and the ``protected`` one
        beside them. The rest are deleted."""
        paths, good = list(self.manager.checkpoints), 0
        for oldest_kept in range(len(paths) - 1, -1, -1):  # newest first, until enough
            good += self._is_readable(paths[oldest_kept])
            if good == self.max_to_keep:
                break
        if good < self.max_to_keep or oldest_kept == 0:
            return
        doomed = [path for path in paths[:oldest_kept] if Path(path).name != self.protected]
        for path in doomed:
            for name in (".index", ".data-?????-of-?????"):
                for found in self.directory.glob(Path(path).name + name):
                    found.unlink(missing_ok=True)
        self._write_index([path for path in paths if path not in doomed])

    def _is_readable(self, path: str) -> bool:
        """Whether every tensor of ``path`` reads back (TensorFlow checks each one's
        checksum); asked once per checkpoint, as this process did not write it."""
        if path not in self._readable:
            try:
                reader = tf.train.load_checkpoint(path)
                for key in reader.get_variable_to_shape_map():
                    reader.get_tensor(key)
                self._readable[path] = True
            except UNREADABLE:
                self._readable[path] = False
        return self._readable[path]

    def _write_index(self, paths: Sequence[str]) -> None:
        """Write the index listing ``paths`` (oldest first; the last is the latest), as
        TensorFlow's ``CheckpointState`` text, atomically, and read it back."""
        paths = [path for path in paths if Path(f"{path}.index").exists()]  # gone: unlisted
        names = [Path(path).name for path in paths]
        stamps = [Path(f"{path}.index").stat().st_mtime for path in paths]
        lines = [f'model_checkpoint_path: "{names[-1]}"']
        lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
        lines += [f"all_model_checkpoint_timestamps: {stamp!r}" for stamp in stamps]
        index = self.directory / "checkpoint"
        partial = index.with_name("checkpoint.partial")
        partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
        partial.replace(index)
        self.manager = self._manager()

    def _remove_partial(self, number: int) -> None:
        for leftover in self.directory.glob(f"{PREFIX}-{number}[._]*"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def run_checkpoints(
    parts, run_dir: Path | None, options, read_dir: Path | None = None
) -> RunCheckpoints | None:
    """The run dir's checkpoints (``run_dir/checkpoints``; restored from
    ``read_dir/checkpoints`` when given), or none without a run dir."""
    if run_dir is None:
        return None
    return RunCheckpoints(
        Path(run_dir) / "checkpoints",
        models=parts.bound.models,
        optimizers=parts.bound.optimizers,
        counters=parts.counters.checkpointed(),
        random=parts.bound.random,
        metric_variables=parts.train_metrics.variables(),
        last_values=parts.train_metrics.last_variables(),
        divergence=[v for guard in parts.guards() for v in guard.variables()],
        recipe_state=parts.bound.state,
        accumulated=_accumulated(parts),
        max_to_keep=options.max_to_keep,
        read_from=None if read_dir is None else Path(read_dir) / "checkpoints",
    )


def _accumulated(parts) -> list:
    """The variables of every phase's gradient sums (``accumulate=``), for checkpoints."""
    phased = parts.phased
    bounds = [part.bound for part in phased.parts] if phased is not None else [parts.bound]
    return [
        variable
        for bound in bounds
        for group in bound.groups
        if group.accumulators is not None
        for variable in group.accumulators.variables
    ]
