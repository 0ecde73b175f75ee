"""Start ``python ARGS`` as a child forked from a zygote that has TensorFlow imported
(``tests/zygote.py``): a real process of its own (its pid, exit status and signals are
the test's to use, as with ``subprocess.Popen``) that skips TensorFlow's import.

Each pytest process starts one zygote, the first time it is asked for a child. The child
is adopted by the asking process (a child subreaper while it asks), so ``wait`` and
``kill`` work on it as on any child of its own.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
_ZYGOTE_SCRIPT = Path(__file__).with_name("zygote.py")


class ForkedProcess:
    """The part of ``subprocess.Popen``'s interface the tests use, for a forked child
    whose stdout and stderr come back as text."""

    def __init__(self, pid: int, stdout_fd: int, stderr_fd: int):
        self.pid = pid
        self.returncode: int | None = None
        self._parts: dict[str, list[bytes]] = {"out": [], "err": []}
        self._readers = [
            threading.Thread(target=self._read, args=(fd, self._parts[key]), daemon=True)
            for key, fd in (("out", stdout_fd), ("err", stderr_fd))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(fd: int, into: list[bytes]) -> None:
        with os.fdopen(fd, "rb") as stream:
            for chunk in iter(lambda: stream.read1(1 << 16), b""):
                into.append(chunk)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["forked", str(self.pid)], timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        start = time.monotonic()
        self.wait(timeout)
        for reader in self._readers:
            left = None if timeout is None else max(timeout - (time.monotonic() - start), 1)
            reader.join(left)
        return tuple(b"".join(self._parts[k]).decode(errors="replace") for k in ("out", "err"))

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Zygote:
    """The zygote this pytest process started, and how to ask it for a child."""

    def __init__(self, env: dict[str, str]):
        self.folder = tempfile.mkdtemp(prefix="beatloop-zygote-")
        self.path = os.path.join(self.folder, "socket")
        self.process = subprocess.Popen(
            [sys.executable, str(_ZYGOTE_SCRIPT), self.path],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env,
        )  # fmt: skip
        if self.process.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the zygote did not start (exit {self.process.wait()})")
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for name in os.listdir(self.folder):
            os.unlink(os.path.join(self.folder, name))
        os.rmdir(self.folder)

    def fork(self, args: list[str], env: dict[str, str], cwd: str) -> ForkedProcess:
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        request = json.dumps({"args": args, "env": env, "cwd": cwd}).encode()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.connect(self.path)
                socket.send_fds(connection, [request], [null, out_write, err_write])
                pid = int(connection.makefile().readline())
            _wait_until_adopted(pid)
        finally:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
            for fd in (null, out_write, err_write):
                os.close(fd)
        return ForkedProcess(pid, out_read, err_read)


def _wait_until_adopted(pid: int) -> None:
    """Until ``pid``'s parent is this process (its first parent exits at once)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return  # ended already: adopted and a zombie of ours, or reaped
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            return
        time.sleep(0.001)
    raise RuntimeError(f"forked child {pid} was not adopted by this process")


_zygotes: dict[str, _Zygote] = {}


def _task_index(env: dict[str, str]) -> int | None:
    """A cluster worker's index: each index forks from a zygote of its own, so the workers
    of one cluster differ in hash seed as separate interpreters do (an order of names
    that varied between them would show)."""
    task = json.loads(env.get("TF_CONFIG") or "{}").get("task") or {}
    return task.get("index")


def _per_child(name: str) -> bool:
    """Variables read after start-up (a cluster's TF_CONFIG, pytest's own), which the
    zygote's import does not depend on."""
    return name == "TF_CONFIG" or name.startswith("PYTEST_")


def start_forked(args: list[str], env: dict[str, str]) -> ForkedProcess:
    """``python ARGS`` in ``env``, forked from this process's zygote (started first if
    there is none yet). The zygote imports TensorFlow under ``env``'s import-time
    settings, so a call with other ones gets a zygote of its own, as does each worker
    index of a cluster. Children of one zygote share its hash seed."""
    key = json.dumps([{k: v for k, v in sorted(env.items()) if not _per_child(k)},
                      _task_index(env)])  # fmt: skip
    zygote = _zygotes.get(key)
    if zygote is None or zygote.process.poll() is not None:
        zygote = _zygotes[key] = _Zygote(env)
    return zygote.fork(list(args), env, os.getcwd())
