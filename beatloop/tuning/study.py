"""Running a study: open it in its storage (made, or checked against the command that
made it), resume the trials a killed command left, and keep ``jobs`` trial processes
going until the study holds ``trials`` trials. Several commands, on one machine or
several sharing a storage URL, may run one study together: each asks the study for the
next trial, and a trial's process tells the study how it ended."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from beatloop.core.failures.errors import ConfigError
from beatloop.tuning.spec import StudySpec, spec_to_json

#: A trial's user attributes: the machine and the command that started it last.
HOST, PID = "host", "pid"


def _pruner(spec: StudySpec):
    import optuna

    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=spec.epochs)
    return optuna.pruners.NopPruner()


def _storage(spec: StudySpec):
    """The study's RDB storage. Making its tables is serialised: two commands started
    together on a new SQLite file hold its lock in turn, and on a server database a
    command that loses the race to make them tries once more (the tables exist then)."""
    import optuna

    url = spec.storage_url
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    with _storage_lock(url):
        for attempt in (1, 2):
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
            except Exception as error:  # SQLAlchemy's errors name the URL's problem
                if attempt == 2 or url.startswith("sqlite"):
                    raise ConfigError(f"--storage {url}: {error}") from None
                time.sleep(1.0)


@contextlib.contextmanager
def _storage_lock(url: str):
    """An exclusive ``flock`` beside an SQLite file, for what commands sharing it must do
    in turn (make its tables; count its trials and ask for one); nothing for in-memory
    SQLite or a server URL."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        yield
        return
    lock_path = Path(url[len(prefix) :] + ".lock")
    if not lock_path.parent.is_dir():  # SQLite names the missing folder
        yield
        return
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_study(spec: StudySpec, create: bool = False):
    """The study ``spec`` names, made first where ``create`` allows; a study made with
    another recipe, space, objective or budget is refused (its trials would not compare)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    options = {"study_name": spec.name, "storage": _storage(spec), "pruner": _pruner(spec),
               "sampler": optuna.samplers.TPESampler(seed=spec.seed)}  # fmt: skip
    if create:
        direction = spec.objective.optuna_direction
        study = optuna.create_study(direction=direction, load_if_exists=True, **options)
    else:
        study = optuna.load_study(**options)
    made_with = study.user_attrs.get("spec")
    if made_with is None:
        study.set_user_attr("spec", spec.identity())
    elif made_with != spec.identity():
        changed = sorted(k for k in made_with if made_with[k] != spec.identity().get(k))
        raise ConfigError(
            f"study {spec.name!r} in {spec.storage_url} was made with other "
            + ", ".join(f"{k} ({made_with[k]!r})" for k in changed)
            + ": give the same ones, or another --out / --study-name for a new study"
        )
    return study


def live_trial(study, number: int):
    """Trial ``number`` of ``study`` as an ``optuna.trial.Trial`` that reports and tells."""
    import optuna

    frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    return optuna.trial.Trial(study, frozen._trial_id)


def orphaned(study, spec: StudySpec) -> list[int]:
    """The running trials this machine started whose command is gone and whose run dir
    no process holds: a killed study's, to be resumed."""
    from optuna.trial import TrialState

    from beatloop.core.failures.errors import RunDirError
    from beatloop.core.saving.run_lock import RunDirLock

    found = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        attrs = trial.user_attrs
        if attrs.get(HOST) != socket.gethostname() or _alive(attrs.get(PID)):
            continue
        run_dir = spec.trial_dir(trial.number)
        if run_dir.is_dir():
            try:
                RunDirLock.acquire(run_dir).release()
            except RunDirError:
                continue  # a process trains it still
        found.append(trial.number)
    return found


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TrialProcesses:
    """The trial processes this command runs, each logging to ``OUT/logs/trial-N.log``."""

    def __init__(self, spec: StudySpec, echo: Callable[[str], None]):
        self.spec = spec
        self.echo = echo
        self.running: dict[int, tuple[subprocess.Popen, object]] = {}

    def start(self, study, number: int) -> None:
        trial = live_trial(study, number)
        trial.set_user_attr(HOST, socket.gethostname())
        trial.set_user_attr(PID, os.getpid())
        log_path = self.log(number)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 (closed when it ends)
        command = [sys.executable, "-m", "beatloop.tuning.trial"]
        command += [json.dumps(spec_to_json(self.spec)), str(number)]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
        # A session of its own: Ctrl-C reaches the command only, which stops each trial
        # with one SIGTERM (a second signal would stop it before its checkpoint).
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.running[number] = (process, log)

    def log(self, number: int) -> Path:
        return self.spec.out / "logs" / f"trial-{number:04d}.log"

    def finished(self) -> list[tuple[int, int]]:
        """The trials whose process ended since the last call, with exit statuses."""
        ended = []
        for number, (process, log) in list(self.running.items()):
            if process.poll() is not None:
                log.close()
                del self.running[number]
                ended.append((number, process.returncode))
        return ended

    def stop_all(self, grace: float = 120) -> None:
        """Stop the running trials: SIGTERM first, so each saves a checkpoint at its next
        call boundary and stays running in the study (the same command resumes it), then
        SIGKILL for any still there after ``grace`` seconds."""
        for process, _ in self.running.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + grace
        for process, log in self.running.values():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
        self.running.clear()


