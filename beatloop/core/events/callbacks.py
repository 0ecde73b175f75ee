"""Callbacks: objects that react to the engine's events, between compiled calls.

A callback overrides ``on_<event>`` methods for the events in ``EVENTS``. A method
named ``on_...`` that matches no event is refused when the class is defined, so a typo
fails loudly instead of never being called.

Callbacks run in ``order`` (lower first; equal orders keep the order they were given
in): the recipe's figures, then producers (a sample grid, next epoch's loss weights),
then plain callbacks, then writers (history, log files, TensorBoard, the progress bar),
so what a writer records never depends on where a callback stood in a list.

An event method can be *filtered* (as Ignite's ``Events.X(every=N)``): decorated with
``@when(every=N)`` it runs on every N-th epoch (epoch and validation events) or at the
first execution end at or past every N-th step (``on_execution_end``); ``@when(once=N)``
runs it once, at epoch N or at the first execution end at or past step N. An instance
may set its own ``filters`` mapping (event name -> ``EventFilter``).

An exception a callback's event method raises reaches the user as a
``UserCodeError`` naming the callback, the event and the
callback's own line, the original chained as its ``__cause__``. beatloop's own errors
(raised on purpose, from any callback), ``KeyboardInterrupt`` (``RunInterrupted``) and
``SystemExit`` pass unchanged, as does an error in one of beatloop's own callbacks
that no user code is part of.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

import attrs

from beatloop.core.compiled.user_code import user_frame
from beatloop.core.events.run import Run
from beatloop.core.failures.errors import (
    BeatloopError,
    CallbackError,
    MismatchFound,
    UserCodeError,
    did_you_mean,
)
from beatloop.core.failures.fields import one_line_frozen
from beatloop.moved import current_path

EVENTS = (
    "fit_start",
    "fit_end",
    "epoch_start",
    "epoch_end",
    "execution_start",
    "execution_end",
    "validation_start",
    "validation_end",
    "exception",
)
"""Every event a callback can react to (``beatloop.Run`` is what each gets first): a callback
overrides ``on_<event>`` for those it wants (``on_epoch_end(run, epoch, logs)``, ...),
and a method ``on_...`` naming no event is refused when its class is defined."""

#: Events a filter can count: epochs for these, steps for ``execution_end``.
EPOCH_EVENTS = ("epoch_start", "epoch_end", "validation_start", "validation_end")
FILTERABLE = (*EPOCH_EVENTS, "execution_end")


class Order:
    """Where a callback runs among the others at an event: lower first."""

    #: Figures logged with the epoch, computed from the state the epoch ended in.
    FIGURES = -20
    #: Makes what others read: pictures, state for the next epoch.
    PRODUCER = -10
    #: Callbacks that use the logs (early stopping, a user's own).
    DEFAULT = 0
    #: Records what the run logged: history, log files, TensorBoard, the progress bar.
    WRITER = 10


def _at_least_one(instance, attribute, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise CallbackError(f"when({attribute.name}=...) takes an integer >= 1, got {value!r}")


@one_line_frozen
class EventFilter:
    """When a filtered event method runs: at every ``every``-th epoch or step, or
    ``once``, at the ``once``-th (give one of them)."""

    every: int | None = attrs.field(default=None, validator=_at_least_one)
    once: int | None = attrs.field(default=None, validator=_at_least_one)

    def __attrs_post_init__(self) -> None:
        if (self.every is None) == (self.once is None):
            raise CallbackError("when() takes one of every=N or once=N")

    def admits(self, event: str, run: Run, args: tuple) -> bool:
        """Whether the count this event moved past (epochs, or steps for an execution
        end) reaches a multiple of ``every``, or ``once``."""
        before, now = _span(event, run, args)
        if self.every is not None:
            return before // self.every < now // self.every
        return before < self.once <= now


def _span(event: str, run: Run, args: tuple) -> tuple[int, int]:
    """The count before and at an event: steps done for an execution end (it ran
    ``args[0]`` steps); otherwise the epoch's number, counted from 1."""
    if event == "execution_end":
        return run.step - args[0], run.step
    number = args[0] + 1 if event in ("epoch_start", "epoch_end") else run.epoch + 1
    return number - 1, number


