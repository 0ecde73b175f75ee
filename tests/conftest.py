"""Shared fixtures (plain helper functions are in ``helpers.py``). TensorFlow is imported
once per test process, quietly."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest


@pytest.fixture(scope="session", autouse=True)
def list_cache_in_tmp(tmp_path_factory):
    """``beatloop list`` writes its cache under the tests' tmp dir, never the user's cache
    directory (the commands the tests start inherit the variable)."""
    os.environ["BEATLOOP_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def digits():
    """The built-in digits split as arrays: ({"x", "y"} train, {"x", "y"} validation)."""
    from beatloop.data import digits_arrays

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
