"""One writer per run dir: an exclusive ``flock`` on ``RUN_DIR/.lock`` for a run's life.

Two runs writing one run dir interleave their history and overwrite each other's
checkpoints, so a run takes the lock before it reads or writes anything there and a
second run is refused at once, naming the holder (its pid, host and start time, which
the holder writes into the lock file). The kernel releases a ``flock`` when its holder
dies, SIGKILL included, so a killed run never leaves the run dir locked.

The lock file is left as the run found it: removed on release when this run created
it, its former bytes written back when it was there before (left by a killed run), so a
run that fails to start leaves its run dir byte for byte as it was.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from beatloop.core.failures.errors import RunDirError
from beatloop.core.saving.run_dir import LOCK_NAME, never_started, writing


class RunDirLock:
    """The lock on one run dir, held from ``acquire`` to ``release``.

    ``made``: the folders created to hold the lock file, deepest first (the run dir and
    any missing parents); ``created_dir`` says whether there were any. A run that fails to
    start removes the run dir again, and ``release`` removes the parents then left empty.
    """

    def __init__(
        self, run_dir: Path, descriptor: int, previous: bytes | None, made: tuple = ()
    ):  # fmt: skip
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.made = tuple(made)
        self.created_dir = bool(self.made)
        self._descriptor: int | None = descriptor
        self._previous = previous

    @classmethod
    def acquire(cls, run_dir: Path) -> RunDirLock:
        """Lock ``run_dir`` (created if missing) or raise a RunDirError naming the run
        that holds it. A lock that cannot be written (a full disk) leaves nothing: the
        lock file and the folders made for it are removed again."""
        run_dir = Path(run_dir)
        made = _missing_folders(run_dir)
        try:
            with writing(run_dir, "create"):
                run_dir.mkdir(parents=True, exist_ok=True)
            return cls._locked(run_dir, made)
        except RunDirError as error:
            _remove_empty(made)
            raise never_started(error) from error.__cause__

    @classmethod
    def _locked(cls, run_dir: Path, made: list[Path]) -> RunDirLock:
        """The lock on an existing ``run_dir``, its holder written into the lock file."""
        path = run_dir / LOCK_NAME
        while True:  # until the file locked is the one at the path (see _same_file)
            previous = path.read_bytes() if path.is_file() else None
            with writing(path):
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                raise RunDirError(_refusal(run_dir, path)) from None
            if _same_file(descriptor, path):
                break
            os.close(descriptor)  # released and removed by its holder meanwhile: again
        lock = cls(run_dir, descriptor, previous, made)
        try:
            lock._write(json.dumps(holder()).encode("utf-8") + b"\n")
        except BaseException:
            lock.release()  # the lock file as it was: removed, or its bytes back
            raise
        return lock

    def release(self) -> None:
        """Give the lock up, leaving the lock file as it was found (calling it again does
        nothing)."""
        if self._descriptor is None:
            return
        descriptor, self._descriptor = self._descriptor, None
        try:
            if self._previous is None:
                self.path.unlink(missing_ok=True)
            else:
                _overwrite(descriptor, self._previous)
        except OSError:
            pass  # the run dir went away (put back) or is read-only now: nothing to keep
        finally:
            os.close(descriptor)  # the flock goes with the last descriptor
        _remove_empty(self.made)  # a run put back: the parents made for it go too

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def _write(self, content: bytes) -> None:
        with writing(self.path):
            _overwrite(self._descriptor, content)


def _remove_empty(folders) -> None:
    """Remove ``folders`` (deepest first) while they are empty: those already gone are
    passed over, the first that holds anything ends it."""
    for folder in folders:
        try:
            folder.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            break


def holder() -> dict:
    """What a lock file says about the run holding it."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "",
    }


def _refusal(run_dir: Path, path: Path) -> str:
    """The refusal of a second run: who holds the run dir, and what to do."""
    try:
        held = json.loads(path.read_text(encoding="utf-8"))
        who = f"pid {held['pid']} on {held['host']}, started {held['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        who = "its details are not written yet"
    return (
        f"the run dir {run_dir} is in use by another run ({who}); two runs on one run dir "
        "would overwrite each other's checkpoints and history: wait for it to end, stop "
        "it, or pass another run dir (--run-dir, run_dir=)"
    )


def _missing_folders(run_dir: Path) -> list[Path]:
    """The folders creating ``run_dir`` makes (it and its missing parents), deepest
    first."""
    missing = []
    folder = Path(os.path.abspath(run_dir))
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _same_file(descriptor: int, path: Path) -> bool:
    """Whether ``path`` still names the file ``descriptor`` locked: a holder removes its
    lock file on release, so a file opened just before may be one nobody finds."""
    try:
        return os.stat(path).st_ino == os.fstat(descriptor).st_ino
    except FileNotFoundError:
        return False


def _overwrite(descriptor: int, content: bytes) -> None:
    """Replace the file's bytes with ``content``, written through to the disk."""
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, content, 0)
    os.fsync(descriptor)
