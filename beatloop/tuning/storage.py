"""A study's storage and its dir as the user sees them: the dir checked before anything
is written, the SQLite file opened under its lock (or read as it is from a read-only
dir), and what goes wrong there (a damaged or full file, a server that refuses) said in
one line naming the file, not as SQLAlchemy's text under a ``--storage`` never given."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path

from beatloop.core.failures.errors import BeatloopError, ConfigError, RunDirError
from beatloop.tuning.spec import StudySpec

SQLITE = "sqlite:///"

#: SQLite's words for a file it cannot use, and what they mean to the user.
_SQLITE_MEANING = {
    "file is not a database": "it is damaged (not an SQLite database: truncated or overwritten)",
    "database disk image is malformed": "it is damaged (a page of it cannot be read)",
    "database or disk is full": "the disk is full",
    "attempt to write a readonly database": "it is read-only",
    "unable to open database file": "it cannot be opened (a missing folder, or no permission)",
    "disk i/o error": "the disk failed to read or write it (is it full?)",
}


def sqlite_path(spec: StudySpec) -> Path | None:
    """The study's SQLite file, or None for another storage (a server, in-memory)."""
    url = spec.storage_url
    if not url.startswith(SQLITE) or len(url) == len(SQLITE):
        return None
    return Path(url[len(SQLITE) :])


def writable_study_dir(spec: StudySpec) -> bool:
    """Whether the study may write its dir (``--out``): made here when its parent allows;
    ``False`` for an existing dir this process cannot write (a finished study can still
    be read and shown); a dir that cannot exist at all is a ``RunDirError``."""
    out = spec.out
    if out.exists() and not out.is_dir():
        raise RunDirError(f"the study dir --out {out} is a file, not a folder: pass another --out")
    if out.is_dir():
        return os.access(out, os.W_OK | os.X_OK, effective_ids=_effective())
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK, effective_ids=_effective()):
        raise RunDirError(
            f"the study dir --out {out} cannot be created: its parent {parent} is not writable "
            "(read-only, or owned by another user); pass another --out or make it writable"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunDirError(
            f"the study dir --out {out} cannot be created: {_os_reason(error)}"
        ) from None
    return True


@contextlib.contextmanager
def made_or_removed(spec: StudySpec):
    """The study's SQLite file, lock and dir as they were, when opening a new study fails
    on the disk (full, read-only): no empty ``study.db`` left behind to be taken for a
    study."""
    path = sqlite_path(spec)
    made = [] if path is None else [p for p in _own_files(path) if not p.exists()]
    dir_made = not spec.out.exists()
    try:
        yield
    except RunDirError:  # the disk's failure, not another command's study: that one stays
        for leftover in made:
            leftover.unlink(missing_ok=True)
        if dir_made and spec.out.is_dir() and not any(spec.out.iterdir()):
            spec.out.rmdir()
        raise


def _own_files(path: Path) -> list[Path]:
    return [path, *(Path(f"{path}{suffix}") for suffix in (".lock", "-journal", "-wal", "-shm"))]


def _effective() -> bool:
    return os.access in os.supports_effective_ids


def open_storage(spec: StudySpec, writable: bool = True):
    """The study's RDB storage. Making its tables is serialised: two commands started
    together on a new SQLite file hold its lock in turn, and on a server database a
    command that loses the race to make them tries once more (the tables exist then)."""
    import optuna

    url = spec.storage_url
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    with storage_lock(spec, writable), storage_errors(spec):
        for attempt in (1, 2):
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
            except Exception:
                if attempt == 2 or url.startswith("sqlite"):
                    raise
                time.sleep(1.0)


@contextlib.contextmanager
def storage_lock(spec: StudySpec, writable: bool = True):
    """An exclusive ``flock`` beside an SQLite file, for what commands sharing it must do
    in turn (make its tables; count its trials and ask for one); nothing for a server
    URL, or a read-only study dir (where nobody can write the study)."""
    path = sqlite_path(spec)
    if path is None or not writable or not path.parent.is_dir():  # SQLite names the folder
        yield
        return
    try:
        handle = Path(f"{path}.lock").open("a")  # noqa: SIM115 (closed by the with below)
    except OSError as error:
        raise RunDirError(
            f"the study's lock {path}.lock cannot be written: {_os_reason(error)}"
        ) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def storage_errors(spec: StudySpec):
    """The storage's failures said in one line: for the study's own SQLite file a
    ``RunDirError`` naming it and what is wrong (exit 5, as a run dir's), for a
    ``--storage`` the user gave a ``ConfigError`` naming it."""
    try:
        yield
    except BeatloopError:
        raise
    except Exception as error:
        reason = _storage_reason(error)
        if reason is None:
            raise
        path = sqlite_path(spec)
        if path is None or spec.storage is not None:
            raise ConfigError(f"--storage {spec.storage_url}: {reason}") from error
        raise RunDirError(f"the study's storage {path} {_advice(path, reason)}") from error


def _storage_reason(error: BaseException) -> str | None:
    """What a storage failure means, in a line; None for an error that is not one."""
    import optuna
    import sqlalchemy.exc

    cause = error
    if isinstance(error, optuna.exceptions.StorageInternalError) and error.__cause__:
        cause = error.__cause__
    if isinstance(cause, OSError):
        return _os_reason(cause)
    if not isinstance(
        cause, sqlalchemy.exc.SQLAlchemyError | optuna.exceptions.StorageInternalError
    ):
        return None
    text = str(getattr(cause, "orig", None) or cause).strip().splitlines()[0]
    lowered = text.lower()
    return next((meaning for words, meaning in _SQLITE_MEANING.items() if words in lowered), text)


def _advice(path: Path, reason: str) -> str:
    """``reason`` with what to do about the study's SQLite file."""
    trials = path.parent / "trial-*"
    if "damaged" in reason:
        return (
            f"cannot be read: {reason}. Its trials' run dirs ({trials}) are intact: restore "
            f"{path.name} from a copy, or move it and the trial dirs away to start the study anew"
        )
    if "disk is full" in reason:
        return f"cannot be written: {reason}; free space and run the same command to go on"
    return f"cannot be used: {reason}"


def _os_reason(error: OSError) -> str:
    words = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only",
             errno.EACCES: "permission denied", errno.EPERM: "permission denied"}  # fmt: skip
    return words.get(error.errno, error.strerror or str(error))
