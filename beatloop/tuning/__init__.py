"""The tuning wing: Optuna studies over a recipe's config (``beatloop tune RECIPE``,
``beatloop.tuning``).

A study searches a space of config fields (``space.py``), each trial a run of its own
in its own process (``trial.py``) and run dir, judged by one logged figure; the study
lives in an Optuna storage, SQLite in the study's dir by default (``study.py``), and
leaves a table, ``best.toml`` and plots (``report.py``). To add a kind of search
dimension, extend ``space.KINDS`` and ``Dimension.distribution``. Optuna comes with the
``[tune]`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from beatloop.tuning.spec import StudySpec


@attrs.frozen
class TuneResult:
    """A finished study: its spec, the Optuna study, and what it wrote."""

    spec: StudySpec
    study: object
    best_toml: Path | None
    plots: tuple[Path, ...]

    @property
    def best_config(self) -> dict | None:
        """The best trial's whole config overrides, or None without a finished trial."""
        from beatloop.tuning.report import best_trials
        from beatloop.tuning.trial import trial_config

        best = best_trials(self.study, self.spec, top=1)
        return trial_config(self.spec, best[0].params) if best else None


def tune(
    recipe: str,
    space: Sequence[str] | Mapping[str, str],
    *,
    out: str | Path,
    trials: int = 20,
    epochs: int = 3,
    seed: int = 0,
    jobs: int = 1,
    objective: str | None = None,
    pruner: str = "median",
    storage: str | None = None,
    study_name: str | None = None,
    settings: Sequence[str] = (),
    steps_per_execution: int | str = "auto",
    data: str | None = None,
    data_settings: Sequence[str] = (),
    validation_data: str | None = None,
    callbacks: Sequence[str] = (),
    imports: Sequence[str] = (),
    echo: Callable[[str], None] = print,
) -> TuneResult:
    """Search ``space`` (``["learning_rate=log:1e-4:1e-1"]`` or ``{"learning_rate":
    "log:1e-4:1e-1"}``) of ``recipe``'s config for the best ``objective`` (``"val_loss:min"``;
    default: the recipe's quality figure) in ``trials`` runs of ``epochs``, ``jobs`` at
    once, each in its own process and run dir under ``out``. A study already in the
    storage continues: a trial a killed command left resumes from its checkpoint.
    ``callbacks``: registered callbacks each trial runs, by name; with ``"mlflow"`` the
    study is an MLflow run and each trial's run is nested in it ([Tracking](tracking.md)).
    ``imports``: modules (names or ``.py`` paths) imported here and in every trial's
    process before the recipe is looked up, for a recipe (or callback) of your own:
    a trial's process sees only what installed plugins and these modules register."""
    from beatloop.core.failures.errors import ConfigError, RunDirError
    from beatloop.core.schedule.config import parse_settings
    from beatloop.plugins.registry import get_recipe, registry
    from beatloop.tuning.report import write_best_toml, write_plots
    from beatloop.tuning.space import parse_space
    from beatloop.tuning.spec import PRUNERS, parse_objective
    from beatloop.tuning.storage import storage_errors
    from beatloop.tuning.study import refuse_if_none_finished, run_study
    from beatloop.user_modules import as_given_to_children, import_modules

    try:
        import optuna  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            "beatloop tune needs Optuna, which comes with the tune extra: "
            "pip install 'beatloop[tune]'"
        ) from error
    if pruner not in PRUNERS:
        raise ConfigError(f"--pruner expects one of {', '.join(PRUNERS)}, got {pruner!r}")
    texts = [f"{k}={v}" for k, v in space.items()] if isinstance(space, Mapping) else list(space)
    imports = as_given_to_children(imports)
    import_modules(imports)
    cls = get_recipe(recipe)
    for name in callbacks:  # a misspelt name, before any trial
        registry().callback(name)
    owner = f"recipe {recipe!r}"
    fixed = parse_settings(settings, cls.Config, owner)
    parse_space(texts, cls.Config, owner, fixed)  # every name and range, before any trial
    spec = StudySpec(
        recipe=recipe,
        space=tuple(texts),
        objective=parse_objective(objective, cls.quality_figure, recipe),
        out=Path(out),
        fixed=tuple(settings),
        trials=trials,
        epochs=epochs,
        seed=seed,
        pruner=pruner,
        storage=storage,
        study_name=study_name,
        steps_per_execution=steps_per_execution,
        data=data,
        data_settings=tuple(data_settings),
        validation_data=validation_data,
        callbacks=tuple(callbacks),
        imports=imports,
    )
    if "mlflow" in spec.callbacks:  # the parent run, made (or found) before any trial
        spec = attrs.evolve(spec, mlflow_parent=_study_run(spec))
    unfinished: dict[int, tuple[int, str]] = {}
    study = run_study(spec, jobs=jobs, echo=echo, unfinished=unfinished)
    if spec.mlflow_parent is not None:
        from beatloop.callbacks.mlflow_store import end_study_run

        end_study_run(spec.mlflow_parent, spec.out)
    with storage_errors(spec):
        refuse_if_none_finished(study, spec, unfinished)
        if not os.access(spec.out, os.W_OK | os.X_OK):  # a finished study, shown as it is
            echo(f"the study dir {spec.out} is read-only: best.toml and the plots are not written")
            return TuneResult(spec, study, None, ())
        try:
            best = write_best_toml(study, spec, spec.out / "best.toml")
            return TuneResult(spec, study, best, tuple(write_plots(study, spec.out, echo)))
        except OSError as error:
            raise RunDirError(
                f"the study's report in {spec.out} cannot be written: {error}"
            ) from None


def _study_run(spec: StudySpec) -> str:
    """The study's MLflow run (``--callback mlflow``), in the store its trials log to."""
    from beatloop.callbacks.mlflow_store import study_run

    params = {"recipe": spec.recipe, "objective": spec.objective.text, "trials": spec.trials,
              "epochs": spec.epochs, "seed": spec.seed, "space": " ".join(spec.space),
              "fixed": " ".join(spec.fixed)}  # fmt: skip
    return study_run(spec.recipe, spec.name, f"{spec.storage_url}#{spec.name}", params, spec.out)
