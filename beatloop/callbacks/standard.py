"""Built-in callbacks: per-epoch history, a progress bar, and log files in the run dir."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from beatloop import Callback, ConfigError, Order, Run
from beatloop.files import append_line, replace_file, writing


class History(Callback):
    """Collects each epoch's logs into ``history[name] -> [value per epoch]``, and the
    latest epoch's logs whole in ``last``: a recipe in phases logs other figures in each
    phase, so the last values of ``history``'s lists can come from different epochs."""

    order = Order.WRITER

    def __init__(self):
        self.history: dict[str, list[float]] = {}
        self.last: dict[str, float] = {}

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        for name, value in logs.items():
            self.history.setdefault(name, []).append(value)
        self.last = dict(logs)

    def checkpoint_state(self) -> dict:
        return {"history": self.history, "last": self.last}

    def restore_state(self, state: dict) -> None:
        self.history = {name: list(values) for name, values in state["history"].items()}
        self.last = dict(state.get("last", {}))  # not in checkpoints written before it was kept


class TrainingTimer(Callback):
    """Time spent training, per epoch: from the epoch's start to its last compiled call's
    end, so validation, epoch figures and end-of-epoch callbacks are not counted."""

    callback_name = "training_timer"
    order = Order.WRITER

    def __init__(self):
        self.epoch_seconds: list[float] = []
        self.epoch_examples: list[int] = []
        self.epoch_steps: list[int] = []

    def on_epoch_start(self, run: Run, epoch: int) -> None:
        self._start = self._last = time.perf_counter()
        self._examples, self._steps = run.examples, run.step

    def on_execution_end(self, run: Run, steps: int, logs: Mapping[str, float]) -> None:
        self._last = time.perf_counter()

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        self.epoch_seconds.append(self._last - self._start)
        self.epoch_examples.append(run.examples - self._examples)
        self.epoch_steps.append(run.step - self._steps)

    def rates(self) -> tuple[float, float]:
        """(steps/s, examples/s) over the epochs after the first, whose time includes
        tracing; over every epoch if there was only one."""
        start = 1 if len(self.epoch_seconds) > 1 else 0
        seconds = max(sum(self.epoch_seconds[start:]), 1e-9)
        return sum(self.epoch_steps[start:]) / seconds, sum(self.epoch_examples[start:]) / seconds


def format_figure(value: float) -> str:
    """A figure as the progress lines and the command line print it: 4 significant
    digits."""
    return f"{value:.4g}"


def format_logs(logs: Mapping[str, float]) -> str:
    return "  ".join(f"{name} {format_figure(value)}" for name, value in logs.items())


