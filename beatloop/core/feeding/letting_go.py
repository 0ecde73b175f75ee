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
import os
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

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the releasing thread, if it is not running (``release`` does)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._drain, name="beatloop-iterator-release", daemon=True
            )
            self._thread.start()

    def release(self, holder: list) -> None:
        self.start()
        self._queue.put(holder)

    def wait(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _drain(self) -> None:
        while (holder := self._queue.get()) is not None:
            holder.clear()


class ProcessReleaser(IteratorReleaser):
    """The process's one thread for the iterators of freed streams. It is started where
    a stream is made, so that a garbage collection freeing one only queues to it
    (``SimpleQueue.put`` is safe there; starting a thread is not), and the process waits
    for it at exit: a thread still inside TensorFlow's destructor when the interpreter
    shuts down would be unwound through it, and that aborts the process."""

    def __init__(self):
        super().__init__()
        self._hooked = False
        #: In a forked child, the queues its parent had: never destroyed there.
        self._inherited: list[queue.SimpleQueue] = []

    def start(self) -> None:
        super().start()
        if not self._hooked:
            atexit.register(self.wait)
            os.register_at_fork(after_in_child=self._forget)  # the thread is not forked
            self._hooked = True

    def _forget(self) -> None:
        """In a forked child: a queue of its own for a thread of its own. What the parent
        had queued stays referenced, never destroyed here: an iterator's destructor waits
        for its threads, which are the parent's (the child would hang inside ``fork``,
        before a ``subprocess`` child ever reaches its ``exec``)."""
        self._inherited.append(self._queue)
        self._queue, self._thread = queue.SimpleQueue(), None


APART = ProcessReleaser()


def release_apart(kept: list) -> None:
    """A freed stream's kept iterator, destroyed on ``APART``'s thread (``kept`` is its
    last reference once the stream is gone); here when that thread is not running (at
    exit, or no stream started it)."""
    if not kept:
        return
    holder = [kept.pop()]
    if APART.started and not sys.is_finalizing():
        APART.release(holder)
    else:
        holder.clear()


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
