"""A run rebuilt from its run dir: ``beatloop.restore`` (the run at its latest or best
checkpoint, ready to export, evaluate or inspect) and ``beatloop.evaluate`` (its
validation figures on a data set).

The recipe is rebuilt by name with its recorded config and seed; the models and
optimizers the run was passed come from the run dir (``core/saving/passed.py``: kept
there when the run started), unless given again; its data is the data given, the data
source its ``run.json`` records, the recipe's built-in data, or (to restore and export
only) a placeholder batch of the recorded batch spec.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import keras

from beatloop.callbacks.standard import History
from beatloop.core.data.batches import (
    DataSplit,
    as_data_split,
    as_evaluation_data,
    check_evaluation_data,
)
from beatloop.core.data.data_origin import LOOP_DATA_ADVICE, is_loop_data
from beatloop.core.data.paths import placeholder_batches, spec_record
from beatloop.core.failures.errors import CheckpointError, ConfigError, DataError
from beatloop.core.running.engine import Engine
from beatloop.core.running.recipe import Recipe, defines
from beatloop.core.running.result import FitResult
from beatloop.core.saving import op_determinism as determinism
from beatloop.core.saving.checkpoint_files import (
    UnreadableCheckpoint,
    checkpoint_files,
    first_line,
)
from beatloop.core.saving.checkpoints import latest_record
from beatloop.core.saving.passed import passed_parts, refuse_not_kept
from beatloop.core.saving.record import read_run_json
from beatloop.core.saving.run_dir import existing_run_dir
from beatloop.fitting import engine_options, make_recipe, result_of
from beatloop.named_data.recorded import (
    recorded_source,
    recorded_validation,
    spec_differences,
    warn_if_changed,
)
from beatloop.plugins.registry import get_recipe, registry
from beatloop.user_modules import recorded_module, registered_recipe


def restore(
    run_dir: str | Path,
    data=None,
    *,
    best: bool = False,
    models: Mapping[str, keras.Layer | str | Path] | None = None,
    optimizers: Mapping[str, keras.optimizers.Optimizer] | None = None,
) -> FitResult:
    """The run in ``run_dir`` as it stands at its latest checkpoint (``best=True``: at
    the best epoch's checkpoint, kept with ``keep_best``), without training:
    its models, optimizers and history, ready to ``export``, ``evaluate`` or inspect. The
    recipe is rebuilt by name (it must be registered) with its recorded config and seed;
    the models and optimizers the run was passed are rebuilt from the run dir (kept
    there when it started), or taken from ``models`` and ``optimizers`` as ``fit`` takes
    them. ``data`` (as ``fit`` takes it, a function ``data(recipe, seed)`` included: what
    ``beatloop export`` passes for a run trained with ``--data``), else the recipe's
    built-in data when the run trained on its batches, else one placeholder batch of the
    batch spec the run recorded (enough to export and inspect; evaluate on data of your
    own). A checkpoint that does not fit the rebuilt parts is refused naming what
    differs."""
    run_path = Path(run_dir)
    stored = _stored_record(run_path, "restore")
    recipe = _recorded_recipe(stored, run_path)
    if callable(data):
        data = data(recipe, stored.seed)
    split = _split_to_rebuild(run_path, recipe, stored) if data is None else as_data_split(data)
    history = History()
    parts = _parts(run_path, models, optimizers, "restore")
    engine = _restored_engine(run_path, stored, recipe, split, [history], best=best, **parts)
    result = result_of(engine, history)
    return attrs.evolve(result, checkpoint=engine.run.resumed_from) if best else result


def evaluate(
    run_dir: str | Path,
    data=None,
    *,
    steps_per_execution: int | str = "auto",
    best: bool = False,
    models: Mapping[str, keras.Layer | str | Path] | None = None,
    optimizers: Mapping[str, keras.optimizers.Optimizer] | None = None,
) -> dict[str, float]:
    """The validation figures of the run in ``run_dir`` at its latest checkpoint
    (``best=True``: at the best epoch's, kept with ``keep_best``): every
    beat's loss and every metric, models in inference mode, over ``data`` (a batched
    ``tf.data.Dataset`` of ``(x, y)`` tuples or dicts, like the validation data ``fit``
    takes; ``None``: the run's own validation data, that of the data source its
    ``run.json`` records when it was trained with ``--data`` (read again with the run's
    seed: its ``validation_fraction`` held out, or its ``--validation-data``), else the
    recipe's built-in validation data), by name without the ``val_`` prefix: on its own
    validation data, the figures are its last ``val_`` figures. The run is rebuilt as
    ``restore`` rebuilds it (``models`` and ``optimizers`` as there); with ``data``
    it is rebuilt on that data when its batches are the ones the run trained on (so a
    run on other data, or of a recipe with no built-in data, evaluates on data like its
    training data). Nothing is trained and nothing is written."""
    run_path = Path(run_dir)
    stored = _stored_record(run_path, "evaluate")
    recipe = _recorded_recipe(stored, run_path)
    options = engine_options(steps_per_execution=steps_per_execution)
    split = _evaluation_split(run_path, recipe, stored, data)
    parts = _parts(run_path, models, optimizers, "evaluate")
    engine = _restored_engine(run_path, stored, recipe, split, [], options, best=best, **parts)
    return engine.evaluate(data)


def _stored_record(run_path: Path, verb: str):
    """The run's latest readable record: a ``RunDirError`` when ``run_path`` is no
    folder, a ``CheckpointError`` when it holds no checkpoint, a ``RecipeNotFoundError``
    naming the module ``run.json`` records when its recipe is not registered."""
    stored = latest_record(existing_run_dir(run_path, verb, written_by="fit's run_dir="))
    if stored is None:
        raise CheckpointError(f"{run_path} holds no readable checkpoint to {verb}")
    registered_recipe(stored.recipe, recorded_module(run_path))
    return stored


def _recorded_recipe(stored, run_path: Path) -> Recipe:
    cls = get_recipe(stored.recipe)
    return make_recipe(cls, config_overrides(cls, stored.config))


def _parts(run_path: Path, models, optimizers, verb: str) -> dict[str, dict]:
    """The models and optimizers to rebuild the run with: those given, over those the
    run dir kept of what the run was passed (every part it could not keep must be given
    again: a ``ConfigError`` says which)."""
    kept_models, kept_optimizers, not_kept = passed_parts(
        run_path, read_run_json(run_path / "run.json")
    )
    given = {"model": dict(models or {}), "optimizer": dict(optimizers or {})}
    refuse_not_kept(run_path, not_kept, given, verb)
    kept_models = {n: _load_kept(n, p) for n, p in kept_models.items() if n not in given["model"]}
    return {
        "models": {**kept_models, **given["model"]} or None,
        "optimizers": {**kept_optimizers, **given["optimizer"]} or None,
    }


def _load_kept(name: str, path: Path) -> keras.Layer:
    """The model the run was passed, from the ``.keras`` file its run dir kept; what to
    do when Keras cannot rebuild it (a class this process does not know)."""
    if not path.is_file():
        raise ConfigError(
            f"the run was passed model {name!r}, kept in {path}, which is gone: pass "
            f"models={{{name!r}: ...}} (a model of the same architecture)"
        )
    try:
        return keras.models.load_model(path, compile=False)
    except Exception as error:
        raise ConfigError(
            f"the run was passed model {name!r}, kept in {path}, which Keras cannot rebuild "
            f"here ({type(error).__name__}: {str(error).splitlines()[0][:300]}): import the "
            "module defining its classes first (on the command line: --import MODULE), or "
            f"pass models={{{name!r}: ...}}"
        ) from error


def _restored_engine(
    run_path: Path, stored, recipe: Recipe, split, callbacks, options=None, best=False, **parts
) -> Engine:
    """An engine of the recorded run on ``split``, its latest checkpoint restored (its
    best epoch's with ``best``); ``parts``: its models and optimizers, as ``fit`` takes
    them."""
    checkpoint = _best_checkpoint(run_path) if best else None
    determinism.set_for_run(stored.op_determinism)  # traced as the run was
    keras.utils.set_random_seed(stored.seed)
    engine = Engine(
        recipe,
        split,
        callbacks=callbacks,
        options=options,
        run_dir=run_path,
        seed=stored.seed,
        label=registry().describe_origin(stored.recipe),
        trains=False,  # its training loop traced only if it is ever called
        **parts,
    )
    try:
        engine.resume(checkpoint)
    except UnreadableCheckpoint as error:  # only a best is asked for by name
        why = f"cannot be read ({first_line(error.__cause__ or error)})"
        raise CheckpointError(_best_lost(run_path, why)) from error
    return engine


def _best_checkpoint(run_path: Path) -> str:
    """The name of the best epoch's checkpoint ``run.json`` records (``keep_best``),
    refused when its files are gone."""
    best = read_run_json(run_path / "run.json").get("best")
    if not isinstance(best, dict) or not best.get("checkpoint"):
        raise CheckpointError(
            f"the run in {run_path} keeps no best epoch (its run.json names none): it was "
            "trained without keep_best (--keep-best), or has not finished an epoch with it; "
            "leave out best (--best) for its latest checkpoint"
        )
    name, folder = best["checkpoint"], run_path / "checkpoints"
    if not (folder / f"{name}.index").is_file() or not any(folder.glob(f"{name}.data-*")):
        raise CheckpointError(_best_lost(run_path, "is gone (its files were deleted or moved)"))
    return name


def _best_lost(run_path: Path, why: str) -> str:
    """Why the best epoch's checkpoint cannot be restored, and what still can."""
    best = read_run_json(run_path / "run.json")["best"]
    name, folder = best["checkpoint"], run_path / "checkpoints"
    others = [Path(p).name for p in checkpoint_files(folder) if Path(p).name != name]
    value = best.get("value")
    epoch = f"epoch {best.get('epoch')}, {best.get('figure')} " + (
        f"{value:.4g}" if isinstance(value, float) else str(value)
    )
    then = (
        f"leave out best (--best) to use the run's latest checkpoint, {others[-1]}"
        if others
        else "the run dir holds no other checkpoint either"
    )
    return (
        f"the best epoch's checkpoint {name} that {run_path / 'run.json'} names ({epoch}) "
        f"{why}; nothing was changed: {then}"
    )


def _evaluation_split(run_path: Path, recipe: Recipe, stored, data) -> DataSplit:
    """The data a run is rebuilt on to evaluate: without ``data``, the data source its
    ``run.json`` records (``--data``: its validation data is evaluated on), else the
    recipe's built-in data; with it, ``data`` itself as the training batches when they
    are those the run recorded (or the recipe has no built-in data), else the batches
    the run trained on as ``restore`` rebuilds them."""
    built_in = defines(recipe, "default_data")
    source = recorded_source(run_path) if data is None else None
    if source is not None:  # trained on --data: evaluated on its validation data
        split = recorded_validation(run_path, source, recipe, stored)
        warn_if_changed(run_path, source, recipe)
        return split
    if data is None:
        if not built_in:
            raise DataError(
                f"recipe {recipe.name!r} has no built-in data to evaluate on: pass data= "
                "(a batched tf.data.Dataset like the run's training data)"
            )
        split = _built_in_split(run_path, recipe, stored)
        if split.validation is None:
            advice = LOOP_DATA_ADVICE if is_loop_data(split.train) else "pass data="
            raise DataError(
                f"the built-in data of recipe {recipe.name!r} has no validation split: {advice}"
            )
        return split
    evaluation = as_evaluation_data(data)
    # Checked as evaluation data before it may stand in for the training batches.
    label = registry().describe_origin(stored.recipe)
    check_evaluation_data(
        evaluation, {}, recipe.batch_keys, recipe.check_batch_spec, label, recipe.nested_keys
    )
    if spec_record(evaluation.element_spec) == stored.data or not built_in:
        return DataSplit(evaluation)
    return DataSplit(_split_to_rebuild(run_path, recipe, stored).train)


def _built_in_split(run_path: Path, recipe: Recipe, stored) -> DataSplit:
    """The recipe's built-in data, refused when its batches are not those the run
    recorded (it trained on other data: rebuilt on these, its checkpoint would not fit)."""
    split = as_data_split(recipe.default_data(stored.seed))
    built = spec_record(split.train.element_spec)
    if built != stored.data:
        raise DataError(
            f"the run in {run_path} trained on other batches than the built-in "
            f"data of recipe {recipe.name!r} ({spec_differences(stored.data, built)}): "
            "pass data= with batches like its training batches"
        )
    return split


def _split_to_rebuild(run_path: Path, recipe: Recipe, stored) -> DataSplit:
    """What a run is rebuilt on when no data is given: the recipe's built-in data when
    the run trained on its batches, else a placeholder batch of the recorded batch spec
    (a recipe that reads its training data to build its models, ``read_training_data``,
    cannot be rebuilt on one: a ``DataError``)."""
    if defines(recipe, "default_data"):
        split = as_data_split(recipe.default_data(stored.seed))
        if spec_record(split.train.element_spec) == stored.data:
            return split
    placeholder = placeholder_batches(stored.data)
    if placeholder is None or defines(recipe, "read_training_data"):
        why = (
            "reads its training data to build its models"
            if placeholder is not None
            else "records a batch spec that cannot be read back"
        )
        raise DataError(
            f"the run in {run_path} trained on data of its own, and recipe {recipe.name!r} "
            f"{why}: pass data= with batches like its training batches"
        )
    return DataSplit(placeholder)


def config_overrides(cls: type[Recipe], recorded: Mapping[str, Any]) -> dict[str, Any]:
    """Config overrides that rebuild a recorded (JSON) config: the fields whose recorded
    value differs from the default, with JSON lists turned back into tuples."""
    defaults = json.loads(json.dumps(attrs.asdict(cls.Config()), default=str))
    tupled = lambda value: (  # noqa: E731
        tuple(tupled(v) for v in value) if isinstance(value, list) else value
    )
    return {key: tupled(value) for key, value in recorded.items() if defaults.get(key) != value}