class ProgressBar(Callback):
    """A rich progress bar with the running losses and throughput on a terminal; one
    line per epoch elsewhere (pipes, CI logs)."""

    callback_name = "progress"
    order = Order.WRITER

    def __init__(self, stream=None, refresh_seconds: float = 0.1):
        self.stream = stream or sys.stdout
        self.refresh_seconds = refresh_seconds
        self._progress = None
        self._task = None

    def on_epoch_start(self, run: Run, epoch: int) -> None:
        self._started = time.perf_counter()
        self._examples = run.examples
        self._last_refresh = 0.0
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._progress = Progress(
                TextColumn(f"epoch {epoch + 1}/{run.epochs}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                console=Console(file=self.stream),
                transient=True,
            )
            self._task = self._progress.add_task("train", total=run.steps_per_epoch, status="")
            self._progress.start()

    def on_execution_end(self, run: Run, steps: int, logs: Mapping[str, float]) -> None:
        if self._progress is None:
            return
        now = time.perf_counter()
        status = None
        if now - self._last_refresh >= self.refresh_seconds:
            self._last_refresh = now
            # Reading logs is collective across workers, and refreshes are timed per
            # worker: a multi-worker run's bar shows the losses only at an epoch's end.
            beats = run.bound.beats if run.worker.count == 1 else ()
            shown = {beat.name: logs[beat.name] for beat in beats}
            status = f"{format_logs(shown)}  {self._rate(run, now):,.0f} examples/s".strip()
        if status is None:
            self._progress.advance(self._task, steps)
        else:
            self._progress.update(self._task, advance=steps, status=status)

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        rate = self._rate(run, time.perf_counter())
        print(
            f"epoch {epoch + 1}/{run.epochs}  {format_logs(logs)}  ({rate:,.0f} examples/s)",
            file=self.stream,
            flush=True,
        )

    def on_exception(self, run: Run, error: BaseException) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _rate(self, run: Run, now: float) -> float:
        elapsed = max(now - self._started, 1e-9)
        return (run.examples - self._examples) / elapsed


def encode_arrays(arrays: list) -> str:
    """NumPy arrays as one base64 text (an ``.npz``), to keep them in JSON state."""
    buffer = io.BytesIO()
    np.savez(buffer, *arrays)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_arrays(text: str) -> list:
    with np.load(io.BytesIO(base64.b64decode(text))) as archive:
        return [archive[f"arr_{i}"] for i in range(len(archive.files))]


#: What ``EpochLogFile._epoch_of`` says of a torn line.
_TORN = object()


def _jsonable(value):
    """JSON has no NaN or infinity: write them as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _epochs_text(epochs: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``1-3, 5``."""
    spans: list[list[int]] = []
    for epoch in sorted(epochs):
        if spans and epoch == spans[-1][1] + 1:
            spans[-1][1] = epoch
        else:
            spans.append([epoch, epoch])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _rows_of(epochs: list[int], verb: str = "") -> str:
    """``epoch 2's row`` or ``the rows of epochs 1-3, 5``, with ``verb`` (``is`` or
    ``was``) agreeing."""
    if len(epochs) == 1:
        return f"epoch {epochs[0]}'s row" + (f" {verb}" if verb else "")
    plural = {"is": " are", "was": " were", "": ""}[verb]
    return f"the rows of epochs {_epochs_text(epochs)}{plural}"


def _not_kept(epochs: list[int], last: dict | None) -> str:
    """Why rows of ``epochs`` cannot be written back: the checkpoint (of an earlier
    version, which kept the last row only) does not hold them."""
    held = f" (epoch {last['epoch']}'s)" if last else ""
    return (
        f"{_rows_of(epochs)} cannot be written back: the checkpoint, written by an earlier "
        f"version of beatloop, keeps only the last row{held}, so the file goes on without "
        f"{'it' if len(epochs) == 1 else 'them'}"
    )


class NothingWrittenWarning(RuntimeWarning):
    """A log file's damage named, not repaired, on a resume with nothing to train:
    ``found`` what the file lacks or holds torn, ``advice`` what a longer run will do
    (``fit`` folds both into its one "nothing to train" warning)."""

    def __init__(self, message: str, *, found: str, advice: str):
        super().__init__(message)
        self.found, self.advice = found, advice


class EpochLogFile(Callback):
    """Base of the per-epoch log files: a file given by path, or ``filename`` in the run
    dir; its folder is created when the run starts.

    Every row written is kept in every checkpoint (its text, by epoch: a few hundred
    bytes an epoch, as ``History`` keeps the figures), so a resume makes the file hold
    each of the checkpoint's epochs once, as first written: a row a kill tore, rows
    deleted, the whole file deleted are written back from it, and the rows after the
    checkpoint's epoch go, to be written again. One warning naming the file says what
    was repaired. A checkpoint of an earlier version kept the last row only: rows it
    lacks are named in the warning as not written back. A resume with nothing to train
    (the checkpoint holds the epochs asked for) writes nothing: the warning then says so,
    and what a run with more epochs will write back."""

    filename = ""
    order = Order.WRITER
    #: The last row written, ``{"epoch": n from 1, "line": the row as written}``.
    _last: dict | None = None

    def __init__(self, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        self._rows: dict[int, str] = {}

    def checkpoint_state(self) -> dict | None:
        if self._last is None:
            return None
        rows = {str(epoch): line for epoch, line in sorted(self._saved_rows().items())}
        return {"last_row": self._last, "rows": rows}

    def restore_state(self, state: dict) -> None:
        self._last = state.get("last_row")
        rows = state.get("rows")
        if rows is None:  # written before every row was kept: the last one only
            rows = {} if not self._last else {self._last["epoch"]: self._last["line"]}
        self._rows = {int(epoch): line for epoch, line in rows.items()}

    def _saved_rows(self) -> dict[int, str]:
        """The rows written so far (and restored), by epoch from 1 (a subclass that did
        not call ``__init__`` starts with none)."""
        return self.__dict__.setdefault("_rows", {})

    def _wrote(self, epoch: int, line: str, **more) -> None:
        """Keep epoch ``epoch``'s row (from 1), as written, for the checkpoints."""
        self._last = {"epoch": epoch, "line": line, **more}
        self._saved_rows()[epoch] = line

    def on_fit_start(self, run: Run) -> None:
        if self.path is None:
            if run.run_dir is None:
                raise ConfigError(f"{type(self).__name__} needs a path or a run with a run_dir")
            self.path = Path(run.run_dir) / self.filename
        if run.resumed_from is None:  # a new run: no row of another one
            self._last, self._rows = None, {}
        with writing(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if run.resumed_from is None or not run.worker.is_chief:
                return  # the other workers of a multi-worker run write a dir thrown away
            if run.epoch < run.epochs:
                self.drop_after(run.epoch)
            else:
                self._left_as_it_is(run.epoch)

    def drop_after(self, epochs: int) -> None:
        """Make the file hold the rows of the first ``epochs`` epochs, each once: a
        resumed run rewrites the epochs its checkpoint did not include (written before a
        crash), so the rows after them go. A torn line (the run was killed while writing
        it: no newline, or not a row) goes too; a row of those epochs the file lacks (torn,
        deleted, or the file deleted) is written back from the checkpoint. One warning
        says what was dropped and written back, and what could not be."""
        lines = self._lines()
        kept, torn, missing = self._sorted_out(lines or [], epochs)
        saved = self._saved_rows()
        back = {epoch: saved[epoch] for epoch in missing if epoch in saved}
        lost = [epoch for epoch in missing if epoch not in saved]
        if back:
            kept = self._with_rows(kept, back)
        for line in kept:  # what the checkpoints lacked, as the file holds it
            epoch = self._epoch_of(line)
            if isinstance(epoch, int):
                saved.setdefault(epoch, line)
        if torn or back or lost:
            if lines is None:
                found = "the file was missing (deleted, or moved)"
            elif torn:
                found = f"dropped {torn} torn line(s) (a run killed while writing them)"
            else:
                found = f"{_rows_of(missing, 'was')} missing (deleted, or the file cut short)"
            done = []
            if back and lines is not None and not torn and list(back) == missing:
                they = "it is" if len(back) == 1 else "they are"
                done.append(f"{they} written back from the checkpoint")
            elif back:
                done.append(f"{_rows_of(list(back), 'is')} written back from the checkpoint")
            if lost:
                done.append(_not_kept(lost, self._last))
            if torn:
                done.append(f"the rows after epoch {epochs}, the checkpoint's, are written again")
            self._warn(f"{self.path}: {found}; {', and '.join(done)}")
        if kept != (lines or []):
            replace_file(self.path, "".join(kept))

    def _left_as_it_is(self, epochs: int) -> None:
        """A resume with nothing to train writes nothing: a file lacking rows of the
        checkpoint's ``epochs`` epochs, or holding a torn line, is only named (once),
        with what a run with more epochs will do about it."""
        lines = self._lines()
        _, torn, missing = self._sorted_out(lines or [], epochs)
        if not (torn or missing):
            return
        if lines is None:
            found = f"{self.path} is missing (deleted, or moved)"
        else:
            parts = [f"holds {torn} torn line(s) (a run killed while writing them)"] if torn else []
            if missing:
                parts.append(f"lacks {_rows_of(missing)}")
            found = f"{self.path} {' and '.join(parts)}"
        saved = self._saved_rows()
        back = [epoch for epoch in missing if epoch in saved]
        lost = [epoch for epoch in missing if epoch not in saved]
        later = ["drops the torn line(s)"] if torn else []
        if back:
            later.append(f"writes {_rows_of(back)} back from the checkpoint")
        advice = f"; a run with a higher --epochs (epochs=) {' and '.join(later)}" if later else ""
        if lost:
            advice += f"; {_not_kept(lost, self._last)}"
        message = (
            f"{found}: nothing is written, since there is nothing to train (the run dir holds "
            f"the {epochs} epoch(s) asked for){advice}"
        )
        self._warn(NothingWrittenWarning(message, found=found, advice=advice))

    def _lines(self) -> list[str] | None:
        """The file's lines, line ends kept; ``None`` when there is no file."""
        if not self.path.exists():
            return None
        with self.path.open(encoding="utf-8", newline="") as handle:  # line ends kept
            return handle.read().splitlines(keepends=True)

    def _sorted_out(self, lines: list[str], epochs: int) -> tuple[list[str], int, list[int]]:
        """The lines to keep (headers and the rows of epochs 1 to ``epochs``), how many
        are torn, and the epochs from 1 to ``epochs`` that no kept row records."""
        kept, torn, recorded = [], 0, set()
        for line in lines:
            epoch = self._epoch_of(line)
            if epoch is _TORN:
                torn += 1
            elif epoch is None or 1 <= epoch <= epochs:
                kept.append(line)
                recorded.add(epoch)
        return kept, torn, [epoch for epoch in range(1, epochs + 1) if epoch not in recorded]

    def _with_rows(self, kept: list[str], rows: Mapping[int, str]) -> list[str]:
        """``kept`` with ``rows`` (by epoch) put in: the headers first (a header made for
        them when ``kept`` has none), then every row in the order of its epoch."""
        headers = [line for line in kept if self._epoch_of(line) is None]
        ordered = sorted(
            [(self._epoch_of(line), 1, line) for line in kept if line not in headers]
            + [(epoch, 0, line) for epoch, line in rows.items()],
            key=lambda row: row[:2],
        )
        made = [] if headers else [self.header(kept)]
        return [*headers, *(line for line in made if line), *(line for *_, line in ordered)]

    @staticmethod
    def _warn(message: str | Warning) -> None:
        warnings.warn(message, RuntimeWarning, stacklevel=4)  # on_fit_start's caller

    def header(self, kept: list[str]) -> str:
        """What a row written back after the ``kept`` lines needs before it (a header)."""
        return ""

    def _epoch_of(self, line: str):
        """``row_epoch(line)``, or ``_TORN`` for a line cut short."""
        if not line.endswith("\n"):
            return _TORN
        try:
            return self.row_epoch(line)
        except (ValueError, KeyError, TypeError):
            return _TORN

    @staticmethod
    def row_epoch(line: str) -> int | None:
        """The epoch a row records (``None`` for a header)."""
        raise NotImplementedError

    @staticmethod
    def row(run: Run, epoch: int, logs: Mapping[str, float]) -> dict:
        """The epoch (from 1), the step count, then every logged figure."""
        return {"epoch": epoch + 1, "step": run.step, **logs}


class JsonLinesLogger(EpochLogFile):
    """Appends one JSON object per epoch (epoch, step and every logged figure) to
    ``history.jsonl`` in the run dir: each line one write, flushed to the disk, so a
    crash loses nothing and tears at most the line being written."""

    callback_name = "jsonl"
    filename = "history.jsonl"

    @staticmethod
    def row_epoch(line: str) -> int | None:
        return json.loads(line)["epoch"] if line.strip() else -1

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        row = {k: _jsonable(v) for k, v in self.row(run, epoch, logs).items()}
        line = json.dumps(row) + "\n"
        append_line(self.path, line)
        self._wrote(epoch + 1, line)


class CsvLogger(EpochLogFile):
    """Writes ``history.csv`` in the run dir: a header, then one row per epoch."""

    callback_name = "csv"
    filename = "history.csv"

    def __init__(self, path: str | Path | None = None):
        super().__init__(path)
        self._fields: list[str] | None = None

    @staticmethod
    def row_epoch(line: str) -> int | None:
        first = line.split(",", 1)[0].strip()
        return int(first) if first.isdigit() else None

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        row = self.row(run, epoch, logs)
        new_file = not self.path.exists() or self.path.stat().st_size == 0
        if self._fields is None:
            self._fields = list(row)
        line = self._text(lambda writer: writer.writerow(row))
        append_line(self.path, (self._text_header() if new_file else "") + line)  # one write
        self._wrote(epoch + 1, line, fields=self._fields)

    def restore_state(self, state: dict) -> None:
        super().restore_state(state)
        if self._last is not None and self._last.get("fields"):
            self._fields = list(self._last["fields"])

    def header(self, kept: list[str]) -> str:
        if self._fields is None or any(self.row_epoch(line) is None for line in kept):
            return ""
        return self._text_header()

    def _text_header(self) -> str:
        return self._text(lambda writer: writer.writeheader())

    def _text(self, write) -> str:
        """What ``write(writer)`` writes with a CSV writer of this file's fields."""
        text = io.StringIO(newline="")
        write(csv.DictWriter(text, fieldnames=self._fields, extrasaction="ignore"))
        return text.getvalue()


class EarlyStopping(Callback):
    """Stops a run when a logged figure has not improved for ``patience`` epochs, and
    (``restore_best``) puts back every model's weights from the best epoch.

    ``mode``: ``"min"``, ``"max"``, or ``"auto"`` (max for names with accuracy, auc, ks or
    score in them, min otherwise). An improvement must beat the best by ``min_delta``.
    """

    callback_name = "early_stopping"

    def __init__(
        self,
        monitor: str = "val_loss",
        mode: str = "auto",
        patience: int = 3,
        min_delta: float = 0.0,
        restore_best: bool = True,
    ):
        if mode not in ("min", "max", "auto"):
            raise ConfigError(f"EarlyStopping mode must be 'min', 'max' or 'auto', got {mode!r}")
        if patience < 1 or min_delta < 0:
            raise ConfigError("EarlyStopping needs patience >= 1 and min_delta >= 0")
        if mode == "auto":
            higher = ("accuracy", "auc", "ks", "score")
            mode = "max" if any(word in monitor for word in higher) else "min"
        self.monitor, self.mode, self.patience = monitor, mode, patience
        self.min_delta, self.restore_best = min_delta, restore_best
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.stopped_epoch: int | None = None
        self._waited = 0
        self._best_weights: dict[str, list] | None = None

    def _improved(self, value: float) -> bool:
        if self.best is None:
            return math.isfinite(value)
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        if self.monitor in run.missing_figures:  # an epoch that trained nothing: no count
            return
        if self.monitor not in logs:
            raise ConfigError(
                f"EarlyStopping monitors {self.monitor!r}, which this run does not log; "
                f"logged: {', '.join(logs)}"
            )
        value = logs[self.monitor]
        if self._improved(value):
            self.best, self.best_epoch, self._waited = value, epoch, 0
            if self.restore_best:
                self._best_weights = {n: m.get_weights() for n, m in run.models.items()}
            return
        self._waited += 1
        if self._waited >= self.patience:
            self.stopped_epoch = epoch
            run.stop_training = True

    def checkpoint_state(self) -> dict:
        weights = self._best_weights
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "stopped_epoch": self.stopped_epoch,
            "waited": self._waited,
            "best_weights": None
            if weights is None
            else {n: encode_arrays(w) for n, w in weights.items()},
        }

    def restore_state(self, state: dict) -> None:
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.stopped_epoch, self._waited = state["stopped_epoch"], state["waited"]
        weights = state["best_weights"]
        self._best_weights = (
            None if weights is None else {n: decode_arrays(w) for n, w in weights.items()}
        )

    def on_fit_end(self, run: Run, logs: Mapping[str, float]) -> None:
        if self.restore_best and self._best_weights is not None:
            for name, weights in self._best_weights.items():
                run.models[name].set_weights(weights)
