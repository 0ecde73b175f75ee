"""The run dir on disk: checked before a run writes anything, created when the run
starts (or when its lock is taken, ``run_lock.py``), written whole lines and whole
files at a time, and every failed write there reported as one ``RunDirError``.

A run that cannot start (bad data, a refused resume, a run dir that cannot be written)
leaves the run dir exactly as it was: nothing but the lock file is created or written
before the checks pass and the run's parts are assembled, and what a run wrote before
it failed at its first step (a label out of range in the first batch) is taken back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from beatloop.core.failures.errors import RunDirError

#: What the run writes inside its run dir, besides the files it names itself.
WRITTEN = ("run.json", "history.jsonl", "checkpoints", "checkpoints/checkpoint")
#: The files a run rewrites in place (not only adds to): a run that fails to start
#: writes their bytes back.
REWRITTEN = ("run.json", "history.jsonl", "history.csv")
#: The lock file a run holds for its life (``run_lock.py``).
LOCK_NAME = ".lock"

_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "it is a folder",
    errno.EEXIST: "a file is in the way",
}


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run dir the run could not write to, before anything is written: one that
    is a file, lies under a file, is not writable, or would be created in a parent that
    is not writable. An existing run dir's ``checkpoints`` folder and log files must be
    writable too (a resume writes there)."""
    run_dir = Path(run_dir)
    advice = "pass another run dir (--run-dir, run_dir=)"
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"the run dir {run_dir} is a file, not a folder: {advice}")
    if not run_dir.exists():
        parent = _nearest_existing(run_dir)
        if not parent.is_dir():
            raise RunDirError(
                f"the run dir {run_dir} cannot be created: {parent} is a file, not a folder; "
                f"{advice}"
            )
        if not _writable(parent):
            raise RunDirError(
                f"the run dir {run_dir} cannot be created: its parent {parent} is not "
                f"writable (read-only, or owned by another user); {advice} or make "
                f"{parent} writable"
            )
        return
    for path in [run_dir, *(run_dir / name for name in WRITTEN)]:
        if path.exists() and not _writable(path):
            what = "folder" if path.is_dir() else "file"
            raise RunDirError(
                f"the run dir {run_dir} is not writable: the {what} {path} is read-only (or "
                f"owned by another user); make it writable, or {advice} to start a new run"
            )
    checkpoints = run_dir / "checkpoints"
    if checkpoints.exists() and not checkpoints.is_dir():
        raise RunDirError(f"{checkpoints} is a file, not the run's checkpoint folder; {advice}")


def existing_run_dir(run_dir: Path, verb: str, written_by: str = "beatloop run --run-dir"):
    """``run_dir``, checked before anything is read: a ``RunDirError`` (exit 5, as for
    any run dir that cannot be used) when it does not exist or is a file, rather than
    "holds no readable checkpoint", which is for a folder without checkpoints;
    ``written_by``: how a run dir is written, in the words of the caller's surface."""
    run_dir = Path(run_dir)
    advice = f"give the run dir a run wrote ({written_by}) to {verb}"
    if not run_dir.exists():
        raise RunDirError(f"the run dir {run_dir} does not exist: {advice}")
    if not run_dir.is_dir():
        raise RunDirError(f"the run dir {run_dir} is a file, not a folder: {advice}")
    return run_dir


def check_export_dir(out: Path) -> None:
    """Refuse an export folder the SavedModels could not be written to, before anything
    is written: a file, a folder under a file, or one whose nearest existing folder is
    not writable."""
    out = Path(out)
    advice = "name a new or empty folder as OUT (beatloop export RUN_DIR OUT; .export(out))"
    if out.exists() and not out.is_dir():
        raise RunDirError(f"export OUT {out} is a file, not a folder: {advice}")
    existing = _nearest_existing(out)
    if not existing.is_dir():
        raise RunDirError(
            f"export OUT {out} cannot be created: {existing} is a file, not a folder; {advice}"
        )
    if not _writable(existing):
        raise RunDirError(
            f"export OUT {out} cannot be written: {existing} is not writable (read-only, or "
            f"owned by another user); make it writable, or {advice}"
        )