def run_study(spec: StudySpec, jobs: int = 1, echo: Callable[[str], None] = print):
    """Run ``spec``'s study to ``spec.trials`` trials, ``jobs`` at once; the study."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    spec.out.mkdir(parents=True, exist_ok=True)
    study = load_study(spec, create=True)
    waiting = orphaned(study, spec)
    if waiting:
        echo(f"resuming trial(s) {', '.join(map(str, waiting))} of a study that was stopped")
    processes = TrialProcesses(spec, echo)
    try:
        with ctrl_c_as_request() as interrupted:
            _keep_trials_going(study, spec, jobs, processes, waiting, interrupted, echo)
        return study
    finally:
        processes.stop_all()


def _keep_trials_going(study, spec, jobs, processes, waiting, interrupted, echo) -> None:
    """Start trials (the waiting ones first) while fewer than ``jobs`` run and the study
    wants more; return when none runs, raise KeyboardInterrupt at a Ctrl-C."""
    distributions = _distributions(spec)
    while not interrupted:
        for number, status in processes.finished():
            _report_end(study, spec, number, status, processes.log(number), echo)
        if len(processes.running) < jobs:
            if waiting:
                processes.start(study, waiting.pop(0))
                continue
            trial = ask_within_budget(study, spec, distributions)
            if trial is not None:
                echo(f"trial {trial.number}: {_point(trial.params)}")
                processes.start(study, trial.number)
                continue
        if not processes.running:
            return
        time.sleep(0.1)
    raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_as_request():
    """Ctrl-C (SIGINT) noted in the list yielded, for the loop to act on at its next
    turn: a KeyboardInterrupt raised wherever the signal lands is lost when that is a
    finalizer (SQLAlchemy's and Optuna's objects have them), and the study ran on."""
    requested: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield requested  # signals reach the main thread only
        return
    previous = signal.signal(signal.SIGINT, lambda signum, _: requested.append(signum))
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)


def ask_within_budget(study, spec: StudySpec, distributions: dict):
    """A new trial of ``study``, or None once it holds ``spec.trials``. Commands sharing
    an SQLite file count and ask in turn; on a server database two machines may ask at
    once, and the one whose trial is over the budget marks it failed, untrained."""
    from optuna.trial import TrialState

    with _storage_lock(spec.storage_url):
        if len(study.get_trials(deepcopy=False)) >= spec.trials:
            return None
        trial = study.ask(distributions)
    if trial.number < spec.trials:
        return trial
    trial.set_user_attr("error", f"over the study's {spec.trials} trials: not trained")
    study.tell(trial, state=TrialState.FAIL)
    return None


def _distributions(spec: StudySpec) -> dict:
    from beatloop.plugins.registry import get_recipe
    from beatloop.tuning.space import parse_space

    cls = get_recipe(spec.recipe)
    return parse_space(spec.space, cls.Config, f"recipe {spec.recipe!r}").distributions()


def _point(params: dict) -> str:
    return "  ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )


def _report_end(study, spec: StudySpec, number: int, status: int, log: Path, echo) -> None:
    """Say how trial ``number`` ended; a trial whose objective is no logged figure ends
    the study (every trial would fail alike)."""
    trial = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    state = trial.state.name.lower()
    if state == "complete":
        echo(f"trial {number}: {spec.objective.name} {trial.value:.6g}")
    elif state == "pruned":
        echo(f"trial {number}: pruned after epoch {trial.last_step + 1}")
    elif state == "fail":
        echo(f"trial {number}: failed: {trial.user_attrs.get('error', f'see {log}')}")
        if trial.user_attrs.get("abort"):
            raise ConfigError(trial.user_attrs["error"])
    else:
        lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        last = lines[-1] if lines else "no output"
        echo(f"trial {number}: its process ended with status {status}, the trial unfinished "
             f"({last}); the same command resumes it")  # fmt: skip
