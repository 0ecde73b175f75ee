"""The calls a tracking logger makes to its store, made in order by one daemon thread of
their own, so that a store that stops answering (a hung server, a stalled proxy) holds up
that thread and never the run: the training thread sends a call and goes on (``send``),
or waits for its answer at most a bounded time (``ask``), a wait Ctrl-C and SIGTERM end
at once. A call left unanswered stays in its thread until MLflow's own client gives up;
nothing sent after it is made."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import wait as wait_for

from beatloop import ConfigError, RunInterrupted

#: Seconds one call to a tracking store may take (``BEATLOOP_MLFLOW_TIMEOUT`` sets another).
STORE_SECONDS = 10.0
TIMEOUT_VARIABLE = "BEATLOOP_MLFLOW_TIMEOUT"
#: How often a waiting training thread looks whether the call it waits on still runs.
_SLICE = 0.1


class TrackingWarning(UserWarning):
    """The tracking store failed during a run (a server gone or not answering, a run
    deleted): the run trains on, no longer tracked; its figures stay in the run dir's
    ``history.jsonl``."""


class StoreStalled(Exception):
    """A call to the tracking store did not end within its bound."""


def store_seconds(given: float | None) -> float:
    """The bound on one call to the store: ``given``, else ``BEATLOOP_MLFLOW_TIMEOUT``,
    else ``STORE_SECONDS``; a ConfigError for anything but a number of seconds > 0."""
    where, value = "timeout", given
    if value is None:
        where, value = TIMEOUT_VARIABLE, os.environ.get(TIMEOUT_VARIABLE) or STORE_SECONDS
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = 0.0  # refused below
    if isinstance(value, bool) or not 0 < seconds < float("inf"):
        raise ConfigError(
            f"{where} (the MLflow store's time to answer) must be a number of seconds > 0, "
            f"got {value!r}"
        )
    return seconds


class StoreWorker:
    """One daemon thread making a store's calls in the order they were sent; a call that
    runs longer than ``seconds`` is a stall (``stalled``), and ``ask`` stops waiting."""

    def __init__(self, seconds: float, name: str = "beatloop-mlflow"):
        self.seconds = seconds
        self._calls: deque[tuple[Future, Callable]] = deque()
        self._ready = threading.Condition()
        self._sent: deque[Future] = deque()  # sent with ``send``, oldest first, until done
        self._started: float | None = None  # when the call running now started
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def send(self, call: Callable[[], object]) -> None:
        """Make ``call`` after those sent before it; do not wait for it (``failure``
        reports the first one that raised)."""
        self._sent.append(self._put(call))

    def ask(self, call: Callable[[], object], what: str, *, bounded: bool = True):
        """``call()``'s result, made after the calls sent before it; ``StoreStalled``
        when one call runs longer than ``seconds`` (``bounded=False``: wait as long as
        it takes). Ctrl-C and SIGTERM end the wait at once, as ``RunInterrupted``."""
        future = self._put(call)
        if not self._wait([future], what, bounded):
            raise StoreStalled(f"no answer within {self.seconds:g} s ({what})")
        return future.result()

    def finish(self, what: str, within: float | None = None) -> bool:
        """Wait until every call sent has been made, each within ``seconds`` (and all
        within ``within`` seconds, when given): ``False`` at a stall (the calls not yet
        made are dropped)."""
        return self._wait(list(self._sent), what, bounded=True, within=within)

    def failure(self) -> BaseException | None:
        """The error of the first sent call that raised, ``None`` while none did."""
        while self._sent and self._sent[0].done():
            error = self._sent[0].exception()
            if error is not None:
                return error
            self._sent.popleft()
        return None

    def stalled(self) -> bool:
        """Whether the call running now has run longer than ``seconds``."""
        started = self._started
        return started is not None and time.monotonic() - started > self.seconds

    def close(self) -> None:
        """No more calls: those not yet made are dropped, the thread ends after the one
        it makes now (left to MLflow's own timeout when the store does not answer)."""
        with self._ready:
            self._closed = True
            dropped, self._calls = list(self._calls), deque()
            self._ready.notify()
        for future, _ in dropped:
            future.cancel()
        self._sent.clear()

    def _put(self, call: Callable[[], object]) -> Future:
        future: Future = Future()
        with self._ready:
            if self._closed:
                future.cancel()
            else:
                self._calls.append((future, call))
                self._ready.notify()
        return future

    def _wait(
        self, futures: list[Future], what: str, bounded: bool, within: float | None = None
    ) -> bool:
        """Wait until ``futures`` are done: ``False`` when a call stalled first, or
        ``within`` seconds passed (then the worker is closed)."""
        deadline = None if within is None else time.monotonic() + within
        with stopping_on_signals(what):
            while wait_for(futures, timeout=_SLICE).not_done:
                late = deadline is not None and time.monotonic() > deadline
                if late or (bounded and self.stalled()):
                    self.close()
                    return False
        return True

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._calls and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                future, call = self._calls.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            self._started = time.monotonic()
            try:
                future.set_result(call())
            except BaseException as error:  # the store's, whatever it is: the asker's
                future.set_exception(error)
            finally:
                self._started = None


@contextlib.contextmanager
def stopping_on_signals(what: str) -> Iterator[None]:
    """While the main thread waits on the store: Ctrl-C and SIGTERM, where they would
    act as usual (their default handlers), raise ``RunInterrupted`` at once, so the run
    ends as an interrupted one (exit 130 or 143, its run dir's lock released)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    ours = [signum for signum, usual in defaults.items() if signal.getsignal(signum) is usual]

    def stop(signum, frame):
        by = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
        raise RunInterrupted(f"{by} while {what}", None, signum)

    for signum in ours:
        signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum in ours:
            signal.signal(signum, defaults[signum])
