"""Keras callbacks in a beatloop run, working as they do in ``model.fit``.

A ``keras.callbacks.Callback`` in ``callbacks=`` is wrapped in a ``KerasCallback``:
a beatloop callback that calls the Keras one's methods at the events ``fit`` would call
them at. The Keras callback sees one model and one optimizer: by default the recipe's
primary model (``primary_model``) and the optimizer of the beat that updates it (for a
recipe in phases, in the current phase: looked up again when a phase starts);
``keras_callback`` names others.

As ``self.model`` the Keras callback gets a ``ModelView``, never the model itself:
it delegates everything to the real model but ``optimizer`` (the chosen beatloop
optimizer, so ``self.model.optimizer.learning_rate`` reads and assigns that optimizer's
learning rate) and ``stop_training`` (the run's ``Run.stop_training``). Nothing is
set on the user's model, whose checkpoint layout would change if it tracked an
optimizer.

The events, as Keras 3's ``fit`` fires them:

- ``on_train_begin()`` at the run's start, after ``set_model`` and ``set_params``
  (``epochs``, ``steps`` per epoch or ``None`` when unknown, ``verbose`` 0: beatloop
  draws its own progress);
- ``on_epoch_begin(epoch)``, ``on_epoch_end(epoch, logs)``, ``epoch`` counted from 0, the
  logs beatloop's figures (each beat's loss, the metrics, their ``val_`` twins, and what
  other callbacks of a lower ``order`` added); what the Keras callback adds to them is
  logged with the epoch;
- ``on_train_batch_begin(batch)`` and ``on_train_batch_end(batch, logs)`` once per
  compiled call (``steps_per_execution`` steps; under ``"auto"`` a Keras callback with
  batch hooks makes every call one step, as ``fit``'s default), as Keras 3 fires them:
  ``batch`` is the index in the epoch of the call's first batch at its begin, and that index plus
  ``steps_per_execution - 1`` at its end; the logs are the running figures;
- ``on_test_begin()`` and ``on_test_end(logs)`` around validation, the logs without
  their ``val_`` prefix (there are no per-batch validation events);
- ``on_train_end(logs)`` with the last epoch's logs, when the run ends without error.

Setting ``self.model.stop_training = True`` ends the run after the current epoch (``fit``
ends the epoch's training at that batch; beatloop finishes the epoch). A Keras
callback's state is not in beatloop's checkpoints: on a resumed run the Keras callbacks
start afresh (a ``ResumeWarning`` says so).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import keras

from beatloop.core.compiled.binding import BoundSchedule
from beatloop.core.events.callbacks import Callback, Order
from beatloop.core.events.run import Run
from beatloop.core.failures.errors import CallbackError, ResumeWarning, did_you_mean


class ModelView:
    """A Keras callback's ``self.model``: the real model in everything but ``optimizer``
    (the chosen beatloop optimizer; it cannot be replaced) and ``stop_training`` (the
    run's). Reading or setting any other attribute reads or sets the model's."""

    __slots__ = ("_model", "_name", "_optimizer", "_owner", "_run")

    def __init__(self, model, name: str, optimizer, run: Run, owner: str):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "_owner", owner)

    @property
    def optimizer(self) -> keras.optimizers.Optimizer:
        if self._optimizer is None:
            raise CallbackError(
                f"Keras callback {self._owner} reads model.optimizer, but no beat updates "
                f"model {self._name!r}: name an optimizer with "
                "beatloop.keras_callback(callback, optimizer=...)"
            )
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value) -> None:
        raise CallbackError(
            f"Keras callback {self._owner} cannot replace the optimizer of a beatloop run; "
            "assign its learning_rate instead"
        )

    @property
    def stop_training(self) -> bool:
        return self._run.stop_training

    @stop_training.setter
    def stop_training(self, value) -> None:
        self._run.stop_training = bool(value)

    def __getattr__(self, name: str):
        return getattr(object.__getattribute__(self, "_model"), name)

    def __setattr__(self, name: str, value) -> None:
        if name in ("optimizer", "stop_training"):
            object.__setattr__(self, name, value)  # the properties' setters
        else:
            setattr(self._model, name, value)

    def __repr__(self) -> str:
        return f"<beatloop view of model {self._name!r}>"


class KerasCallback(Callback):
    """A ``keras.callbacks.Callback`` in a beatloop run (see the module's docstring):
    ``callback`` sees model ``model`` (default: the recipe's primary model) and optimizer
    ``optimizer`` (default: the optimizer of the beat that updates that model).

    Its state is not checkpointed: on a resumed run it starts afresh."""

    order = Order.DEFAULT

    def __init__(
        self,
        callback: keras.callbacks.Callback,
        *,
        model: str | None = None,
        optimizer: str | None = None,
    ):
        if not isinstance(callback, keras.callbacks.Callback):
            raise CallbackError(
                f"keras_callback() takes a keras.callbacks.Callback, got {type(callback).__name__}"
            )
        for argument, value in (("model", model), ("optimizer", optimizer)):
            if value is not None and not isinstance(value, str):
                raise CallbackError(
                    f"keras_callback({argument}=...) takes a name, got {type(value).__name__}"
                )
        self.callback = callback
        self.model = model
        self.optimizer = optimizer
        self._batch_logs = _overrides(callback, "on_train_batch_end", "on_batch_end")
        self.has_batch_hooks = self._batch_logs or _overrides(
            callback, "on_train_batch_begin", "on_batch_begin"
        )
        self._bound: tuple[str, str | None] | None = None
        self._view: ModelView | None = None
        self._phase: BoundSchedule | None = None  # the bound schedule the view shows
        self._begin = 0

    @property
    def reported_as(self) -> str:
        """How errors name this callback: the Keras callback's class (an error in it is
        the user's, never beatloop's own)."""
        return f"{type(self.callback).__name__} (a Keras callback)"

    def bind(self, recipe, bound: BoundSchedule) -> tuple[str, str | None]:
        """Resolve the model and optimizer names against a run's parts (the engine does,
        before the run starts): ``(model, optimizer)``, the optimizer ``None`` when no
        beat updates the model and none was named. The names asked for are kept, so the
        same KerasCallback can serve another run."""
        model = _model_name(recipe, bound, self.model, self.reported_as)
        optimizer = self.optimizer
        if optimizer is None:
            optimizer = _optimizer_of(bound, model, self.reported_as)
        elif optimizer not in bound.optimizers:
            raise CallbackError(
                f"keras_callback(optimizer={optimizer!r}): the run has no optimizer of "
                f"that name{did_you_mean(optimizer, bound.optimizers)}; its optimizers: "
                + ", ".join(bound.optimizers)
            )
        self._bound = (model, optimizer)
        return self._bound

    def _optimizer_now(self, run: Run):
        """The optimizer the Keras callback sees: the one named, else that of the beats
        updating its model in the run's schedule now (in phases: the current phase's)."""
        model, optimizer = self._bound or self.bind(run.recipe, run.bound)
        if self.optimizer is None:
            optimizer = _optimizer_of(run.bound, model, self.reported_as)
        self._phase = run.bound
        return None if optimizer is None else run.optimizers[optimizer]

    def on_fit_start(self, run: Run) -> None:
        chosen = self._optimizer_now(run)
        model = self._bound[0]
        self._view = ModelView(run.models[model], model, chosen, run, self.reported_as)
        self.callback.set_model(self._view)
        self.callback.set_params({"verbose": 0, "epochs": run.epochs, "steps": run.steps_per_epoch})
        self.callback.on_train_begin({})

    def on_fit_end(self, run: Run, logs: Mapping[str, float]) -> None:
        self.callback.on_train_end(_floats(logs))

    def on_epoch_start(self, run: Run, epoch: int) -> None:
        if self._view is not None and run.bound is not self._phase:  # another phase
            object.__setattr__(self._view, "_optimizer", self._optimizer_now(run))
        self.callback.on_epoch_begin(epoch, {})

    def on_epoch_end(self, run: Run, epoch: int, logs: dict[str, float]) -> None:
        self.callback.on_epoch_end(epoch, logs)  # what it adds is logged with the epoch

    def on_execution_start(self, run: Run) -> None:
        self._begin = int(run.counters.epoch_batches)
        self.callback.on_train_batch_begin(self._begin, {})

    def on_execution_end(self, run: Run, steps: int, logs: Mapping[str, float]) -> None:
        end = self._begin + run.steps_per_execution - 1  # as Keras 3: the call's last index
        self.callback.on_train_batch_end(end, _floats(logs) if self._batch_logs else {})

    def on_validation_start(self, run: Run) -> None:
        self.callback.on_test_begin({})

    def on_validation_end(self, run: Run, logs: Mapping[str, float]) -> None:
        self.callback.on_test_end({name.removeprefix("val_"): v for name, v in logs.items()})


def keras_callback(
    callback: keras.callbacks.Callback, *, model: str | None = None, optimizer: str | None = None
) -> KerasCallback:
    """``callback`` (a ``keras.callbacks.Callback``) for ``beatloop.fit``'s ``callbacks=``,
    seeing model ``model`` and optimizer ``optimizer`` of the run (by the names
    ``beatloop show`` prints). Default: the recipe's primary model, and the optimizer of
    the beat that updates it. A Keras callback passed without this gets the defaults.

    The Keras callback's state is not in beatloop's checkpoints: on a resumed run it
    starts afresh."""
    return KerasCallback(callback, model=model, optimizer=optimizer)


def adapt_callbacks(callbacks: Iterable, recipe, bound: BoundSchedule, auto: bool = False) -> list:
    """``callbacks`` with each Keras callback wrapped in a ``KerasCallback``, and
    every ``KerasCallback`` bound to the run's model and optimizer. Under
    ``steps_per_execution="auto"`` (``auto``) one with batch hooks asks for one step per
    call, so they fire per batch as in Keras's ``fit`` by default."""
    adapted = []
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.Callback):
            callback = KerasCallback(callback)
        if isinstance(callback, KerasCallback):
            callback.bind(recipe, bound)
            if auto and callback.has_batch_hooks:
                callback.max_steps_per_execution = 1
        adapted.append(callback)
    return adapted