def when(*, every: int | None = None, once: int | None = None):
    """Filter an event method: ``@when(every=5)`` runs it every 5th epoch (or, on
    ``on_execution_end``, every 5 steps); ``@when(once=3)`` once, at the 3rd."""
    event_filter = EventFilter(every, once)

    def mark(method):
        method.__beatloop_filter__ = event_filter
        return method

    return mark


def _check_filters(owner: str, filters: Mapping[str, EventFilter]) -> None:
    for event, event_filter in filters.items():
        if event not in FILTERABLE:
            raise CallbackError(
                f"{owner} filters on_{event}, which cannot be filtered; filterable: "
                + ", ".join(f"on_{e}" for e in FILTERABLE)
            )
        if not isinstance(event_filter, EventFilter):
            raise CallbackError(f"{owner}'s filter for on_{event} must be an EventFilter")


class Callback:
    """Base class: override any of the ``on_<event>`` methods below.

    ``logs`` map logged names (``loss``, ``val_accuracy``, ...) to floats. At execution
    end they are computed only when read, so a callback that ignores them costs nothing.
    At epoch end they are a dict that callbacks of a lower ``order`` may have added
    figures to.
    """

    #: Name under which ``beatloop run --callback NAME`` finds this callback, if any.
    callback_name: str = ""
    #: Where this callback runs among others at an event (see ``Order``).
    order: int = Order.DEFAULT
    #: Event name -> filter, from ``@when`` on this class's methods (and its bases').
    filters: ClassVar[Mapping[str, EventFilter]] = {}
    #: The most steps per compiled call this callback works with (``None``: any): set 1
    #: to see every step at ``on_execution_end``. ``steps_per_execution="auto"`` stays at
    #: or below it; a larger fixed ``steps_per_execution`` is refused.
    max_steps_per_execution: int | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        known = {f"on_{event}" for event in EVENTS}
        filters = dict(cls.filters)
        for attribute, value in vars(cls).items():
            if attribute.startswith("on_") and attribute not in known:
                raise CallbackError(
                    f"{cls.__name__}.{attribute} is not an event method"
                    f"{did_you_mean(attribute, known)}; events: {', '.join(sorted(known))}"
                )
            event_filter = getattr(value, "__beatloop_filter__", None)
            if event_filter is not None:
                filters[attribute.removeprefix("on_")] = event_filter
        _check_filters(cls.__name__, filters)
        cls.filters = filters

    def on_fit_start(self, run: Run) -> None:
        """Before the first epoch."""

    def on_fit_end(self, run: Run, logs: Mapping[str, float]) -> None:
        """After the last epoch, with its logs."""

    def on_epoch_start(self, run: Run, epoch: int) -> None:
        """Before an epoch's first step; ``epoch`` counts from 0."""

    def on_epoch_end(self, run: Run, epoch: int, logs: dict[str, float]) -> None:
        """After an epoch and its validation; ``logs`` hold training and ``val_`` figures
        (add your own to log them with the epoch)."""

    def on_execution_start(self, run: Run) -> None:
        """Before one compiled call of up to ``steps_per_execution`` steps."""

    def on_execution_end(self, run: Run, steps: int, logs: Mapping[str, float]) -> None:
        """After one compiled call that ran ``steps`` steps (fewer than K at epoch end)."""

    def on_validation_start(self, run: Run) -> None:
        """Before validation at the end of an epoch."""

    def on_validation_end(self, run: Run, logs: Mapping[str, float]) -> None:
        """After validation, with the ``val_`` figures."""

    def on_exception(self, run: Run, error: BaseException) -> None:
        """When the run stops with an exception (it is re-raised afterwards)."""

    def next_boundary(self, run: Run) -> int | None:
        """The next step number (counted from 0 over the run, above ``run.step``) at
        which a compiled call must end, so that this callback's events fall exactly there
        (a profiled range's edges); ``None``: calls may end anywhere. Calls are shortened
        to meet it; the weights do not depend on where calls end."""
        return None

    def checkpoint_state(self) -> dict | None:
        """JSON-able state this callback needs to resume with, saved in every checkpoint
        (``None``: nothing to save). Override with ``restore_state``."""
        return None

    def restore_state(self, state: dict) -> None:
        """Take back what ``checkpoint_state`` returned, when a run resumes."""


@attrs.frozen
class _Filtered:
    """An event method that runs only when its filter admits the event."""

    method: object
    event: str
    event_filter: EventFilter

    def __call__(self, run: Run, *args) -> None:
        if self.event_filter.admits(self.event, run, args):
            self.method(run, *args)


