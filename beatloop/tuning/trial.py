"""One trial in its own process (``python -m beatloop.tuning.trial SPEC NUMBER``): train
the recipe at the trial's point in its run dir (resuming it where a killed study left
it), report each epoch's objective to the study (which may prune it) and tell the study
how it ended. The trial's process tells the study itself, so a trial finishes in the
study even where the command that started it is on another machine."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from beatloop.core.events.callbacks import Callback
from beatloop.core.failures.errors import (
    BeatloopError,
    ConfigError,
    NumericsError,
    RunDirError,
    RunInterrupted,
)
from beatloop.tuning.spec import Objective, StudySpec, spec_from_json


class ObjectiveNotLogged(ConfigError):
    """The study's objective is no figure the run logs: every trial would fail alike."""


class TrialReporter(Callback):
    """Reports the objective at every epoch's end and stops a trial Optuna prunes (after
    that epoch, its checkpoint written)."""

    def __init__(self, trial, objective: Objective, epochs: int):
        self.trial = trial
        self.objective = objective
        self.epochs = epochs
        self.pruned = False

    def on_epoch_end(self, run, epoch: int, logs: dict[str, float]) -> None:
        if self.objective.name in run.missing_figures:  # an epoch that trained nothing
            return
        if self.objective.name not in logs:
            raise ObjectiveNotLogged(
                f"--objective {self.objective.text}: the run logs no {self.objective.name!r}; "
                f"it logs {', '.join(sorted(logs))}"
            )
        self.trial.report(float(logs[self.objective.name]), epoch)
        if epoch + 1 < self.epochs and self.trial.should_prune():  # the last epoch: done
            self.pruned = True
            run.stop_training = True


def trial_config(spec: StudySpec, params: dict[str, Any]) -> dict[str, Any]:
    """The config overrides of the trial at ``params``: the fixed ones and its point."""
    from beatloop.core.schedule.config import parse_settings
    from beatloop.plugins.registry import get_recipe
    from beatloop.tuning.space import parse_space

    cls = get_recipe(spec.recipe)
    owner = f"recipe {spec.recipe!r}"
    fixed = parse_settings(spec.fixed, cls.Config, owner)
    space = parse_space(spec.space, cls.Config, owner, fixed)
    return {**fixed, **space.overrides(params, cls.Config, owner)}


def trial_callbacks(spec: StudySpec, number: int) -> list[Callback]:
    """The callbacks ``tune --callback`` names, made as ``run --callback`` makes them; the
    MLflow logger's run named for the trial and nested in the study's."""
    from beatloop.plugins.registry import registry

    made = []
    for name in spec.callbacks:
        cls = registry().callback(name).cls
        if name == "mlflow":
            nested = {"parent_run_id": spec.mlflow_parent, "params": {"trial": number}}
            made.append(cls(run_name=f"trial-{number:04d}", **nested))
        else:
            made.append(cls())
    return made


def run_trial(spec: StudySpec, number: int) -> int:
    """Train trial ``number`` of the study and tell the study its end; the exit status."""
    import optuna

    from beatloop.fitting import fit
    from beatloop.tuning.processes import live_trial
    from beatloop.tuning.study import load_study
    from beatloop.user_modules import import_modules

    study = load_study(spec)
    trial = live_trial(study, number)
    reporter = TrialReporter(trial, spec.objective, spec.epochs)
    try:
        import_modules(spec.imports)  # before anything looks the recipe up
        result = fit(
            spec.recipe,
            config=trial_config(spec, trial.params),
            epochs=spec.epochs,
            seed=spec.seed,
            steps_per_execution=spec.steps_per_execution,
            run_dir=spec.trial_dir(number),
            callbacks=[reporter, *trial_callbacks(spec, number)],
            progress=True,  # a line per epoch in the trial's log (not a terminal)
            data=_data(spec),
        )
        objective = None if reporter.pruned else _objective(result, spec, number)
    except RunDirError as error:  # another process runs this trial: leave it to that one
        print(f"trial {number}: {error}", file=sys.stderr)
        return error.exit_code
    except RunInterrupted as stopped:  # checkpointed: still running in the study, resumable
        print(f"trial {number}: stopped ({stopped}); the same command resumes it", file=sys.stderr)
        return stopped.exit_code
    except BeatloopError as error:
        trial.set_user_attr("error", str(error))
        if _within(error, ObjectiveNotLogged):
            trial.set_user_attr("abort", True)
        study.tell(number, state=optuna.trial.TrialState.FAIL)
        print(f"trial {number}: {error}", file=sys.stderr)
        return error.exit_code
    except Exception as error:  # a bug: the trial fails, its traceback goes to its log
        trial.set_user_attr("error", f"{type(error).__name__}: {error}")
        study.tell(number, state=optuna.trial.TrialState.FAIL)
        raise
    if reporter.pruned:
        study.tell(number, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(number, objective)
    return 0


def _objective(result, spec: StudySpec, number: int) -> float:
    """The trial's objective: its last epoch's that has one (an epoch that trained no
    step has none); a trial none of whose epochs has one fails saying why."""
    values = result.history.get(spec.objective.name)
    if not values:
        raise NumericsError(
            f"trial {number} logged no {spec.objective.name!r} (--objective): none of its "
            f"{result.epochs} epoch(s) trained a step (rollbacks after non-finite steps "
            "skipped all their batches; its log says which)"
        )
    return float(values[-1])


def _within(error: BaseException | None, kind: type) -> bool:
    """Whether ``error`` or one of its causes is a ``kind``."""
    while error is not None:
        if isinstance(error, kind):
            return True
        error = error.__cause__ or error.__context__
    return False


def _data(spec: StudySpec):
    """``data=`` for ``fit``: the study's ``--data`` source, or the recipe's own data."""
    if spec.data is None:
        return None
    from beatloop.named_data.load import load_data

    def data(recipe, seed):
        return load_data(
            spec.data,
            spec.data_settings,
            recipe=recipe,
            seed=seed,
            validation=spec.validation_data,
        )

    return data


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the command that started it dies, so a killed
    study leaves no trial training unseen (it resumes from its checkpoint instead)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


if __name__ == "__main__":
    _die_with_parent()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(run_trial(spec_from_json(json.loads(sys.argv[1])), int(sys.argv[2])))
