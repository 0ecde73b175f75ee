"""A tracking store that does not answer never holds up a run: real sockets in this
process, one that accepts and never answers, and a small MLflow tracking server (its
REST calls answered from a real SQLite store) that answers slowly or stops answering
mid-run. The start is a ConfigError within the bound, mid-run a warning and the run
goes on, Ctrl-C and SIGTERM end a run waiting on its store at once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from helpers import history_records, start_python
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.proto_json_utils import message_to_json

import beatloop
from beatloop.callbacks.mlflow import MlflowLogger, TrackingWarning

SMALL = {"batch_size": 256}


@pytest.fixture(autouse=True)
def no_tracking_settings(monkeypatch):
    """The tests choose their stores: none of the user's MLflow settings leaks in."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("BEATLOOP_MLFLOW_TIMEOUT", raising=False)


@pytest.fixture(autouse=True)
def no_call_left_behind(monkeypatch):
    """A call a test's store never answered ends when the test closes that store (MLflow
    retries nothing here): left retrying, its backoff jitter would draw from Python's
    ``random`` while later tests in this process build models from it."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    before = set(threading.enumerate())
    yield  # the test's stores are closed before this resumes (set up after it)
    left = [t for t in set(threading.enumerate()) - before if t.name == "beatloop-mlflow"]
    for thread in left:
        thread.join(timeout=30)
    assert not [t for t in left if t.is_alive()], "a call to a closed store still waits"


class Silent:
    """A socket that accepts connections and never answers (a hung server, a stalled
    proxy); ``asked`` is set once a request's bytes arrived."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.uri = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.asked, self.held = threading.Event(), []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:  # closed
                return
            self.held.append(connection)
            connection.settimeout(30)
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection):
        try:
            if connection.recv(65536):
                self.asked.set()
        except OSError:
            pass

    def close(self):
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes the thread waiting in accept
        self.socket.close()
        for connection in self.held:
            connection.close()


@pytest.fixture
def silent():
    server = Silent()
    yield server
    server.close()


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An SQLite store with MLflow's tables, made once (a new one takes some 10 s)."""
    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


class Tracker(ThreadingHTTPServer):
    """An MLflow tracking server as MLflow's client sees it, for the calls the logger
    makes, each answered from a real SQLite store after ``delay`` seconds; after
    ``stall()`` it holds every request until ``answer()``, then refuses those it held
    (a 400, which MLflow does not retry) and answers again."""

    daemon_threads = True

    def __init__(self, folder: Path, empty_store: Path):
        super().__init__(("127.0.0.1", 0), _Answer)
        shutil.copy(empty_store, folder / "tracker.db")
        self.client = MlflowClient(f"sqlite:///{folder / 'tracker.db'}")
        self.artifacts = (folder / "artifacts").as_uri()
        self.uri = f"http://127.0.0.1:{self.server_address[1]}"
        self.delay, self.answered = 0.0, []
        self._stalling, self._released = False, threading.Event()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stall(self):
        self._released.clear()
        self._stalling = True

    def answer(self):
        self._stalling = False
        self._released.set()

    def close(self):
        self.answer()
        self.shutdown()
        self.server_close()

    def call(self, name: str, body: dict) -> dict:
        """The REST call ``name`` (``runs/create``, ...) made on the SQLite store."""
        client, run_id = self.client, body.get("run_id")
        if name == "experiments/get-by-name":
            found = client.get_experiment_by_name(body["experiment_name"])
            return {"experiment": _json(found)} if found else None
        if name == "experiments/create":
            return {"experiment_id": client.create_experiment(body["name"], self.artifacts)}
        if name == "runs/create":
            tags = {tag["key"]: tag["value"] for tag in body.get("tags", [])}
            made = client.create_run(body["experiment_id"], tags=tags, run_name=body["run_name"])
            return {"run": _json(made)}
        if name == "runs/get":
            return {"run": _json(client.get_run(run_id))}
        if name == "runs/log-batch":
            metrics = [Metric(m["key"], float(m["value"]), int(m["timestamp"]), int(m["step"]))
                       for m in body.get("metrics", [])]  # fmt: skip
            params = [Param(p["key"], p["value"]) for p in body.get("params", [])]
            tags = [RunTag(t["key"], t["value"]) for t in body.get("tags", [])]
            client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
            return {}
        if name == "runs/set-tag":
            client.set_tag(run_id, body["key"], body["value"])
            return {}
        if name == "runs/update":
            client.update_run(run_id, status=body.get("status"))
            return {"run_info": _json(client.get_run(run_id).info)}
        if name == "metrics/get-history":
            history = client.get_metric_history(run_id, body["metric_key"])
            return {"metrics": [_json(metric) for metric in history]}
        raise AssertionError(f"the test's tracker takes no {name}")


