"""Letting go of ``tf.data`` iterators without waiting for them.

Destroying an iterator joins its autotuning thread, which may be asleep for up to a
minute between optimisations: whoever drops the last reference waits. A run hands the
iterators it is done with to ``IteratorReleaser``; the one a data stream still keeps when
it is freed (often by a garbage collection of a forgotten engine) goes to
``release_apart``, a thread of its own that the process waits for at exit; and an error
raised through a compiled call clears the locals of the finished library frames in its
traceback (``forget_library_locals``), where the iterator was an argument, so that an
error kept in a notebook or a test keeps no iterator alive.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import sys
import threading


class IteratorReleaser:
    """Destroys iterators on a thread of its own, in the order they are released.

    ``release`` takes a list holding the iterator, so that the list is the iterator's last
    reference and clearing it on the releasing thread is what destroys it. ``wait``
    returns once every released iterator is gone (a run calls it at its end, so no
    TensorFlow work is left running behind it).
    """

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def release(self, holder: list) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._drain, name="beatloop-iterator-release", daemon=True
            )
            self._thread.start()
        self._queue.put(holder)

    def wait(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _drain(self) -> None:
        while (holder := self._queue.get()) is not None:
            holder.clear()


class ApartReleases:
    """Threads each destroying one freed stream's iterator. The process waits for them
    at exit (``atexit``, registered on first use): a thread still inside TensorFlow's
    destructor when the interpreter shuts down would be unwound through it, and that
    aborts the process."""

    def __init__(self):
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._registered = False

    def start(self, holder: list) -> None:
        if sys.is_finalizing():  # no new thread now: destroy it here
            holder.clear()
            return
        thread = threading.Thread(
            target=self._destroy, args=(holder,), name="beatloop-iterator-release", daemon=True
        )
        with self._lock:
            if not self._registered:
                atexit.register(self.wait)
                self._registered = True
            self._threads.add(thread)
        thread.start()

    def wait(self) -> None:
        """Until every iterator handed over is destroyed."""
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join()

    def _destroy(self, holder: list) -> None:
        holder.clear()
        with self._lock:
            self._threads.discard(threading.current_thread())


APART = ApartReleases()


def release_apart(kept: list) -> None:
    """A freed stream's kept iterator, destroyed on a thread of its own (``kept`` is its
    last reference once the stream is gone)."""
    if kept:
        APART.start([kept.pop()])


_LIBRARIES = ("beatloop.core.", "tensorflow.", "keras.")


def forget_library_locals(error: BaseException) -> None:
    """Clear the locals of the finished beatloop, TensorFlow and Keras frames in the
    tracebacks of ``error`` and its causes, so that a kept error keeps no iterator (or
    other tensor) alive; the user's frames keep theirs, for a post-mortem."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_globals.get("__name__", "").startswith(_LIBRARIES):
                with contextlib.suppress(RuntimeError):  # still running: above the call
                    frame.clear()
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
