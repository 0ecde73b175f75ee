"""``beatloop run ... --workers N``: N local workers of a ``MultiWorkerMirroredStrategy``
on this machine, one process each, to try a cluster run without a cluster.

The launcher imports no TensorFlow. It picks N free ports on 127.0.0.1 and starts the
same command N times with ``--workers 1 --strategy multi_worker`` appended (argparse
keeps an option's last value) and a ``TF_CONFIG`` naming the cluster and the worker's
index; every worker gets the same ``--run-dir``. Worker 0's output is the run's output;
the others' goes to a file each, shown only when that worker fails. When a worker ends
with an error or is killed, the others get ``FAILURE_GRACE`` seconds to stop by
themselves (a run that lost a worker stops and says from which checkpoint it can
resume), then are killed, and the launcher exits with the lost worker's code. No SIGTERM
is sent them then: a run turns it into a checkpoint at its next call boundary, which a
cluster short of a worker cannot make. Ctrl-C or SIGTERM to the launcher is passed on
once to every worker (each in its own session, so a terminal's Ctrl-C reaches them only
that way); those still running after ``SIGNAL_GRACE`` seconds are killed. On Linux a
worker is killed if the launcher itself dies.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

#: Seconds the other workers get to stop by themselves after one is lost, before they
#: are killed (a run notices a lost worker within its coordination service's heartbeat
#: timeout, 10 s).
FAILURE_GRACE = 30.0
#: Seconds the workers get to save a checkpoint after Ctrl-C or SIGTERM is passed on.
SIGNAL_GRACE = 30.0
#: Lines of a failed worker's output shown (worker 0's is on the terminal already).
TAIL_LINES = 20
#: Seconds between looks at the workers.
POLL = 0.1


@attrs.frozen
class Worker:
    """One started worker: its index, address, process and output file (``None`` for
    worker 0, whose output is the launcher's)."""

    index: int
    address: str
    process: subprocess.Popen
    output: Path | None


def workers_count(text: str) -> int:
    """``--workers N``: an integer >= 1."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expects an integer >= 1, got {text!r}")
    return value


def refuse_cluster_options(strategy: str, environ=os.environ) -> None:
    """``--workers N`` makes its own cluster: refuse ``--strategy mirrored`` and a
    ``TF_CONFIG`` already set (whose cluster would be ignored)."""
    from beatloop.core.failures.errors import ConfigError

    if strategy == "mirrored":
        raise ConfigError(
            "--workers N starts N processes of one MultiWorkerMirroredStrategy; --strategy "
            "mirrored is the devices of one process: drop one of them"
        )
    if environ.get("TF_CONFIG"):
        raise ConfigError(
            "--workers N sets each worker's TF_CONFIG itself, but TF_CONFIG is already set "
            f"({environ['TF_CONFIG']!r}): unset it, or drop --workers and run --strategy "
            "multi_worker on every machine of that cluster"
        )


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (held together while chosen)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for each in sockets:
            each.bind(("127.0.0.1", 0))
        return [each.getsockname()[1] for each in sockets]
    finally:
        for each in sockets:
            each.close()


def tf_config(addresses: Sequence[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` of the cluster at ``addresses``."""
    return json.dumps(
        {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}
    )


def worker_command(argv: Sequence[str], run_dir: Path | None) -> list[str]:
    """The command every worker runs: the launcher's own (``run ...``) as one plain
    worker of the cluster in its ``TF_CONFIG``, with ``run_dir`` when none was given."""
    command = [sys.executable, "-m", "beatloop", *argv, "--workers", "1"]
    command += ["--strategy", "multi_worker"]
    return command + (["--run-dir", str(run_dir)] if run_dir is not None else [])


def launch(args, recipe: str | None) -> int:
    """Run ``args.workers`` local workers of the command in ``args.argv`` to their end;
    the exit code is the first failed worker's (0 when every one succeeds). Without
    ``--run-dir`` the workers share ``runs/RECIPE-TIME``, named once here as a plain run
    names its own (``recipe``: the one named, or the run file's)."""
    refuse_cluster_options(args.strategy)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = None if args.run_dir is not None else Path("runs") / f"{recipe or 'run'}-{stamp}"
    where = args.run_dir or run_dir
    command = worker_command(args.argv, run_dir)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(args.workers)]
    with tempfile.TemporaryDirectory(prefix="beatloop-workers-") as outputs:

        def start(workers: list[Worker]) -> None:
            for index in range(len(addresses)):
                workers.append(_start(command, addresses, index, Path(outputs)))
            pids = ", ".join(str(w.process.pid) for w in workers)
            print(
                f"beatloop: {len(workers)} local workers on {', '.join(addresses)} (pids "
                f"{pids}), run dir {where}; worker 0's output follows, another's only if it "
                "fails",
                file=sys.stderr,
                flush=True,
            )

        return Supervisor(where).run(start)


