"""Experiment tracking in MLflow: a run's params, per-epoch figures, schedule and files
logged to an MLflow tracking store (``fit(callbacks=[MlflowLogger()])``, ``beatloop run
--callback mlflow``, ``beatloop tune --callback mlflow``). MLflow is the optional
``[mlflow]`` extra, imported when a run starts, never with beatloop."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import attrs

from beatloop import Callback, ConfigError, Order, Run, RunInterrupted
from beatloop.callbacks.mlflow_store import (
    experiment_name,
    not_answering,
    open_store,
    tracking_uri,
)
from beatloop.callbacks.mlflow_worker import (
    StoreStalled,
    StoreWorker,
    TrackingWarning,
    store_seconds,
)

#: Seconds a run stopped by Ctrl-C or SIGTERM gives its store to take the status KILLED.
INTERRUPTED_SECONDS = 1.0


class MlflowLogger(Callback):
    """Logs the run to MLflow: params (recipe, ``config.FIELD``, seed, precision,
    ``steps_per_execution``, versions; ``params`` adds more), every epoch figure with
    step = the epoch counted from 1 (``history.jsonl``'s numbering), the schedule
    (``schedule.txt`` and the run's description), and at the end ``run.json``, the run
    dir's pictures and, with ``keep_best``, the best epoch's models as ``beatloop export
    --best`` writes them, written by this process from the best checkpoint's weights
    (``log_best=False``: not).

    The store: ``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the SQLite file
    ``mlflow/mlflow.db`` in the run dir's parent folder, so every run under ``runs/`` (and
    every trial of a study) lands in one store to compare, and no server is needed. The
    experiment: ``experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else the recipe's name;
    the run's name: ``run_name``, else the run dir's. ``parent_run_id`` nests the run.

    Every call to the store is made by a thread of its own and may take ``timeout``
    seconds (else ``BEATLOOP_MLFLOW_TIMEOUT``, else 10): training never waits for the
    store. A store that cannot be reached, or does not answer within that, when the run
    starts is a ``ConfigError`` before its first step: a run asked to be tracked and
    trained untracked is lost data. One that fails or stops answering mid-run is a single
    ``TrackingWarning``, and the run trains on without it. A resumed run continues its
    MLflow run (its id is in every checkpoint) and sends the epochs it holds that are not
    there yet, none twice. In a multi-worker run only the chief logs.
    """

    callback_name = "mlflow"
    order = Order.WRITER

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        *,
        log_best: bool = True,
        parent_run_id: str | None = None,
        params: Mapping[str, object] | None = None,
        timeout: float | None = None,
    ):
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.log_best, self.parent_run_id = log_best, parent_run_id
        self.params = dict(params or {})
        #: Seconds one call to the store may take (``None``: ``BEATLOOP_MLFLOW_TIMEOUT``, 10).
        self.timeout = None if timeout is None else store_seconds(timeout)
        #: The MLflow run's id, once the run started (kept in checkpoints: a resume goes on).
        self.run_id: str | None = None
        self._uri: str | None = None
        self._client = None  # None: not logging (not the chief, or the store failed)
        self._worker: StoreWorker | None = None  # makes every call to the store
        self._scratch: list[Path] = []  # folders of files being sent, removed at the end
        self._restored: dict | None = None
        self._logged: dict[str, set[int]] = {}  # steps a resumed MLflow run holds
        self._nonfinite: dict[str, list[str]] = {}
        self._chosen: int | None = None

    def checkpoint_state(self) -> dict | None:
        return None if self.run_id is None else {"run_id": self.run_id, "tracking_uri": self._uri}

    def restore_state(self, state: dict) -> None:
        self._restored = dict(state)

    def on_fit_start(self, run: Run) -> None:
        self._close()
        self.run_id, self._logged, self._nonfinite = None, {}, {}
        if not run.worker.is_chief:
            return
        self._uri = tracking_uri(self.tracking_uri, run.run_dir)
        name = experiment_name(self.experiment, run.recipe.name)
        self._worker = StoreWorker(store_seconds(self.timeout))
        try:
            self._client, experiment_id = open_store(self._uri, name, self._worker)
            self._open_run(run, experiment_id)
        except BaseException:
            self._close()
            raise

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        if not self._tracking():
            return
        from mlflow.entities import Metric, RunTag

        step, now = epoch + 1, int(time.time() * 1000)
        metrics, tags = [], {}
        for name, value in logs.items():
            value = float(value)
            if step in self._logged.get(name, ()):
                continue  # logged before the resume's checkpoint: the same value, kept
            if math.isfinite(value):
                metrics.append(Metric(name, value, now, step))
            else:  # MLflow keeps NaN but clips infinities: neither is a point on a chart
                self._nonfinite.setdefault(name, []).append(f"epoch {step}: {value}")
                tags[f"beatloop.nonfinite.{name}"] = ", ".join(self._nonfinite[name][-50:])
        tagged = [RunTag(key, value) for key, value in {**tags, **self._chosen_tag(run)}.items()]
        client, run_id = self._client, self.run_id
        self._worker.send(lambda: client.log_batch(run_id, metrics=metrics, tags=tagged))

    def on_fit_end(self, run: Run, logs: Mapping[str, float]) -> None:
        if not self._tracking():
            return
        client, run_id, send = self._client, self.run_id, self._worker.send
        if run.run_dir is not None and (Path(run.run_dir) / "run.json").is_file():
            send(lambda: client.log_artifact(run_id, str(Path(run.run_dir) / "run.json")))
        for path, folder in _pictures(run):
            send(lambda p=path, f=folder: client.log_artifact(run_id, str(p), f or None))
        for key, value in self._chosen_tag(run).items():
            send(lambda k=key, v=value: client.set_tag(run_id, k, v))
        if self.log_best:
            try:
                self._send_best(run)
            except Exception as error:  # the best's record or files unreadable: not logged
                self._give_up(_described(error))
                return
        send(lambda: client.set_terminated(run_id, "FINISHED"))
        self._finish("sending the run's files and its end")

    def on_exception(self, run: Run, error: BaseException) -> None:
        if not self._tracking():
            return
        status = "KILLED" if isinstance(error, RunInterrupted) else "FAILED"
        client, run_id = self._client, self.run_id
        self._worker.send(lambda: client.set_terminated(run_id, status))
        within = INTERRUPTED_SECONDS if isinstance(error, RunInterrupted) else None
        self._finish(f"sending the run's status {status}", within)

    def _open_run(self, run: Run, experiment_id: str) -> None:
        """The MLflow run this run logs to, continued or started, each request bounded
        (``StoreWorker.ask``): a ConfigError, still before training, when one fails."""
        client, ask = self._client, self._worker.ask
        try:
            self.run_id = ask(lambda: self._continued(run), "looking for the run to continue")
            if self.run_id is None:
                self._start(run, experiment_id)
                return
            run_id = self.run_id
            ask(lambda: client.update_run(run_id, status="RUNNING"), "marking it running")
            self._logged = ask(lambda: _steps_logged(client, run_id), "reading its steps")
        except StoreStalled as error:
            raise not_answering(self._uri, error) from error
        except ConfigError:
            raise
        except Exception as error:  # the store opened, then refused: still before training
            raise ConfigError(
                f"the MLflow tracking store {self._uri} refused this run's start "
                f"({_described(error)}); the run did not start"
            ) from error
        for epoch, logs in _history(run):  # those a stalled store missed are sent now
            self.on_epoch_end(run, epoch, logs)

    def _chosen_tag(self, run: Run) -> dict[str, str]:
        """The K ``"auto"`` chose, as a tag when it is new (a tag, not a param: a resume
        may choose another)."""
        chosen = run.chosen_steps_per_execution
        if chosen is None or chosen == self._chosen:
            return {}
        self._chosen = chosen
        return {"beatloop.chosen_steps_per_execution": str(chosen)}

    def _continued(self, run: Run) -> str | None:
        """The MLflow run a resumed run continues: its checkpoint's, when it is in this
        store and not deleted (else the resume starts a new MLflow run)."""
        from mlflow.exceptions import MlflowException

        state, self._restored = self._restored, None
        if run.resumed_from is None or not state or state.get("tracking_uri") != self._uri:
            return None
        try:
            found = self._client.get_run(state["run_id"])
        except MlflowException:
            return None
        return None if found.info.lifecycle_stage == "deleted" else found.info.run_id

    def _start(self, run: Run, experiment_id: str) -> None:
        """A new MLflow run: its params, schedule and tags; a run resumed from epochs
        trained without this logger gets those epochs' figures from ``history.jsonl``."""
        from mlflow.entities import Param

        client, ask, recorded = self._client, self._worker.ask, _recorded(run)
        schedule = "\n".join(recorded.get("schedule") or [run.bound.schedule.describe()])
        tags = {
            "beatloop.recipe": run.recipe.name,
            "mlflow.note.content": f"beatloop recipe `{run.recipe.name}`, its schedule:\n\n"
            f"```\n{schedule}\n```",
        }
        if run.run_dir is not None:
            tags["beatloop.run_dir"] = str(Path(run.run_dir).resolve())
        if self.parent_run_id is not None:
            parent = self.parent_run_id
            experiment_id = ask(lambda: client.get_run(parent).info.experiment_id, "its parent")
            tags["mlflow.parentRunId"] = parent
        name = self.run_name or (Path(run.run_dir).name if run.run_dir else run.recipe.name)
        made = ask(lambda: client.create_run(experiment_id, run_name=name, tags=tags), "a run")
        self.run_id = run_id = made.info.run_id
        params = [Param(k, str(v)) for k, v in {**run_params(run, recorded), **self.params}.items()]
        for start in range(0, len(params), 100):  # MLflow takes 100 params per batch
            batch = params[start : start + 100]
            ask(lambda b=batch: client.log_batch(run_id, params=b), "logging the params")
        ask(lambda: client.log_text(run_id, schedule + "\n", "schedule.txt"), "the schedule")
        for epoch, logs in _history(run):
            self.on_epoch_end(run, epoch, logs)

    def _send_best(self, run: Run) -> None:
        """The best epoch's models (``keep_best``) as ``best/``, as ``beatloop export
        --best`` writes them: written here, by the process that trained (it has the
        recipe, registered in a script or not), from the live models with the best
        checkpoint's weights, its own put back after (``Run.export``), then sent. Where
        they cannot be written (a recipe with no inference model), the best checkpoint's
        files as ``best_checkpoint/``, and the tag ``beatloop.best_export`` says why."""
        best = _recorded(run).get("best")
        if not isinstance(best, dict) or not best.get("checkpoint"):
            return
        client, run_id, send = self._client, self.run_id, self._worker.send
        summary = f"{best['figure']}:{best['mode']} epoch {best['epoch']} = {best['value']:.6g}"
        send(lambda: client.set_tag(run_id, "beatloop.best", summary))
        folder = Path(tempfile.mkdtemp(prefix="beatloop-best-"))
        self._scratch.append(folder)
        try:
            run.export(folder / "best", checkpoint=best["checkpoint"])
        except Exception as error:  # whatever writing it raised: the files instead
            why = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
        else:
            send(lambda: client.log_artifacts(run_id, str(folder / "best"), "best"))
            return
        send(lambda: client.set_tag(run_id, "beatloop.best_export", f"not exported: {why}"[:5000]))
        checkpoints = Path(run.run_dir) / "checkpoints"
        for path in sorted(checkpoints.glob(f"{best['checkpoint']}.*")):
            send(lambda p=path: client.log_artifact(run_id, str(p), "best_checkpoint"))

    def _tracking(self) -> bool:
        """Whether the logger still logs: not once a call to the store failed or ran
        longer than its bound (then one TrackingWarning says so)."""
        if self._client is None:
            return False
        error = self._worker.failure()
        if error is not None:
            self._give_up(_described(error))
        elif self._worker.stalled():
            self._give_up(f"no answer within {self._worker.seconds:g} s")
        return self._client is not None

    def _finish(self, what: str, within: float | None = None) -> None:
        """Wait until the store took every call sent (each within its bound, all within
        ``within`` seconds), then let the worker go; one TrackingWarning if it did not."""
        try:
            if not self._worker.finish(what, within):
                self._give_up(f"no answer within {self._worker.seconds:g} s ({what})")
            else:
                self._tracking()
        finally:
            self._close()

    def _give_up(self, reason: str) -> None:
        """The store failed: one TrackingWarning, and no call to it from here on."""
        warnings.warn(
            f"MLflow stopped taking this run's figures ({reason}); the run goes on untracked "
            f"from here (MLflow run {self.run_id} in {self._uri}): its figures stay in "
            "history.jsonl, and a resume of the run dir sends those the store missed",
            TrackingWarning,
            stacklevel=3,
        )
        self._close()

    def _close(self) -> None:
        """No more calls to the store; the folders of files sent removed."""
        self._client = None
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        for folder in self._scratch:
            shutil.rmtree(folder, ignore_errors=True)
        self._scratch = []


def _described(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip()[:300]}"


def run_params(run: Run, recorded: Mapping) -> dict[str, object]:
    """The run's params: what ``run.json`` records when there is one, else the run's own."""
    config = recorded.get("config") or attrs.asdict(run.recipe.config)
    versions = dict(recorded.get("versions") or {})
    with contextlib.suppress(PackageNotFoundError):  # run from a checkout, not installed
        versions["beatloop"] = version("beatloop")
    model = next(iter(run.models.values()), None)
    return {
        "recipe": run.recipe.name,
        **{f"config.{field}": value for field, value in config.items()},
        "seed": run.seed,
        "precision": recorded.get("precision")
        or getattr(getattr(model, "dtype_policy", None), "name", None),
        "steps_per_execution": recorded.get("steps_per_execution")
        or ("auto" if run.pace.auto else run.pace.steps),
        **{f"version.{name}": value for name, value in versions.items()},
    }


def _recorded(run: Run) -> dict:
    """The run dir's ``run.json`` (``{}`` without one)."""
    path = None if run.run_dir is None else Path(run.run_dir) / "run.json"
    return json.loads(path.read_text(encoding="utf-8")) if path and path.is_file() else {}


def _steps_logged(client, run_id: str) -> dict[str, set[int]]:
    """Each metric's steps an MLflow run already holds."""
    keys = client.get_run(run_id).data.metrics
    return {key: {m.step for m in client.get_metric_history(run_id, key)} for key in keys}


def _history(run: Run) -> list[tuple[int, dict[str, float]]]:
    """The epochs a resumed run finished before, from its ``history.jsonl`` (epoch from 0,
    figures; a missing figure, null, was not finite)."""
    path = None if run.run_dir is None else Path(run.run_dir) / "history.jsonl"
    if run.epoch == 0 or path is None or not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [
        (
            row["epoch"] - 1,
            {k: v for k, v in row.items() if k not in ("epoch", "step") and v is not None},
        )
        for row in rows
        if 1 <= row.get("epoch", 0) <= run.epoch
    ]


def _pictures(run: Run) -> list[tuple[Path, str]]:
    """The pictures a run wrote (PNG files in its run dir, and its ``artifacts``), each
    with its folder in the run dir (``samples`` for ``samples/epoch_001.png``)."""
    found: dict[Path, str] = {}
    if run.run_dir is not None:
        root = Path(run.run_dir).resolve()
        for path in sorted(root.rglob("*.png")):
            folder = path.parent.relative_to(root)
            if folder.parts[:1] not in (("checkpoints",), ("tensorboard",)):
                found[path] = "" if folder == Path() else folder.as_posix()
    for path in run.artifacts.values():
        if Path(path).is_file():
            found.setdefault(Path(path).resolve(), "")
    return list(found.items())
