"""``beatloop.fit``: pick a recipe by name, configure it, and run it on the engine."""

from __future__ import annotations

import json
import platform
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import keras
import tensorflow as tf

from beatloop.core.batches import as_data_split
from beatloop.core.callbacks import Callback
from beatloop.core.config import make_config
from beatloop.core.engine import Engine, EngineOptions
from beatloop.core.errors import ConfigError
from beatloop.core.recipe import Recipe
from beatloop.core.result import FitResult
from beatloop.plugins.callbacks import History, JsonLinesLogger, ProgressBar
from beatloop.plugins.registry import check_recipe_class, get_recipe, registry


def make_recipe(
    recipe: str | type[Recipe] | Recipe, config: Mapping[str, Any] | None = None
) -> Recipe:
    """A configured recipe from a registered name, a Recipe class, or an instance."""
    if isinstance(recipe, Recipe):
        if config:
            raise ConfigError("pass config overrides with a recipe name or class, not an instance")
        return recipe
    cls = get_recipe(recipe) if isinstance(recipe, str) else recipe
    check_recipe_class(cls, "fit()")
    return cls(make_config(cls.Config, config, f"recipe {cls.name!r}"))


def fit(
    recipe: str | type[Recipe] | Recipe,
    *,
    epochs: int = 1,
    data=None,
    config: Mapping[str, Any] | None = None,
    models: Mapping[str, keras.Layer] | None = None,
    optimizers: Mapping[str, keras.optimizers.Optimizer] | None = None,
    callbacks: Sequence[Callback] = (),
    seed: int | None = None,
    steps_per_execution: int = 1,
    steps_per_epoch: int | None = None,
    debug: bool = False,
    run_dir: str | Path | None = None,
    progress: bool | None = None,
) -> FitResult:
    """Train ``recipe`` for ``epochs`` and return its history and trained models.

    ``data`` is a ``tf.data.Dataset``, a ``(train, validation)`` pair or a DataSplit of
    batched ``(x, y)`` tuples or dicts; ``None`` takes the recipe's built-in data.
    ``seed`` seeds Python, NumPy and TensorFlow (a random seed is drawn and recorded
    when omitted). ``steps_per_execution`` runs that many steps per compiled call;
    ``steps_per_epoch`` ends epochs after that many steps (needed for endless data);
    ``debug`` runs eagerly and stops at the first non-finite loss or gradient.
    ``progress``: show a progress bar (``None``: only on a terminal).
    """
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ConfigError(f"epochs must be an integer >= 1, got {epochs!r}")
    if seed is None:
        seed = secrets.randbelow(2**31)
    elif not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    try:
        options = EngineOptions(
            steps_per_execution=steps_per_execution, debug=debug, steps_per_epoch=steps_per_epoch
        )
    except (TypeError, ValueError) as error:
        raise ConfigError(f"invalid engine option: {error}") from None
    label = registry().describe_origin(recipe) if isinstance(recipe, str) else None
    recipe = make_recipe(recipe, config)
    keras.utils.set_random_seed(seed)
    split = as_data_split(recipe.default_data(seed) if data is None else data)
    run_path = None if run_dir is None else Path(run_dir)

    history = History()
    run_callbacks: list[Callback] = [history]
    given = {type(c) for c in callbacks}
    wants_progress = progress or (progress is None and sys.stdout.isatty())
    if wants_progress and not any(issubclass(t, ProgressBar) for t in given):
        run_callbacks.append(ProgressBar())
    if run_path is not None:
        run_path.mkdir(parents=True, exist_ok=True)
        if not any(issubclass(t, JsonLinesLogger) for t in given):
            run_callbacks.append(JsonLinesLogger(run_path / "history.jsonl"))
    run_callbacks.extend(recipe.callbacks())
    run_callbacks.extend(callbacks)

    engine = Engine(
        recipe,
        split,
        models=models,
        optimizers=optimizers,
        callbacks=run_callbacks,
        options=options,
        run_dir=run_path,
        seed=seed,
        label=label,
    )
    if run_path is not None:
        write_run_record(run_path / "run.json", engine, seed, epochs)
    engine.fit(epochs)
    return FitResult(
        recipe=recipe,
        config=recipe.config,
        history=history.history,
        bound=engine.bound,
        seed=seed,
        steps=int(engine.state.step),
        epochs=int(engine.state.epoch),
        run_dir=run_path,
        artifacts=dict(engine.run.artifacts),
    )


def write_run_record(path: Path, engine: Engine, seed: int, epochs: int) -> None:
    """What ran: recipe, config, schedule, seed and versions, for the run's log."""
    record = {
        "recipe": engine.recipe.name,
        "config": attrs.asdict(engine.recipe.config),
        "schedule": engine.bound.schedule.describe().splitlines(),
        "variables": {b.beat.name: [v.path for v in b.variables] for b in engine.bound.beats},
        "seed": seed,
        "epochs": epochs,
        "steps_per_execution": engine.options.steps_per_execution,
        "versions": {
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
        },
    }
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    temporary.replace(path)
