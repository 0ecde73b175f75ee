"""A run's inference models written as SavedModels (``FitResult.export``, ``Run.export``):
as they are, or with a checkpoint's weights for the while (the best epoch's, for the
MLflow logger), the run's own put back after. In the process that trained: its recipe is
there, registered or not, and nothing is rebuilt."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import tensorflow as tf

from beatloop.core.compiled.averaged import averaged_weights, evaluated_pairs
from beatloop.core.failures.errors import BeatloopError
from beatloop.core.saving.checkpoint_files import model_values
from beatloop.core.saving.run_dir import check_export_dir


def export_models(recipe, bound, out: str | Path, checkpoint: str | None = None) -> dict[str, Path]:
    """Write each of ``recipe``'s inference models (of the bound ``bound.models``) as a
    SavedModel in ``out/NAME`` with a ``serve`` endpoint; return the paths. An evaluated
    average (``EMA(evaluated=True)``) is written in its source's place. ``checkpoint``:
    the path of a checkpoint whose model weights are written instead of the models' own
    (every model's variables take its values, then get their own back, also on failure)."""
    models = recipe.inference_models(bound.models)
    if not models:
        raise BeatloopError(
            f"recipe {recipe.name!r} has no inference model to export: {_why(recipe)}"
        )
    check_export_dir(Path(out))
    paths = {name: Path(out) / name for name in models}
    for path in paths.values():
        if path.exists() and any(path.iterdir()):
            raise BeatloopError(f"{path} exists and is not empty; export to a new folder")
    averaged = evaluated_pairs(bound.updates)  # swapped in after the checkpoint's weights
    with checkpoint_weights(bound.models, checkpoint), averaged_weights(averaged):
        for name, model in models.items():
            model.export(str(paths[name]), format="tf_saved_model", verbose=False)
    return paths


def _why(recipe) -> str:
    """Why ``recipe.inference_models`` gave nothing: the base class's (the method to
    define), or the recipe's own, returning none in this configuration."""
    own = type(recipe).inference_models.__qualname__ != "Recipe.inference_models"
    if own:
        return (
            "its inference_models(models) returned none in this configuration (its result "
            "is what it saved in the run dir)"
        )
    return (
        "it defines no inference_models(models), the method returning the trained models "
        "to keep by name (e.g. return {'classifier': models['classifier']})"
    )


@contextmanager
def checkpoint_weights(models: Mapping, checkpoint: str | None) -> Iterator[None]:
    """Inside the block every model variable holds its value in ``checkpoint`` (read
    first, whole: a checkpoint that does not fit changes nothing), and its own after,
    also when the block raises. Assigns only: no collective op, so one worker of a
    multi-worker run may do it alone. ``None``: the models as they are."""
    if checkpoint is None:
        yield
        return
    stored = model_values(checkpoint, models)
    variables = [v for name in models for v in models[name].variables]
    values = [value for name in models for value in stored[name]]
    own = [tf.identity(v.value) for v in variables]  # copies: assigns don't alias them
    try:
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)
        yield
    finally:
        for variable, value in zip(variables, own, strict=True):
            variable.assign(value)