class RunDirBefore:
    """The run dir as it was before a run started: which paths existed, and the bytes of
    the files a run rewrites (``run.json``, the history files). A run that fails before
    its first step puts it back with ``put_back``, so bad data or a bad model found at
    the first batch leaves no run dir behind, and a resumed run's dir keeps its files.

    Taken with the run dir's lock held (``created``: the lock created the run dir); the
    lock file is the lock's to put back, on release."""

    def __init__(self, run_dir: Path, *, created: bool = False):
        self.run_dir = Path(run_dir)
        self.existed = self.run_dir.is_dir() and not created
        self.paths = set(self.run_dir.rglob("*")) if self.existed else set()
        self.contents = {
            name: (self.run_dir / name).read_bytes()
            for name in REWRITTEN
            if self.existed and (self.run_dir / name).is_file()
        }

    def put_back(self) -> None:
        """Remove what the run added; write back the files it rewrote."""
        if not self.existed:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return
        lock = self.run_dir / LOCK_NAME
        added = [p for p in self.run_dir.rglob("*") if p not in self.paths and p != lock]
        for path in sorted(added, key=lambda p: len(p.parts), reverse=True):  # files first
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for name, content in self.contents.items():
            target = self.run_dir / name
            if not target.is_file() or target.read_bytes() != content:
                target.write_bytes(content)


def append_line(path: Path, text: str) -> None:
    """Append ``text`` (whole lines, ending with a newline) to ``path`` with a single
    write, flushed to the disk: a run killed meanwhile leaves at most its last line torn
    (a resume drops a torn last line)."""
    data = text.encode("utf-8")
    with writing(path):
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(descriptor, data)
            while written < len(data):  # a short write (a signal, a pipe): the rest
                written += os.write(descriptor, data[written:])
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, flushed to the disk, then rename
    it over ``path``: the file is whole, old or new, whenever the run is killed."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    with writing(path):
        try:
            with temporary.open("w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            temporary.replace(path)
        finally:
            temporary.unlink(missing_ok=True)


def remove_leftovers(run_dir: Path) -> None:
    """Remove the temporary files a killed run left half-written (``replace_file``'s):
    called with the run dir's lock held, before the run writes."""
    for name in REWRITTEN:
        (Path(run_dir) / f"{name}.tmp").unlink(missing_ok=True)


def create_run_dir(run_dir: Path) -> None:
    """Create the run dir (and missing parents) when the run starts."""
    with writing(run_dir, "create"):
        Path(run_dir).mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def writing(path: Path, action: str = "write"):
    """An OSError while writing ``path`` becomes a RunDirError naming the path, the
    reason in words (disk full, read-only, permission denied) and what to do."""
    try:
        yield
    except RunDirError:
        raise
    except OSError as error:
        failure = RunDirError(_failed(path, action, error))
        failure.written = (Path(path), action)  # for ``never_started``
        raise failure from error


def never_started(error: BaseException) -> BaseException:
    """``error`` as a run that failed before it started says it: a full disk (a
    RunDirError ``writing`` raised) names the path and the space left, and asks to run
    again, not to resume (nothing of the run was kept); any other error as it is."""
    cause = error.__cause__
    written = getattr(error, "written", None)
    if written is None or not isinstance(cause, OSError) or cause.errno not in _FULL:
        return error
    path, action = written
    failure = RunDirError(
        f"could not {action} {path}: {_REASONS[cause.errno]}{_free_space(path)}, so the run "
        "did not start (the run dir is left as it was): free some space and run the same "
        "command again"
    )
    failure.__cause__ = cause
    return failure


_FULL = (errno.ENOSPC, errno.EDQUOT)


def _failed(path: Path, action: str, error: OSError) -> str:
    reason = _REASONS.get(error.errno, error.strerror or str(error))
    if error.errno in _FULL:
        reason += _free_space(path)
    return (
        f"could not {action} {path}: {reason} ({type(error).__name__}: "
        f"{error.strerror or error}); {_advice(error)}"
    )


def _free_space(path: Path) -> str:
    """``, 12.5 MB left``: the space left on the disk of ``path``'s folder, or ``""``
    when it cannot be read."""
    try:
        free = shutil.disk_usage(_nearest_existing(Path(path).parent)).free
    except OSError:
        return ""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if free >= size:
            return f", {free / size:.1f} {unit} left"
    return f", {free} bytes left"


def _advice(error: OSError) -> str:
    if error.errno in _FULL:
        return "free some space and run the same command again to resume"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make the run dir writable, or pass another run dir"
    return "check the run dir, or pass another one"


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a file or a folder)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _writable(path: Path) -> bool:
    """Whether this process may write ``path`` (and enter it, for a folder)."""
    mode = os.W_OK | (os.X_OK if Path(path).is_dir() else 0)
    effective = os.access in os.supports_effective_ids
    return os.access(path, mode, effective_ids=effective)