class CallbackList:
    """Fires an event on every callback that overrides it, in ``order``."""

    def __init__(self, callbacks: Iterable[Callback]):
        given = list(callbacks)
        for callback in given:
            if not isinstance(callback, Callback):
                raise CallbackError(
                    "callbacks must be beatloop.Callback or keras.callbacks.Callback instances, "
                    f"got {type(callback).__name__}"
                )
            _check_filters(type(callback).__name__, callback.filters)
        self.callbacks = sorted(given, key=lambda callback: callback.order)
        self._listeners = {
            event: [
                (c, _listener(c, event))
                for c in self.callbacks
                if getattr(type(c), f"on_{event}") is not getattr(Callback, f"on_{event}")
            ]
            for event in EVENTS
        }
        self._bounding = [
            c for c in self.callbacks if type(c).next_boundary is not Callback.next_boundary
        ]

    def fire(self, event: str, *args) -> None:
        """Call every listener of ``event``, in order; an exception from one is raised
        as ``reported`` makes it."""
        for callback, listener in self._listeners[event]:
            try:
                listener(*args)
            except Exception as error:
                raise reported(error, callback, event)  # noqa: B904 (chained there)

    def next_boundary(self, run: Run) -> int | None:
        """The nearest step ahead of ``run.step`` at which some callback wants a call to
        end (``Callback.next_boundary``), ``None`` when none does."""
        if not self._bounding:  # no step read between calls unless someone asks
            return None
        step = run.step
        wanted = [b for c in self._bounding if (b := c.next_boundary(run)) is not None]
        ahead = [b for b in wanted if b > step]
        return min(ahead) if ahead else None

    def _keyed(self) -> dict[str, Callback]:
        """Each callback under its class path and its rank among callbacks of its class."""
        keyed: dict[str, Callback] = {}
        for callback in self.callbacks:
            name = f"{type(callback).__module__}.{type(callback).__qualname__}"
            rank = sum(key.rsplit("#", 1)[0] == name for key in keyed)
            keyed[f"{name}#{rank}"] = callback
        return keyed

    def checkpoint_state(self) -> dict[str, dict]:
        """Every callback's state that is not ``None``, keyed by class and rank."""
        states = {key: c.checkpoint_state() for key, c in self._keyed().items()}
        return {key: state for key, state in states.items() if state is not None}

    def restore_state(self, states: Mapping[str, dict]) -> None:
        """Hand each callback its saved state; callbacks new to this run start afresh. A
        state saved under the path of a module that has moved since (``beatloop.moved``)
        is its class's under the class's path now."""
        states = {_current_key(key): state for key, state in states.items()}
        for key, callback in self._keyed().items():
            if key in states:
                callback.restore_state(states[key])


def _current_key(key: str) -> str:
    """A saved ``path#rank`` key with the class path read as it is now."""
    path, _, rank = key.rpartition("#")
    return f"{current_path(path) or path}#{rank}"


def reported(error: Exception, callback: Callback, event: str) -> Exception:
    """The exception to raise for ``error`` from ``callback``'s ``on_<event>``: itself
    when it is beatloop's (raised on purpose), or when it comes from one of beatloop's
    own callbacks and no line of user code is in its traceback; the data mismatch it
    carries; else a UserCodeError naming the callback, the event and the callback's
    line, caused by it."""
    if isinstance(error, BeatloopError):
        return error
    at = user_frame(error)
    if isinstance(error, MismatchFound):  # a callback calling a model through ModelCalls
        mismatch = error.error.completed(at=at)
        mismatch.__suppress_context__ = True
        return mismatch
    # A callback wrapping the user's (a Keras callback) names it with ``reported_as``.
    shown = getattr(callback, "reported_as", None)
    if at is None and shown is None and _beatloops_own(callback):
        return error
    shown = shown or type(callback).__name__
    named = UserCodeError(f"callback {shown!r} in on_{event}", error, at=at)
    named.__suppress_context__ = True
    return named


def _beatloops_own(callback: Callback) -> bool:
    """Whether ``callback``'s class is one of beatloop's (its recipes' count as user code)."""
    module = type(callback).__module__
    return module.startswith("beatloop.") and not module.startswith("beatloop.recipes.")


def _listener(callback: Callback, event: str):
    method = getattr(callback, f"on_{event}")
    event_filter = callback.filters.get(event)
    return method if event_filter is None else _Filtered(method, event, event_filter)
