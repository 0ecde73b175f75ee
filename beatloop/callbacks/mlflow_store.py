"""Where ``MlflowLogger`` logs: the tracking URI (given, ``MLFLOW_TRACKING_URI``, or an
SQLite store beside the run dir), the store opened and checked before a run trains, the
experiment found or made, and the parent run of a ``beatloop tune`` study.

MLflow is imported here only when a store is opened: importing beatloop never imports it
(it is the optional ``[mlflow]`` extra)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from beatloop import ConfigError
from beatloop.callbacks.mlflow_worker import (
    TIMEOUT_VARIABLE,
    StoreStalled,
    StoreWorker,
    TrackingWarning,
    store_seconds,
)

#: The default store's folder, in the run dir's parent: ``runs/a`` and ``runs/b`` (and a
#: study's trials) land in one store, ``runs/mlflow/mlflow.db``, to compare side by side.
STORE_FOLDER = "mlflow"


def mlflow_module():
    """MLflow, imported now; a ConfigError saying how to install it when it is missing."""
    try:
        import mlflow
    except ImportError as error:
        raise ConfigError(
            "the mlflow callback needs MLflow, which comes with the mlflow extra: "
            "pip install 'beatloop[mlflow]' (mlflow-skinny, with SQLite support)"
        ) from error
    return mlflow


def tracking_uri(given: str | None, run_dir: Path | None) -> str:
    """The store a run logs to: ``given``, else ``MLFLOW_TRACKING_URI``, else the SQLite
    file ``mlflow/mlflow.db`` in the run dir's parent (in the current folder without a run
    dir). SQLite, not MLflow's ``./mlruns`` file store: MLflow 3 refuses that one."""
    uri = given or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    near = Path(run_dir).resolve().parent if run_dir is not None else Path.cwd()
    return f"sqlite:///{near / STORE_FOLDER / 'mlflow.db'}"


def experiment_name(given: str | None, recipe: str) -> str:
    """``given``, else ``MLFLOW_EXPERIMENT_NAME``, else the recipe's name."""
    return given or os.environ.get("MLFLOW_EXPERIMENT_NAME") or recipe


def _database(uri: str) -> Path | None:
    """The file of a local ``sqlite:///PATH`` URI (``None`` for any other store)."""
    path = uri.removeprefix("sqlite:///")
    return None if path == uri or not path or path.startswith(":memory:") else Path(path)


def open_store(uri: str, experiment: str, worker: StoreWorker):
    """A client of the store at ``uri`` and the id of ``experiment`` there (made if new),
    checked now through ``worker``: a store that cannot be reached, opened, or does not
    answer within ``worker.seconds`` is a ConfigError naming the URI and the reason (its
    cause kept), before the run trains a step. A local SQLite file is waited for as long
    as it takes: a new one's tables take some ten seconds to make."""
    mlflow_module()
    from mlflow.tracking import MlflowClient

    _probe(uri, worker.seconds)
    database = _database(uri)
    if database is not None:
        _need_sqlalchemy(uri)

    def opened():
        with _creating(database):
            client = MlflowClient(tracking_uri=uri, registry_uri=uri)
            return client, _experiment_id(client, experiment, uri, database)

    try:
        found = f"finding the experiment {experiment!r}"
        return worker.ask(opened, found, bounded=database is None)
    except ConfigError:
        raise
    except StoreStalled as error:
        raise not_answering(uri, error) from error
    except Exception as error:  # any store's failure: SQL, HTTP, files, MLflow's own
        raise ConfigError(
            f"the MLflow tracking store {uri} cannot be used ({type(error).__name__}: "
            f"{_first_line(error)}); the run did not start: fix or start the store, or "
            "log elsewhere (MLFLOW_TRACKING_URI, MlflowLogger(tracking_uri=...))"
        ) from error


def not_answering(uri: str, error: StoreStalled, what: str = "the run") -> ConfigError:
    """The ConfigError of a store that did not answer a request of a run's start."""
    return ConfigError(
        f"the MLflow tracking store {uri} gave {error}; {what} did not start: "
        f"check the server, give it longer ({TIMEOUT_VARIABLE}=SECONDS, "
        "MlflowLogger(timeout=...)), or log elsewhere (MLFLOW_TRACKING_URI, "
        "MlflowLogger(tracking_uri=...))"
    )