def _start(command: list[str], addresses: Sequence[str], index: int, outputs: Path) -> Worker:
    """Start worker ``index``: worker 0 on the launcher's terminal, another writing to a
    file of its own; each in a session of its own."""
    env = {**os.environ, "TF_CONFIG": tf_config(addresses, index)}
    dies_with_parent = _death_signal() if sys.platform == "linux" else None
    output = None if index == 0 else outputs / f"worker{index}.log"
    sink = None if output is None else output.open("wb")
    try:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=None if sink is None else subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=dies_with_parent,
        )
    finally:
        if sink is not None:
            sink.close()
    return Worker(index, addresses[index], process, output)


def _death_signal():
    """What a worker runs before the command, on Linux: ask for SIGKILL when the
    launcher dies (prctl PR_SET_PDEATHSIG), so no worker is left waiting for its
    cluster (SIGTERM would not do: a training run turns it into a stop at its next call
    boundary, which a worker waiting on a lost peer never reaches). libc is looked up
    here, before the fork."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


class Supervisor:
    """Waits for the workers; stops them all when one is lost or a signal comes."""

    def __init__(self, run_dir: Path):
        self.workers: list[Worker] = []
        self.run_dir = run_dir
        self.signal: int | None = None  # the signal passed on to the workers, if any

    def run(self, start: Callable[[list[Worker]], None]) -> int:
        """``start(workers)`` appends the workers it starts (a signal meanwhile reaches
        those started); then wait for them, and stop them all."""
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for signum in previous:
            signal.signal(signum, self._pass_on)
        try:
            start(self.workers)
            lost = self._wait_for_a_loss()
            if lost is not None:
                return self._lost(lost)
            if self.signal is not None:
                return self._stopped_by_signal()
            return 0
        finally:
            self._stop(grace=0.0)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _wait_for_a_loss(self) -> Worker | None:
        """Until every worker has ended, one has failed (it is returned: the lowest
        index among those failed), or a signal's grace is over."""
        deadline = None
        while [w.process.poll() for w in self.workers].count(None):
            failed = [w for w in self.workers if w.process.returncode not in (None, 0)]
            if failed and self.signal is None:
                return failed[0]
            if self.signal is not None:
                deadline = deadline or time.monotonic() + SIGNAL_GRACE
                if time.monotonic() > deadline:
                    return None
            time.sleep(POLL)
        failed = [w for w in self.workers if w.process.returncode != 0]
        return failed[0] if failed and self.signal is None else None

    def _pass_on(self, signum, frame) -> None:
        """Ctrl-C or SIGTERM to the launcher: to every running worker, once each time."""
        self.signal = signum
        for worker in self.workers:
            if worker.process.poll() is None:
                os.kill(worker.process.pid, signum)

    def _stop(self, grace: float, terminate: bool = True) -> None:
        """SIGTERM to every running worker (when ``terminate``), SIGKILL to those still
        running after ``grace`` seconds; then wait for all."""
        running = [w.process for w in self.workers if w.process.poll() is None]
        for process in running if terminate else ():
            process.terminate()
        deadline = time.monotonic() + grace
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(POLL)
        for process in running:
            if process.poll() is None:
                process.kill()
            process.wait()

    def _lost(self, worker: Worker) -> int:
        """Report the lost worker (the end of its output, and of any other failed one's
        not on the terminal), stop the others, and return its exit code."""
        code = exit_code(worker.process.returncode)
        failed = [w for w in self.workers if w.process.returncode not in (None, 0)]
        self._stop(grace=FAILURE_GRACE, terminate=False)
        for each in failed:
            for line in _tail(each.output) if each.output is not None else ():
                print(f"[worker {each.index}] {line}", file=sys.stderr)
        also = "".join(
            f"; worker {w.index} {_ending(w.process.returncode)} too" for w in failed if w != worker
        )
        after = (
            "see its error above, fix it and run the same command again"
            if code in (2, 3)
            else f"run the same command again to resume from the last checkpoint in {self.run_dir}"
        )
        print(
            f"beatloop: error: worker {worker.index} of {len(self.workers)} "
            f"({worker.address}) {_ending(worker.process.returncode)}{also}; the other "
            f"workers were stopped; {after}",
            file=sys.stderr,
        )
        return code

    def _stopped_by_signal(self) -> int:
        """After a passed-on signal: the workers' first non-zero exit code (each saved
        a checkpoint and said so), or the signal's own."""
        name = signal.Signals(self.signal).name
        codes = [exit_code(w.process.returncode or 0) for w in self.workers]
        print(
            f"beatloop: {name} passed on to the {len(self.workers)} workers; run the same "
            f"command again to resume from the last checkpoint in {self.run_dir}",
            file=sys.stderr,
        )
        return next((code for code in codes if code), 128 + self.signal)


def exit_code(returncode: int) -> int:
    """A process's exit status as a shell reports it: 128 + N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _ending(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


def _tail(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [line.rsplit("\r", 1)[-1] for line in lines[-TAIL_LINES:]]
