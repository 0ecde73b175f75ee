"""A study's trial processes: each trial started in its own process (forked with
TensorFlow imported where it can be: ``beatloop.forking``; logging to
``OUT/logs/trial-N.log``), watched, stopped with one SIGTERM (it checkpoints and stays
running in the study), its end said; and the trials a killed command left, found to be
resumed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from beatloop.core.failures.errors import ConfigError
from beatloop.forking import ForkedChild, popen
from beatloop.tuning.spec import StudySpec, spec_to_json

#: A trial's user attributes: the machine and the command that started it last.
HOST, PID = "host", "pid"


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
        self.running: dict[int, tuple[subprocess.Popen | ForkedChild, object]] = {}

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
        process = popen(
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


def report_end(study, spec: StudySpec, number: int, status: int, log: Path, echo) -> str | None:
    """Say how trial ``number`` ended; a trial whose objective is no logged figure ends
    the study (every trial would fail alike). Returns how the process of a trial left
    unfinished (still running in the study) ended, ``None`` for any other trial."""
    trial = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    state = trial.state.name.lower()
    if state == "complete":
        echo(f"trial {number}: {spec.objective.name} {trial.value:.6g}")
    elif state == "pruned":
        echo(f"trial {number}: pruned after epoch {trial.last_step + 1}")
    elif state == "fail":
        study.set_user_attr(f"exit_code_{number}", status)  # a finished trial takes none
        echo(f"trial {number}: failed: {trial.user_attrs.get('error', f'see {log}')}")
        if trial.user_attrs.get("abort"):
            raise ConfigError(trial.user_attrs["error"])
    else:
        ending = _ending(status, log)
        echo(f"trial {number}: its process {ending}, the trial unfinished; the same command "
             "resumes it")  # fmt: skip
        return ending
    return None


#: Lines of a trial's log that TensorFlow writes as it starts, never a trial's reason.
_START_UP = ("I0000", "W0000", "E0000", "WARNING: All log messages", "To enable the following")


def _ending(status: int, log: Path) -> str:
    """How a trial's process ended: the signal that killed it, or its status and the
    last line it wrote that is not TensorFlow's start-up banner."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"was killed by {name} (by the system or a user: out of memory?)"
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    lines = [line for line in text.strip().splitlines() if not line.startswith(_START_UP)]
    return f"ended with status {status} ({lines[-1] if lines else 'no output'})"