def warn_if_resumed(callbacks: Sequence, run: Run) -> None:
    """One ``ResumeWarning`` when a run with Keras callbacks resumed: their state
    was not saved, so they start afresh."""
    named = [type(c.callback).__name__ for c in callbacks if isinstance(c, KerasCallback)]
    if named and run.resumed_from is not None:
        warnings.warn(
            f"this run resumed from {run.resumed_from}, but the state of its Keras "
            f"callbacks ({', '.join(named)}) is not in beatloop's checkpoints: they start "
            "afresh (an EarlyStopping's patience, a ReduceLROnPlateau's wait count from now)",
            ResumeWarning,
            stacklevel=2,
        )


def primary_model(recipe, bound: BoundSchedule, owner: str = "a Keras callback") -> str:
    """The model a Keras callback sees by default: the recipe's ``primary_model``, else
    the one model its beats update; several updated models are refused as ambiguous."""
    declared = getattr(recipe, "primary_model", None)
    name = getattr(recipe, "name", "") or type(recipe).__name__
    if declared is not None:
        if declared not in bound.models:
            raise CallbackError(
                f"recipe {name!r} declares primary_model {declared!r}, which is not one of "
                f"its models: {', '.join(bound.models)}"
            )
        return declared
    updated = _unique(model for beat in bound.beats for model in beat.updated_models)
    if len(updated) == 1:
        return updated[0]
    raise CallbackError(
        f"recipe {name!r} declares no primary_model and its beats update "
        f"{len(updated)} models ({', '.join(updated)}): name the one {owner} sees with "
        "beatloop.keras_callback(callback, model=...)"
    )


