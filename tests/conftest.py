"""Shared fixtures (plain helper functions are in ``helpers.py``). TensorFlow is imported
once per test process, quietly."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# MLflow's telemetry sets and unsets an environment variable from its own thread, which
# can break another thread's walk over os.environ (urllib's proxy lookup) mid-test; the
# tests send nothing anywhere.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import pytest


@pytest.fixture(scope="session", autouse=True)
def list_cache_in_tmp(tmp_path_factory):
    """``beatloop list`` writes its cache under the tests' tmp dir, never the user's cache
    directory (the commands the tests start inherit the variable)."""
    os.environ["BEATLOOP_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))


#: Folders of the checkout a test run may fill: Python's and pytest's caches, and a
#: virtual environment kept there.
SKIPPED = ("__pycache__", ".pytest_cache", ".ruff_cache", ".venv", "venv")


def _untracked_files(root: Path) -> set[str] | None:
    """Every file in the checkout at ``root`` that git does not track, ignored ones too
    (``runs/`` is ignored), and every empty folder (``name/``: git lists files only, so
    an empty ``runs/`` a test made would pass unseen), but for the ``SKIPPED`` folders
    and ``.git``; None where there is no git or no checkout."""
    command = ["git", "-C", str(root), "ls-files", "--others", "-z"]
    command += [f"--exclude={name}/" for name in SKIPPED]
    try:
        done = subprocess.run(command, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return set(os.fsdecode(done.stdout).split("\0")) - {""} | _empty_folders(root)


def _empty_folders(root: Path) -> set[str]:
    """The folders under ``root`` with nothing in them, as ``path/`` relative to it."""
    empty = set()
    for folder, folders, files in os.walk(root):
        folders[:] = [name for name in folders if name not in (*SKIPPED, ".git")]
        if not folders and not files and Path(folder) != root:
            empty.add(Path(folder).relative_to(root).as_posix() + "/")
    return empty


@pytest.fixture(scope="session", autouse=True)
def checkout_left_as_it_was():
    """Fail the session if its tests leave a file or an empty folder in the checkout:
    tests write only under their ``tmp_path`` (a docs example once left ``runs/gan-*``
    and ``digit-images/``; a failed ``beatloop run`` without ``--run-dir``, an empty
    ``runs/``)."""
    root = Path(__file__).resolve().parents[1]
    before = _untracked_files(root)
    yield
    after = _untracked_files(root) if before is not None else None
    left = sorted(after - before) if after is not None else []
    assert left == [], f"the tests left {len(left)} file(s) in {root}: {left[:10]}"


@pytest.fixture(autouse=True)
def keras_names_from_zero():
    """Each test names Keras objects from zero (``dense``, ``dense_1``, ...), as a fresh
    process does: a run given ``models=`` built in the test warns of their names
    (``ReproducibilityWarning``, an error unless expected) because of the test alone,
    never because of the tests a worker ran before it. Names stay unique after the test
    (``RunNames``); before Keras is imported, its counters are a fresh process's."""
    if "keras" not in sys.modules:
        yield
        return
    from beatloop.core.running.naming import RunNames

    with RunNames().scope():
        yield


@pytest.fixture(scope="session")
def digits():
    """The built-in digits split as arrays: ({"x", "y"} train, {"x", "y"} validation)."""
    from beatloop.datasets import digits_arrays

    return digits_arrays(seed=0)


@pytest.fixture(scope="session")
def small_digits(digits):
    """The first 200 training and 100 validation digits: enough to learn, fast to run."""
    train, validation = digits
    return (
        {k: v[:200] for k, v in train.items()},
        {k: v[:100] for k, v in validation.items()},
    )


class _AutographAlarms(logging.Handler):
    """Records TensorFlow's "AutoGraph could not transform" warnings: about beatloop's own
    functions a false alarm users would see on every run. The message names a function,
    not its module, so every one counts but the tests' own lambdas (AutoGraph cannot
    find the source of a lambda that shares its line with others)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.alarms: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "AutoGraph could not transform" in message and "<lambda>" not in message:
            self.alarms.append(message.splitlines()[0])


_ALARMS = _AutographAlarms()
logging.getLogger("tensorflow").addHandler(_ALARMS)


@pytest.fixture(autouse=True)
def no_autograph_alarm_from_beatloop():
    """Fail a test during which AutoGraph could not convert a function."""
    before = len(_ALARMS.alarms)
    yield
    assert _ALARMS.alarms[before:] == [], "AutoGraph could not convert a function"


COLLECTED = pytest.StashKey[dict]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Count the tests collected per file before ``-m``/``-k`` deselect any, for
    ``test_suite_size.py``: whether a test was lost is judged on what was collected."""
    counts: dict[str, int] = {}
    for item in items:
        name = Path(str(item.path)).name
        counts[name] = counts.get(name, 0) + 1
    config.stash[COLLECTED] = counts


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker per core this process may use, but no more than one per 3 GiB
    of memory (a worker holding TensorFlow and the runs it starts reaches about that)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, min(cores or 1, memory // (3 * 2**30)))
