"""Running a study: open it in its storage (made, or checked against the command that
made it), resume the trials a killed command left, and keep ``jobs`` trial processes
going until the study holds ``trials`` trials. Several commands, on one machine or
several sharing a storage URL, may run one study together: each asks the study for the
next trial, and a trial's process tells the study how it ended."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Mapping

from beatloop.core.failures.errors import BeatloopError, ConfigError, RunDirError, RunInterrupted
from beatloop.tuning.processes import TrialProcesses, orphaned, report_end
from beatloop.tuning.spec import StudySpec
from beatloop.tuning.storage import (
    made_or_removed,
    open_storage,
    storage_errors,
    storage_lock,
    writable_study_dir,
)


def _pruner(spec: StudySpec):
    import optuna

    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=spec.epochs)
    return optuna.pruners.NopPruner()


def load_study(spec: StudySpec, create: bool = False, writable: bool = True):
    """The study ``spec`` names, made first where ``create`` allows (and the study dir is
    ``writable``); a study made with another recipe, space, objective or budget is
    refused (its trials would not compare)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(spec, writable)
    options = {"study_name": spec.name, "storage": storage, "pruner": _pruner(spec),
               "sampler": trial_sampler(spec, 0)}  # fmt: skip
    with storage_errors(spec):
        if create and writable:
            direction = spec.objective.optuna_direction
            study = optuna.create_study(direction=direction, load_if_exists=True, **options)
        else:
            study = _existing(spec, options)
        made_with = study.user_attrs.get("spec")
    if made_with is None:
        study.set_user_attr("spec", spec.identity())
    elif made_with != spec.identity():
        changed = sorted(k for k in made_with if made_with[k] != spec.identity().get(k))
        raise ConfigError(
            f"study {spec.name!r} in {spec.storage_url} was made with other "
            + ", ".join(f"{k} ({made_with[k]!r})" for k in changed)
            + ": give the same ones, or another --out / --study-name for a new study"
        )
    return study


def _existing(spec: StudySpec, options: dict):
    """The study in the storage; its absence said in the study's words."""
    import optuna

    try:
        return optuna.load_study(**options)
    except KeyError:  # Optuna: "Record does not exist."
        raise RunDirError(
            f"the study dir {spec.out} is not writable and holds no study {spec.name!r} to "
            "show: make it writable, or pass another --out"
        ) from None


def trial_sampler(spec: StudySpec, number: int):
    """The sampler that proposes trial ``number``: TPE, its generator seeded from the
    study's seed and the trial's number. A command that continues a study (after a kill,
    or beside another on one storage) then proposes each trial as the one command would
    have, from the same finished trials, rather than replaying trial 0's draws."""
    import numpy as np
    import optuna

    seed = int(np.random.SeedSequence([spec.seed, number]).generate_state(1)[0])
    return optuna.samplers.TPESampler(seed=seed)


def run_study(
    spec: StudySpec,
    jobs: int = 1,
    echo: Callable[[str], None] = print,
    unfinished: dict[int, tuple[int, str]] | None = None,
):
    """Run ``spec``'s study to ``spec.trials`` trials, ``jobs`` at once; the study.
    ``unfinished`` is filled with the trials whose process ended with the trial left
    unfinished: ``{number: (exit status, how it ended)}``."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    with made_or_removed(spec):
        writable = writable_study_dir(spec)
        study = load_study(spec, create=True, writable=writable)
    with storage_errors(spec):
        trials = study.get_trials(deepcopy=False)
    if not writable:  # a finished study can still be shown
        refuse_unfinished(spec, trials)
        return study
    refuse_stale_trial_dirs(spec, trials)
    waiting = orphaned(study, spec)
    if waiting:
        echo(f"resuming trial(s) {', '.join(map(str, waiting))} of a study that was stopped")
    processes = TrialProcesses(spec, echo)
    try:
        with ctrl_c_as_request() as interrupted, storage_errors(spec):
            _keep_trials_going(
                study, spec, jobs, processes, waiting, interrupted, echo,
                {} if unfinished is None else unfinished,
            )  # fmt: skip
        return study
    except KeyboardInterrupt:
        stopped = sorted(processes.running)
        processes.stop_all()
        raise RunInterrupted(_stopped_words(spec, stopped), None) from None
    finally:
        processes.stop_all()


class StudyFailed(BeatloopError):
    """A study whose every trial failed: nothing to show, and the trials' own failure
    (its exit status: a full disk is 5, numerics 4) is the command's."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def refuse_if_none_finished(
    study, spec: StudySpec, unfinished: Mapping[int, tuple[int, str]] | None = None
) -> None:
    """A study that ended with failed trials, or trials this command left unfinished
    (``unfinished``: ``run_study``'s), and no finished one fails, naming the first
    failure, else the first unfinished trial's ending (an empty table and exit 0 would
    hide it)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.COMPLETE for t in trials):
        return
    failed = [t for t in trials if t.state == TrialState.FAIL]
    running = {t.number for t in trials if t.state == TrialState.RUNNING}
    left = sorted(number for number in unfinished or {} if number in running)
    pruned = any(t.state == TrialState.PRUNED for t in trials)
    if not failed and left and not pruned:
        status, ending = unfinished[left[0]]
        raise StudyFailed(
            f"study {spec.name!r} has no finished trial: {len(left)} of its {len(trials)} "
            f"trial(s) stopped unfinished (trial {left[0]}: its process {ending}); each "
            f"trial's log is in {spec.out / 'logs'}: put its cause right, then the same "
            "command resumes them",
            _command_code(status),
        )
    if not failed:
        return
    first = failed[0]
    reason = first.user_attrs.get("error", f"see {spec.out / 'logs'}")
    code = study.user_attrs.get(f"exit_code_{first.number}", 2)
    raise StudyFailed(
        f"study {spec.name!r} has no finished trial: {len(failed)} of {len(trials)} failed "
        f"(trial {first.number}: {reason})",
        code if isinstance(code, int) and code > 1 else 2,
    )


def _command_code(status: int) -> int:
    """The command's exit code for a trial's process that ended with ``status``: its
    own (5 for a full disk), a signal's as a shell gives it (128 + N), else 2."""
    if status < 0:
        return 128 - status
    return status if status > 1 else 2