def _json(entity) -> dict:
    return json.loads(message_to_json(entity.to_proto()))


class _Answer(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        parts = urlsplit(self.path)
        self._answer(parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()})

    def do_POST(self):
        size = int(self.headers.get("Content-Length", 0))
        self._answer(self.path, json.loads(self.rfile.read(size) or b"{}"))

    def _answer(self, path: str, body: dict):
        tracker: Tracker = self.server
        if tracker._stalling:
            tracker._released.wait(60)
            return self._send(400, {"error_code": "INVALID_STATE", "message": "stalled"})
        time.sleep(tracker.delay)
        name = path.removeprefix("/api/2.0/mlflow/")
        answer = tracker.call(name, body)
        tracker.answered.append(name)
        if answer is None:
            return self._send(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no"})
        self._send(200, answer)

    def _send(self, status: int, answer: dict):
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def tracker(tmp_path, empty_store):
    server = Tracker(tmp_path, empty_store)
    yield server
    server.close()


def fit(run_dir: Path, *callbacks, epochs: int = 2, **options):
    return beatloop.fit("supervised", epochs=epochs, seed=3, config=SMALL, run_dir=run_dir,
                        progress=False, callbacks=list(callbacks), **options)  # fmt: skip


def test_a_server_that_accepts_and_never_answers_is_a_config_error_within_the_bound(
    tmp_path, silent
):
    run_dir = tmp_path / "digits"
    started = time.monotonic()
    with pytest.raises(beatloop.ConfigError, match="gave no answer within 1 s") as caught:
        fit(run_dir, MlflowLogger(tracking_uri=silent.uri, timeout=1))
    assert time.monotonic() - started < 20  # MLflow's own client waits 120 s, then retries
    message = str(caught.value)
    assert message.startswith(
        f"the MLflow tracking store {silent.uri} gave no answer within 1 s (finding the "
        "experiment 'supervised'); the run did not start: check the server, give it longer "
        "(BEATLOOP_MLFLOW_TIMEOUT=SECONDS"
    )
    assert silent.asked.is_set() and not run_dir.exists()  # nothing trained, nothing kept


class StallAt(beatloop.Callback):
    """Makes the tracker stop answering at epoch ``epoch``'s end (from 0), before the
    logger sends that epoch, once it answered the epochs before."""

    def __init__(self, tracker: Tracker, epoch: int):
        self.tracker, self.epoch = tracker, epoch

    def on_epoch_end(self, run, epoch, logs):
        if epoch == self.epoch:
            deadline = time.monotonic() + 10
            while self.tracker.answered.count("runs/log-batch") < 1 + epoch:  # params too
                assert time.monotonic() < deadline
                time.sleep(0.01)
            self.tracker.stall()


def logged(tracker: Tracker, run_id: str, key: str = "loss") -> list[int]:
    return [m.step for m in tracker.client.get_metric_history(run_id, key)]


def test_a_store_that_stops_answering_mid_run_is_one_warning_and_a_resume_sends_the_rest(
    tmp_path, tracker
):
    run_dir = tmp_path / "digits"
    logger = MlflowLogger(tracking_uri=tracker.uri, timeout=1, log_best=False)
    with pytest.warns(TrackingWarning) as caught:
        result = fit(run_dir, StallAt(tracker, 1), logger, epochs=3)
    assert result.epochs == 3 and len(caught) == 1
    message = str(caught[0].message)
    assert "(no answer within 1 s" in message and "the run goes on untracked" in message
    assert "history.jsonl, and a resume of the run dir sends those the store missed" in message
    assert [row["epoch"] for row in history_records(run_dir)] == [1, 2, 3]
    assert logged(tracker, logger.run_id) == [1]  # epoch 1, before the store stalled
    assert tracker.client.get_run(logger.run_id).info.status == "RUNNING"
    # The store answers again: a resume continues the MLflow run, epochs 2 and 3 sent
    # from history.jsonl, then its own epoch.
    tracker.answer()
    again = MlflowLogger(tracking_uri=tracker.uri, timeout=5, log_best=False)
    fit(run_dir, again, epochs=4)
    assert again.run_id == logger.run_id
    assert logged(tracker, logger.run_id) == [1, 2, 3, 4]
    rows = {row["epoch"]: row["loss"] for row in history_records(run_dir)}
    history = tracker.client.get_metric_history(logger.run_id, "loss")
    assert {m.step: m.value for m in history} == pytest.approx(rows)
    assert tracker.client.get_run(logger.run_id).info.status == "FINISHED"


def test_a_slow_store_within_the_bound_is_logged_whole(tmp_path, tracker):
    tracker.delay = 0.2  # every request
    logger = MlflowLogger(tracking_uri=tracker.uri, timeout=2, log_best=False)
    fit(tmp_path / "digits", logger, epochs=2)
    run = tracker.client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and logged(tracker, logger.run_id) == [1, 2]
    # Slower than the bound at the start: refused within it, the run dir as it was.
    tracker.delay = 1.5
    with pytest.raises(beatloop.ConfigError, match=r"no answer within 0\.5 s \(finding"):
        fit(tmp_path / "other", MlflowLogger(tracking_uri=tracker.uri, timeout=0.5))
    assert not (tmp_path / "other").exists()


class Terminate(beatloop.Callback):
    """SIGTERM to this process at step ``step``, after the tracker stalled."""

    def __init__(self, tracker: Tracker, step: int):
        self.tracker, self.step = tracker, step

    def on_execution_end(self, run, steps, logs):
        if run.step == self.step:
            self.tracker.stall()
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_to_a_run_whose_store_stalled_checkpoints_and_ends_at_once(tmp_path, tracker):
    run_dir = tmp_path / "digits"
    logger = MlflowLogger(tracking_uri=tracker.uri, timeout=30, log_best=False)
    started = time.monotonic()
    with (
        pytest.warns(TrackingWarning, match="sending the run's status KILLED"),
        pytest.raises(beatloop.RunInterrupted) as stopped,
    ):
        fit(run_dir, logger, Terminate(tracker, 8), epochs=3, steps_per_execution=1)
    assert time.monotonic() - started < 25  # the store's 30 s bound not waited for
    assert stopped.value.exit_code == 143 and stopped.value.checkpoint is not None
    assert beatloop.restore(run_dir).steps == 8  # checkpointed, the lock released
    assert tracker.client.get_run(logger.run_id).info.status == "RUNNING"


def test_the_bound_is_a_number_of_seconds(monkeypatch, tmp_path):
    with pytest.raises(beatloop.ConfigError, match=r"timeout .* seconds > 0, got -1"):
        MlflowLogger(timeout=-1)
    monkeypatch.setenv("BEATLOOP_MLFLOW_TIMEOUT", "soon")
    with pytest.raises(beatloop.ConfigError, match=r"BEATLOOP_MLFLOW_TIMEOUT .* got 'soon'"):
        fit(tmp_path / "digits", MlflowLogger())
    assert not (tmp_path / "digits").exists()


@pytest.fixture
def usual_ctrl_c():
    """Ctrl-C handled as in a user's process (pytest-xdist's workers ignore SIGINT)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_ends_a_run_waiting_on_a_silent_store_at_once(tmp_path, silent, usual_ctrl_c):
    def interrupt():
        if silent.asked.wait(60):
            time.sleep(0.3)  # waiting on the store's answer
            signal.raise_signal(signal.SIGINT)

    run_dir = tmp_path / "digits"
    threading.Thread(target=interrupt, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(beatloop.RunInterrupted) as stopped:
        fit(run_dir, MlflowLogger(tracking_uri=silent.uri, timeout=30))
    assert time.monotonic() - started < 20
    assert str(stopped.value) == "interrupted while finding the experiment 'supervised'"
    assert stopped.value.exit_code == 130 and stopped.value.checkpoint is None
    assert not run_dir.exists()  # nothing trained: the run dir put back


@pytest.mark.slow
def test_sigterm_ends_a_run_waiting_on_a_silent_store_at_once(tmp_path, silent):
    run_dir = tmp_path / "digits"
    command = ["-m", "beatloop", "run", "supervised", "--run-dir", str(run_dir), "--epochs", "1"]
    command += ["--set", "batch_size=256", "--callback", "mlflow", "--quiet"]
    process = start_python(*command, MLFLOW_TRACKING_URI=silent.uri, BEATLOOP_MLFLOW_TIMEOUT="300")
    try:
        assert silent.asked.wait(240), process.communicate(timeout=5)
        time.sleep(0.3)  # waiting on the store's answer
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert time.monotonic() - sent < 10
    assert process.returncode == 143, err
    assert "stopped by SIGTERM while finding the experiment 'supervised'" in err
    assert not run_dir.exists()  # nothing trained: the run dir put back, its lock released
