"""What a finished run hands back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import keras

from beatloop.core.compiled.binding import BoundSchedule
from beatloop.core.events.export import checkpoint_weights, export_models
from beatloop.core.failures.errors import BeatloopError, CheckpointError
from beatloop.core.running.recipe import Recipe


@attrs.frozen
class FitResult:
    """The outcome of ``beatloop.fit``: per-epoch history, trained parts, and where
    the run wrote its files."""

    recipe: Recipe
    config: Any
    history: Mapping[str, list[float]]
    bound: BoundSchedule
    seed: int
    steps: int
    epochs: int
    run_dir: Path | None = None
    artifacts: Mapping[str, Path] = attrs.field(factory=dict)
    #: The checkpoint this run continued from, if it was resumed.
    resumed_from: str | None = None
    #: The newest checkpoint in the run dir when the run ended.
    checkpoint: str | None = None
    #: Steps per compiled call the run ended with (under ``"auto"``, the K it chose).
    steps_per_execution: int = 1
    #: The figures of the run's last epoch, all from that one epoch (``history``'s last
    #: values can come from different epochs: a recipe in phases logs other figures in
    #: each phase); empty when it is not known (a checkpoint written before it was kept).
    last_epoch: Mapping[str, float] = attrs.field(factory=dict)
    #: The best epoch kept with ``keep_best``, as ``run.json`` records it: ``{"figure",
    #: "mode", "epoch", "value", "checkpoint"}`` (``epoch``: finished epochs, from 1;
    #: ``checkpoint``: its name in ``RUN_DIR/checkpoints``); the one the run ended with,
    #: or for ``restore`` the one its restored checkpoint holds (``best=True``: that
    #: checkpoint itself). ``None``: the run keeps no best, or no epoch has a finite figure.
    best: Mapping[str, Any] | None = None
    #: The engine that ran (or restored) the run, which ``evaluate`` runs on.
    engine: Any = attrs.field(default=None, repr=False, eq=False)

    @property
    def models(self) -> Mapping[str, keras.Layer]:
        """The trained models by name (``result.models["model"]``)."""
        return self.bound.models

    @property
    def optimizers(self) -> Mapping[str, keras.optimizers.Optimizer]:
        return self.bound.optimizers

    @property
    def schedule(self):
        """The schedule the run trained with: a ``Schedule``, or for a recipe in phases
        its ``Phases``, every phase (``describe()`` prints each phase's name, epochs and
        entries; ``result.bound.schedule`` is the phase the run ended in)."""
        phased = getattr(getattr(self.engine, "parts", None), "phased", None)
        return self.bound.schedule if phased is None else phased.phases

    @property
    def state(self) -> dict[str, Any]:
        """The recipe state (``Recipe.build_state``) at the end of the run: each state
        variable's value as a NumPy array, by name (``{}`` for a recipe without any)."""
        return {name: variable.numpy() for name, variable in self.bound.state.items()}

    def evaluate(self, data=None, *, steps_per_execution: int | None = None) -> dict[str, float]:
        """The recipe's validation figures for the models as they are now: every beat's
        loss and every metric, models in inference mode, over ``data`` (a batched
        ``tf.data.Dataset`` of ``(x, y)`` tuples or dicts; ``None``: the run's own
        validation data), by name without the ``val_`` prefix (``{"loss": ...,
        "accuracy": ...}``). On the run's validation data they equal the last epoch's
        ``val_`` figures. Touches no trainable variable, optimizer or counter and writes
        nothing."""
        if self.engine is None:
            raise BeatloopError(
                "this FitResult has no engine to evaluate with; use the one beatloop.fit "
                "or beatloop.restore returns, or beatloop.evaluate(run_dir)"
            )
        return self.engine.evaluate(data, steps_per_execution=steps_per_execution)

    def best_models(self) -> dict[str, keras.Layer]:
        """The models at the best epoch kept with ``keep_best`` (``result.best``), by name:
        copies (``keras.models.clone_model``) holding its checkpoint's weights; this
        result's ``models`` stay as they are. An evaluated average is its own model
        (``"ema"``): the best epoch's, as its figure judged it."""
        with checkpoint_weights(self.models, self._best()):
            return {name: _copy(name, model) for name, model in self.models.items()}

    def export(self, out: str | Path, *, best: bool = False) -> dict[str, Path]:
        """Write each inference model (the classifier, the generator, ...) as a
        SavedModel in ``out/NAME`` with a ``serve`` endpoint; return the paths. An
        evaluated average (``EMA(evaluated=True)``) is what is written, in its source's
        place. ``best=True``: the best epoch's models (``keep_best``), not the last's."""
        return export_models(self.recipe, self.bound, out, self._best() if best else None)

    def _best(self) -> str:
        """The path of the best epoch's checkpoint (``keep_best``), which must exist."""
        checkpoint = (self.best or {}).get("checkpoint")
        if self.run_dir is None or not checkpoint:
            raise BeatloopError(
                "this run keeps no best epoch: fit it with keep_best= (--keep-best) and a "
                "run_dir, and let it finish an epoch"
            )
        path = Path(self.run_dir) / "checkpoints" / checkpoint
        if not Path(f"{path}.index").is_file():
            raise CheckpointError(
                f"the best epoch's checkpoint {path} is gone (its files were deleted); "
                "export(best=False) writes the last epoch's models"
            )
        return str(path)


def _copy(name: str, model: keras.Layer) -> keras.Layer:
    """A model of ``model``'s architecture holding its current weights."""
    try:
        copy = keras.models.clone_model(model)
    except Exception as error:
        raise BeatloopError(
            f"model {name!r} cannot be copied (keras.models.clone_model: "
            f"{type(error).__name__}: {error}); use export(best=True), or "
            "beatloop.restore(run_dir, best=True).models"
        ) from error
    copy.set_weights(model.get_weights())
    return copy
