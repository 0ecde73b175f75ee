"""What a study leaves in its dir: a table of its best trials, ``best.toml`` (a run file
of the best trial: ``beatloop run --config best.toml``) and PNG plots of its history and
of its parameters' importances."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from beatloop.tuning.spec import StudySpec


def best_trials(study, spec: StudySpec, top: int = 5) -> list:
    """The ``top`` finished trials, best objective first."""
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return sorted(done, key=lambda t: t.value, reverse=spec.objective.direction == "max")[:top]


def format_trials(study, spec: StudySpec, top: int = 5) -> str:
    """The best trials as aligned text, and a count of the study's trials by state."""
    rows = [["trial", spec.objective.text, "epochs", "config"]]
    for trial in best_trials(study, spec, top):
        config = "  ".join(f"{k}={_value_text(v)}" for k, v in trial.params.items())
        epochs = "-" if trial.last_step is None else str(trial.last_step + 1)  # none reported
        rows.append([str(trial.number), f"{trial.value:.6g}", epochs, config])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    states: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        states[trial.state.name.lower()] = states.get(trial.state.name.lower(), 0) + 1
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    return "\n".join([f"study {spec.name!r}: {counts}", *lines])


def _value_text(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_best_toml(study, spec: StudySpec, path: Path) -> Path | None:
    """A run file of the best trial (its recipe, epochs, seed and whole config), or None
    while the study has no finished trial."""
    from beatloop.tuning.trial import trial_config

    best = best_trials(study, spec, top=1)
    if not best:
        return None
    trial = best[0]
    lines = [
        f"# The best trial of study {spec.name!r}: trial {trial.number}, "
        f"{spec.objective.name} {trial.value:.6g}.",
        f"# Train it again: beatloop run --config {path.name}",
        *([f"import = {_toml(list(spec.imports))}"] if spec.imports else []),
        f"recipe = {_toml(spec.recipe)}",
        f"epochs = {spec.epochs}",
        f"seed = {spec.seed}",
        f"steps_per_execution = {_toml(spec.steps_per_execution)}",
    ]
    if spec.data is not None:
        lines.append(f"data = {_toml(spec.data)}")
        lines += [f"data_set = {_toml(list(spec.data_settings))}"] if spec.data_settings else []
        if spec.validation_data is not None:
            lines.append(f"validation_data = {_toml(spec.validation_data)}")
    lines.append("\n[config]")
    lines += [f"{k} = {_toml(v)}" for k, v in trial_config(spec, trial.params).items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _toml(value: Any) -> str:
    """A TOML literal of a config value (floats written to round-trip exactly)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            repr(value)
            if math.isfinite(value)
            else ("nan" if value != value else f"{'-' if value < 0 else ''}inf")
        )
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def write_plots(study, out: Path, echo=print) -> list[Path]:
    """``history.png`` (each trial's objective, and the best so far) and
    ``importances.png`` (parameter importances; from two finished trials on, and only
    when they tell the parameters apart: ``echo`` says why one is not written)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.trial import TrialState
    from optuna.visualization import matplotlib as plots

    written = []
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        makers = [("history.png", plots.plot_optimization_history, 1)]
        makers.append(("importances.png", plots.plot_param_importances, 2))
        for name, make, least in makers:
            if len(done) < least:
                continue
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                try:
                    axes = make(study)
                except (ValueError, RuntimeError):  # every trial at one value: no importance
                    continue
            if any("importances will be equal" in str(w.message).lower() for w in said):
                plt.close(axes.get_figure())
                echo(f"{name} not written: the finished trials' scores tie or are too few to "
                     "tell the parameters' importances apart (more trials will)")  # fmt: skip
                continue
            figure = axes.get_figure()
            figure.set_size_inches(7, 4)
            figure.tight_layout()
            figure.savefig(out / name, dpi=100)
            plt.close(figure)
            written.append(out / name)
    return written
