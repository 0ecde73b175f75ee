"""What the ``beatloop`` command shows on the terminal: TensorFlow's start-up lines kept
out, and warnings as one line each (``beatloop: warning: ...``).

TensorFlow's C++ code prints its start-up lines (the oneDNN banner, absl's "All log
messages before absl::InitializeLog()") while it is imported, before any log level can
stop them, so standard error passes through a filter during that import only, which
drops those lines and writes every other one on: real errors stay visible.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings

from beatloop.core.feeding.grappler_lines import dropping

#: Lines TensorFlow prints while it is imported that say nothing about the run.
START_UP_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\)"
    r"|oneDNN custom operations are on"
    r"|cpu_feature_guard"
    r"|This TensorFlow binary is optimized"
    r"|To enable the following instructions"
    r"|rebuild TensorFlow with the appropriate compiler flags"
    r"|Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation placer already registered"
    r"|Could not find cuda drivers"
    r"|TF-TRT Warning"
)


def quiet_environment() -> None:
    """Ask TensorFlow's C++ logging for warnings and errors only, unless the user set a
    level (before TensorFlow is imported)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def import_tensorflow_quietly() -> None:
    """Import TensorFlow with its start-up lines filtered out of standard error."""
    if "tensorflow" in sys.modules:
        return
    quiet_environment()
    with start_up_filtered():
        import tensorflow  # noqa: F401


@contextlib.contextmanager
def start_up_filtered():
    """While it lasts, TensorFlow's start-up lines (``START_UP_NOISE``) are dropped from
    standard error and every other line is written on: wrapped around an import that
    may import TensorFlow (the command's, and ``beatloop.fit``'s in Python)."""
    with dropping(START_UP_NOISE):
        yield


@contextlib.contextmanager
def one_line_warnings():
    """While it lasts, Python warnings and TensorFlow's logged warnings show as
    ``beatloop: warning: ...`` lines, without the source line Python adds; what was
    there before comes back after."""
    import tensorflow as tf

    tf.get_logger()  # TensorFlow adds its own handler on first use: let it, then replace it
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    saved_show = warnings.showwarning
    saved = {}
    for name in ("tensorflow", "absl"):
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.propagate)
        # Plain stream handlers print to the terminal; others (files, tests') stay.
        logger.handlers[:] = [h for h in logger.handlers if type(h) is not logging.StreamHandler]
        logger.addHandler(handler)
        logger.propagate = False
    warnings.showwarning = _show_warning
    try:
        yield
    finally:
        warnings.showwarning = saved_show
        for name, (handlers, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.propagate = propagate


def warning_line(message: object) -> str:
    """``beatloop: warning: MESSAGE`` on one line."""
    return "beatloop: warning: " + " ".join(str(message).split())


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """One line; a deprecation names the file and line that used the old path (a
    plugin's, say), which its words alone do not."""
    text = warning_line(message)
    if issubclass(category, DeprecationWarning):
        text += f" (at {filename}:{lineno})"
    print(text, file=file or sys.stderr)


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        source = "" if record.name == "root" else f"{record.name}: "
        level = "warning" if record.levelno < logging.ERROR else "error"
        return f"beatloop: {level}: {source}" + " ".join(record.getMessage().split())
