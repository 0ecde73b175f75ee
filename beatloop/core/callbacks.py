"""Callbacks: objects that react to the engine's events, between compiled calls.

A callback overrides ``on_<event>`` methods for the events in :data:`EVENTS`. A method
named ``on_...`` that matches no event is refused when the class is defined, so a typo
fails loudly instead of never being called.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import keras

from beatloop.core.errors import CallbackError, did_you_mean

if TYPE_CHECKING:
    from beatloop.core.binding import BoundSchedule
    from beatloop.core.recipe import Recipe
    from beatloop.core.state import EngineState

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


@attrs.define(eq=False)
class Run:
    """What callbacks see of the run in progress. Set ``stop_training`` to end it after
    the current epoch; record files the run writes for people (a sample grid, an image)
    in ``artifacts`` by name, so the CLI and the result can point to them."""

    recipe: Recipe
    bound: BoundSchedule
    state: EngineState
    run_dir: Path | None
    epochs: int
    steps_per_execution: int
    steps_per_epoch: int | None
    seed: int
    stop_training: bool = False
    artifacts: dict[str, Path] = attrs.field(factory=dict)
    #: The checkpoint this run resumed from, if it did.
    resumed_from: str | None = None
    #: Paths of the checkpoints written so far by this process, oldest first.
    checkpoints: list[str] = attrs.field(factory=list)

    @property
    def models(self):
        return self.bound.models

    @property
    def optimizers(self):
        return self.bound.optimizers

    @property
    def step(self) -> int:
        """Steps run so far, over all epochs."""
        return int(self.state.step)

    @property
    def epoch(self) -> int:
        """The current epoch, counted from 0."""
        return int(self.state.epoch)

    @property
    def examples(self) -> int:
        return int(self.state.examples)


class Callback:
    """Base class: override any of the ``on_<event>`` methods below.

    ``logs`` map logged names (``loss``, ``val_accuracy``, ...) to floats. At execution
    end they are computed only when read, so a callback that ignores them costs nothing.
    """

    #: Name under which ``beatloop run --callback NAME`` finds this callback, if any.
    callback_name: str = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        known = {f"on_{event}" for event in EVENTS}
        for attribute in vars(cls):
            if attribute.startswith("on_") and attribute not in known:
                raise CallbackError(
                    f"{cls.__name__}.{attribute} is not an event method"
                    f"{did_you_mean(attribute, known)}; events: {', '.join(sorted(known))}"
                )

    def on_fit_start(self, run: Run) -> None:
        """Before the first epoch."""

    def on_fit_end(self, run: Run, logs: Mapping[str, float]) -> None:
        """After the last epoch, with its logs."""

    def on_epoch_start(self, run: Run, epoch: int) -> None:
        """Before an epoch's first step; ``epoch`` counts from 0."""

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        """After an epoch and its validation; ``logs`` hold training and ``val_`` figures."""

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

    def checkpoint_state(self) -> dict | None:
        """JSON-able state this callback needs to resume with, saved in every checkpoint
        (``None``: nothing to save). Override with :meth:`restore_state`."""
        return None

    def restore_state(self, state: dict) -> None:
        """Take back what :meth:`checkpoint_state` returned, when a run resumes."""


class CallbackList:
    """Fires an event on every callback that overrides it, in order."""

    def __init__(self, callbacks: Iterable[Callback]):
        self.callbacks = list(callbacks)
        for callback in self.callbacks:
            if not isinstance(callback, Callback):
                raise CallbackError(
                    f"callbacks must be beatloop.Callback instances, got {type(callback).__name__}"
                )
        self._listeners = {
            event: [
                getattr(c, f"on_{event}")
                for c in self.callbacks
                if getattr(type(c), f"on_{event}") is not getattr(Callback, f"on_{event}")
            ]
            for event in EVENTS
        }

    def fire(self, event: str, *args) -> None:
        for listener in self._listeners[event]:
            listener(*args)

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
        """Hand each callback its saved state; callbacks new to this run start afresh."""
        for key, callback in self._keyed().items():
            if key in states:
                callback.restore_state(states[key])


class LazyLogs(Mapping[str, float]):
    """Logs read from their metrics only when, and only as far as, a callback looks: a
    callback that ignores them costs nothing, one that reads ``loss`` pays for ``loss``."""

    def __init__(self, metrics: Mapping[str, keras.metrics.Metric]):
        self._metrics = metrics
        self._values: dict[str, float] = {}

    def __getitem__(self, key: str) -> float:
        if key not in self._values:
            self._values[key] = float(self._metrics[key].result())
        return self._values[key]

    def __iter__(self):
        return iter(self._metrics)

    def __len__(self) -> int:
        return len(self._metrics)
