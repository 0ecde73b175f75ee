"""What a study is: its recipe, search space, fixed settings, objective, budget and
storage, as one frozen value (written into the study, so a second command on the same
study is checked against the first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from beatloop.core.failures.errors import ConfigError

#: ``--pruner`` values: Optuna's median and Hyperband pruners, or none.
PRUNERS = ("median", "hyperband", "none")


def _positive(instance, attribute, value) -> None:
    if value < 1:
        raise ConfigError(f"--{attribute.name} must be >= 1, got {value}")


@attrs.frozen
class Objective:
    """The logged figure a study optimises (``val_loss``) and its direction."""

    name: str
    direction: str = attrs.field(validator=attrs.validators.in_(("min", "max")))

    @property
    def text(self) -> str:
        return f"{self.name}:{self.direction}"

    @property
    def optuna_direction(self) -> str:
        return "minimize" if self.direction == "min" else "maximize"


def parse_objective(
    text: str | None, quality_figure: tuple[str, str] | None, recipe: str
) -> Objective:
    """``val_loss:min`` (or ``None``: the recipe's ``quality_figure``) as an Objective."""
    if text is None:
        if quality_figure is None:
            raise ConfigError(
                f"recipe {recipe!r} declares no quality figure: name one with --objective "
                f"FIGURE:min|max, e.g. --objective val_loss:min"
            )
        return Objective(*quality_figure)
    name, sep, direction = text.rpartition(":")
    if not sep or not name or direction not in ("min", "max"):
        raise ConfigError(f"--objective expects FIGURE:min or FIGURE:max, got {text!r}")
    return Objective(name, direction)


@attrs.frozen
class StudySpec:
    """One study: every trial trains ``recipe`` with ``fixed`` settings (``--set`` texts)
    and one point of ``space`` (``--space`` texts) for ``epochs`` with ``seed``, and is
    judged by ``objective`` at its last epoch; ``trials`` in all, run dirs under ``out``."""

    recipe: str
    space: tuple[str, ...]
    objective: Objective
    out: Path = attrs.field(converter=Path)
    fixed: tuple[str, ...] = ()
    trials: int = attrs.field(default=20, validator=_positive)
    epochs: int = attrs.field(default=3, validator=_positive)
    seed: int = 0
    pruner: str = attrs.field(default="median", validator=attrs.validators.in_(PRUNERS))
    storage: str | None = None
    study_name: str | None = None
    steps_per_execution: int | str = "auto"
    data: str | None = None
    data_settings: tuple[str, ...] = ()
    validation_data: str | None = None
    #: Registered callbacks each trial runs (``--callback``; not part of the identity).
    callbacks: tuple[str, ...] = ()
    #: The study's MLflow run, its trials' runs nested in it (with ``--callback mlflow``).
    mlflow_parent: str | None = None
    #: Modules each trial imports before it looks the recipe up (``--import``; not part
    #: of the identity: where the code is found, not what is studied).
    imports: tuple[str, ...] = ()

    @property
    def storage_url(self) -> str:
        """``--storage``, or an SQLite file in the study's dir (embedded: no server)."""
        return self.storage or f"sqlite:///{(self.out / 'study.db').resolve()}"

    @property
    def name(self) -> str:
        return self.study_name or self.recipe

    def identity(self) -> dict[str, Any]:
        """What every command on this study must agree on (kept in the study)."""
        return {
            "recipe": self.recipe,
            "space": list(self.space),
            "fixed": list(self.fixed),
            "objective": self.objective.text,
            "epochs": self.epochs,
            "seed": self.seed,
            "data": self.data,
            "data_settings": list(self.data_settings),
            "validation_data": self.validation_data,
        }

    def trial_dir(self, number: int) -> Path:
        return self.out / f"trial-{number:04d}"


def spec_to_json(spec: StudySpec) -> dict[str, Any]:
    """The spec as JSON-able values (what a trial's process is given)."""
    values = attrs.asdict(spec, recurse=False)
    values.update(out=str(spec.out), objective=spec.objective.text)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def spec_from_json(values: dict[str, Any]) -> StudySpec:
    values = dict(values)
    name, _, direction = values.pop("objective").rpartition(":")
    tupled = {k: tuple(v) for k, v in values.items() if isinstance(v, list)}
    return StudySpec(**{**values, **tupled}, objective=Objective(name, direction))