def _probe(uri: str, seconds: float) -> None:
    """An ``http(s)`` server's port connected to at once, within ``seconds``: MLflow's
    own client retries a refused request with backoff for minutes before it gives up."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=seconds).close()
    except OSError as error:
        raise ConfigError(
            f"the MLflow tracking server {uri} cannot be reached ({error}); the run did not "
            "start: start the server, or log elsewhere (MLFLOW_TRACKING_URI, "
            "MlflowLogger(tracking_uri=...); unset, an SQLite file beside the run dir)"
        ) from error


def _need_sqlalchemy(uri: str) -> None:
    try:
        import alembic  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            f"the MLflow store {uri} is an SQLite file, which needs SQLAlchemy and Alembic "
            "(mlflow-skinny leaves them out): pip install 'beatloop[mlflow]'"
        ) from error


@contextlib.contextmanager
def _creating(database: Path | None) -> Iterator[None]:
    """An SQLite store's folder made, and its tables and experiments made by one process
    at a time (runs started together on one new store would race to create them)."""
    if database is None:
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(database.parent / f"{database.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _experiment_id(client, name: str, uri: str, database: Path | None) -> str:
    """The id of experiment ``name``, made if there is none; a new one in an SQLite store
    keeps its artifacts beside the file (MLflow's default is ``./mlruns`` in whichever
    folder the run was started from)."""
    found = client.get_experiment_by_name(name)
    if found is None:
        folder = None if database is None else (database.parent / "artifacts").resolve()
        return client.create_experiment(name, None if folder is None else folder.as_uri())
    if found.lifecycle_stage == "deleted":
        raise ConfigError(
            f"MLflow experiment {name!r} is deleted in {uri}: restore it "
            "(mlflow experiments restore) or log to another (MLFLOW_EXPERIMENT_NAME, "
            "MlflowLogger(experiment=...))"
        )
    return found.experiment_id


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


def study_run(recipe: str, study: str, key: str, params: Mapping[str, object], near: Path) -> str:
    """The id of a ``beatloop tune`` study's MLflow run, the parent its trials' runs nest
    in: the one tagged with the study's ``key`` (a continued study), else a new one with
    the study's ``params``. It is in the store the trials log to by default (their run
    dirs' parent is ``near``), and running until ``end_study_run``. Each request is
    bounded as a run's start is (``BEATLOOP_MLFLOW_TIMEOUT``)."""
    from mlflow.entities import Param

    uri, worker = tracking_uri(None, near / "trial"), StoreWorker(store_seconds(None))
    tag = hashlib.sha256(key.encode()).hexdigest()[:24]
    try:
        client, experiment = open_store(uri, experiment_name(None, recipe), worker)

        def started() -> str:
            query = f"tags.`beatloop.study` = '{tag}'"
            found = client.search_runs([experiment], query, max_results=1)
            if found:
                client.update_run(found[0].info.run_id, status="RUNNING")
                return found[0].info.run_id
            tags = {"beatloop.study": tag}
            made = client.create_run(experiment, run_name=f"study {study}", tags=tags)
            given = [Param(name, str(value)) for name, value in params.items()]
            client.log_batch(made.info.run_id, params=given)
            return made.info.run_id

        return worker.ask(started, "starting the study's run")
    except StoreStalled as error:
        raise not_answering(uri, error, "the study") from error
    finally:
        worker.close()


def end_study_run(run_id: str, near: Path, status: str = "FINISHED") -> None:
    """Mark a study's run ended (``FINISHED``, ``FAILED``, ``KILLED``); a store that does
    not answer within ``BEATLOOP_MLFLOW_TIMEOUT`` is a TrackingWarning (its trials ended)."""
    from mlflow.tracking import MlflowClient

    uri, worker = tracking_uri(None, near / "trial"), StoreWorker(store_seconds(None))
    try:
        worker.ask(lambda: MlflowClient(uri).set_terminated(run_id, status), "ending the study")
    except StoreStalled as error:
        warnings.warn(
            f"the MLflow tracking store {uri} gave {error}; the study's MLflow run "
            f"{run_id} is left RUNNING there (its trials' runs are logged)",
            TrackingWarning,
            stacklevel=2,
        )
    finally:
        worker.close()
