"""Grappler's give-up lines kept off standard error.

Grappler, TensorFlow's graph optimiser, runs when a compiled function is first called.
When one of its passes cannot rewrite a graph it prints an ``E0000 ...
meta_optimizer.cc:NNN] remapper failed: ...`` line from C++ straight to file descriptor
2 (no log level hides it) and runs the graph without that pass, correctly
(``benchmarks/remapper.py`` measures what the remapper's rewrite is worth). The data
stream wraps the first call of each compiled loop in ``hidden``, which drops those
lines only and passes every other line through as it comes (``dropping``, which
also keeps TensorFlow's start-up lines out while the command line imports it).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import sys
import threading

#: A Grappler pass giving up on a graph (the graph runs without that pass).
GIVE_UP = re.compile(r"meta_optimizer\.cc:\d+\] \w+ failed: ")

_shown = contextvars.ContextVar("beatloop_grappler_lines_shown", default=False)


@contextlib.contextmanager
def shown():
    """While it lasts, ``hidden`` hides nothing (the CLI's ``--verbose``)."""
    token = _shown.set(True)
    try:
        yield
    finally:
        _shown.reset(token)


@contextlib.contextmanager
def hidden():
    """While it lasts, lines written to file descriptor 2 that match ``GIVE_UP`` are
    dropped; the others are written on as soon as they end."""
    if _shown.get():
        yield
        return
    with dropping(GIVE_UP):
        yield


@contextlib.contextmanager
def dropping(lines: re.Pattern):
    """While it lasts, lines written to file descriptor 2 (by Python or C++) that match
    ``lines`` are dropped; the others are written on as soon as they end."""
    try:
        descriptor = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file: nothing to filter
        yield
        return
    sys.stderr.flush()
    saved = os.dup(descriptor)
    reading, writing = os.pipe()
    os.dup2(writing, descriptor)
    os.close(writing)
    relay = threading.Thread(
        target=_relay, args=(reading, saved, lines), name="beatloop-stderr-filter", daemon=True
    )
    relay.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, descriptor)  # the pipe's last writer closes: the relay reads its end
        relay.join(timeout=5)


def _relay(reading: int, target: int, dropped: re.Pattern) -> None:
    """Copy lines from ``reading`` to ``target`` until the pipe closes, dropping those
    that match ``dropped``; close both descriptors at the end."""
    pending = b""
    try:
        while chunk := os.read(reading, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not _matches(dropped, line))
            _write(target, kept)
        if not _matches(dropped, pending):
            _write(target, pending)
    finally:
        os.close(reading)
        os.close(target)


def _write(target: int, data: bytes) -> None:
    while data:
        data = data[os.write(target, data) :]


def _matches(pattern: re.Pattern, line: bytes) -> bool:
    return pattern.search(line.decode("utf-8", errors="replace")) is not None