def _model_name(recipe, bound: BoundSchedule, model: str | None, owner: str) -> str:
    if model is None:
        return primary_model(recipe, bound, owner)
    if model not in bound.models:
        raise CallbackError(
            f"keras_callback(model={model!r}): the run has no model of that name"
            f"{did_you_mean(model, bound.models)}; its models: " + ", ".join(bound.models)
        )
    return model


def _optimizer_of(bound: BoundSchedule, model: str, owner: str) -> str | None:
    """The optimizer of the beats that update ``model`` (``None`` when none does)."""
    names = _unique(beat.optimizer_name for beat in bound.beats if model in beat.updated_models)
    if len(names) > 1:
        raise CallbackError(
            f"model {model!r} is updated by beats with different optimizers "
            f"({', '.join(names)}): name the one {owner} sees with "
            "beatloop.keras_callback(callback, optimizer=...)"
        )
    return names[0] if names else None


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _overrides(callback: keras.callbacks.Callback, *methods: str) -> bool:
    """Whether ``callback``'s class overrides any of ``methods`` of Keras's base class."""
    base = keras.callbacks.Callback
    return any(getattr(type(callback), m) is not getattr(base, m) for m in methods)


def _floats(logs: Mapping[str, Any] | None) -> dict[str, float]:
    return {name: float(value) for name, value in (logs or {}).items()}