def _stopped_words(spec: StudySpec, stopped: list[int]) -> str:
    """What a Ctrl-C left: the trials checkpointed, and how to go on."""
    if not stopped:
        return f"study {spec.name!r} stopped by Ctrl-C; the same command goes on with it"
    trials = ", ".join(map(str, stopped))
    return (
        f"study {spec.name!r} stopped by Ctrl-C: trial(s) {trials} saved a checkpoint and "
        "stay running in the study; the same command resumes them"
    )


def refuse_unfinished(spec: StudySpec, trials: list) -> None:
    """A study in a read-only dir, when it has nothing left to run."""
    from optuna.trial import TrialState

    left = spec.trials - sum(t.state.is_finished() for t in trials)
    if left > 0 or any(t.state == TrialState.RUNNING for t in trials):
        raise RunDirError(
            f"the study dir {spec.out} is not writable, and study {spec.name!r} has "
            f"{max(left, 1)} of its {spec.trials} trials to run: make it writable, or pass "
            "another --out"
        )


def refuse_stale_trial_dirs(spec: StudySpec, trials: list) -> None:
    """Trial dirs the study does not hold (its ``study.db`` deleted or emptied, the
    trials' dirs left): new trials would be handed them and refused by their
    checkpoints, for ever. Refused before any trial, naming them and what to do."""
    held = {t.number for t in trials}
    stale = sorted(
        path for path in spec.out.glob("trial-[0-9][0-9][0-9][0-9]")
        if path.is_dir() and int(path.name.removeprefix("trial-")) not in held
    )  # fmt: skip
    if not stale:
        return
    names = ", ".join(p.name for p in stale[:3]) + (" ..." if len(stale) > 3 else "")
    raise RunDirError(
        f"the study dir {spec.out} holds {len(stale)} trial dir(s) ({names}) that study "
        f"{spec.name!r} in {spec.storage_url} has no trial for: its storage was deleted, "
        "emptied or replaced since they ran. Restore it from a copy to go on with the "
        f"study, or move the trial dirs away (mkdir {spec.out}/old && mv {spec.out}/trial-* "
        f"{spec.out}/old) to start it anew"
    )


def _keep_trials_going(
    study, spec, jobs, processes, waiting, interrupted, echo, unfinished: dict
) -> None:
    """Start trials (the waiting ones first) while fewer than ``jobs`` run and the study
    wants more; return when none runs, raise KeyboardInterrupt at a Ctrl-C."""
    distributions = _distributions(spec)
    while not interrupted:
        for number, status in processes.finished():
            ending = report_end(study, spec, number, status, processes.log(number), echo)
            if ending is not None:
                unfinished[number] = (status, ending)
        if len(processes.running) < jobs:
            if waiting:
                processes.start(study, waiting.pop(0))
                continue
            trial = ask_within_budget(study, spec, distributions)
            if trial is not None:
                echo(f"trial {trial.number}: {_point(trial.params)}")
                processes.start(study, trial.number)
                continue
        if not processes.running:
            return
        time.sleep(0.1)
    raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_as_request():
    """Ctrl-C (SIGINT) noted in the list yielded, for the loop to act on at its next
    turn: a KeyboardInterrupt raised wherever the signal lands is lost when that is a
    finalizer (SQLAlchemy's and Optuna's objects have them), and the study ran on."""
    requested: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield requested  # signals reach the main thread only
        return
    previous = signal.signal(signal.SIGINT, lambda signum, _: requested.append(signum))
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)


def ask_within_budget(study, spec: StudySpec, distributions: dict):
    """A new trial of ``study``, or None once it holds ``spec.trials``. Commands sharing
    an SQLite file count and ask in turn; on a server database two machines may ask at
    once, and the one whose trial is over the budget marks it failed, untrained."""
    from optuna.trial import TrialState

    with storage_lock(spec):
        held = len(study.get_trials(deepcopy=False))
        if held >= spec.trials:
            return None
        study.sampler = trial_sampler(spec, held)  # the number the new trial gets
        trial = study.ask(distributions)
    if trial.number < spec.trials:
        return trial
    trial.set_user_attr("error", f"over the study's {spec.trials} trials: not trained")
    study.tell(trial, state=TrialState.FAIL)
    return None


def _distributions(spec: StudySpec) -> dict:
    from beatloop.plugins.registry import get_recipe
    from beatloop.tuning.space import parse_space

    cls = get_recipe(spec.recipe)
    return parse_space(spec.space, cls.Config, f"recipe {spec.recipe!r}").distributions()


def _point(params: dict) -> str:
    return "  ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )
