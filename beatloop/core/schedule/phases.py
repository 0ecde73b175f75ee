"""Phases: a run whose schedule changes at epoch boundaries, as printable data.

A ``Phase`` is a span of epochs with its own ``Schedule`` (pretrain, then a linear probe
on the frozen encoder; warm-up, then main training); ``Phases`` is their order. Which
phase an epoch runs is a function of the epoch number alone, so a run resumed inside any
phase runs the same phase it was interrupted in. Binding them is
``beatloop.core.compiled.phased``'s job; like schedules, they hold no TensorFlow object.
"""

from __future__ import annotations

import re

import attrs

from beatloop.core.failures.errors import ConfigError, ScheduleError
from beatloop.core.failures.fields import one_line_frozen
from beatloop.core.schedule.beats import Schedule

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _name(instance, attribute, value) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ScheduleError(
            [f"a phase's name must be a Python-style name (letters, digits, underscores), "
             f"got {value!r}"],
            "Phase",
        )  # fmt: skip


def _schedule(instance, attribute, value) -> None:
    if not isinstance(value, Schedule):
        raise ScheduleError(
            [f"phase {instance.name!r} needs a beatloop.Schedule, got {type(value).__name__}"],
            "Phase",
        )


def _epochs(instance, attribute, value) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            f"phase {instance.name!r}: epochs must be an integer >= 1, or None (the rest of "
            f"the run) for the last phase, got {value!r}"
        )


@one_line_frozen
class Phase:
    """``epochs`` epochs of training with ``schedule``; ``epochs=None`` (the last phase
    only) runs it for the rest of the run."""

    name: str = attrs.field(validator=_name)
    schedule: Schedule = attrs.field(validator=_schedule)
    epochs: int | None = attrs.field(default=None, validator=_epochs, kw_only=True)


def _phases(instance, attribute, value) -> None:
    problems = [
        f"Phases holds Phase values, got {type(p).__name__}"
        for p in value
        if not isinstance(p, Phase)
    ]
    if not value:
        problems.append("Phases needs at least one Phase")
    if problems:
        raise ScheduleError(problems, "Phases")
    names = [phase.name for phase in value]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        problems.append(f"phase names must be unique; repeated: {', '.join(repeated)}")
    problems += [
        f"phase {phase.name!r} has epochs=None, which only the last phase may have (it runs "
        "for the rest of the run): give it a number of epochs"
        for phase in value[:-1]
        if phase.epochs is None
    ]
    if problems:
        raise ScheduleError(problems, "Phases")


@one_line_frozen(init=False)
class Phases:
    """The phases of a run, in order: ``Phases(Phase(...), Phase(...))``. What a
    recipe's ``schedule()`` returns when its schedule changes at epoch boundaries."""

    phases: tuple[Phase, ...] = attrs.field(validator=_phases)

    def __init__(self, *phases: Phase):
        self.__attrs_init__(tuple(phases))

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        return tuple(phase.schedule for phase in self.phases)

    @property
    def epochs(self) -> int | None:
        """The epochs the phases cover; ``None`` when the last runs for the rest of the run."""
        if self.phases[-1].epochs is None:
            return None
        return sum(phase.epochs for phase in self.phases)

    def starts(self) -> tuple[int, ...]:
        """The epoch (counted from 0) each phase starts at."""
        starts, first = [], 0
        for phase in self.phases:
            starts.append(first)
            first += phase.epochs or 0
        return tuple(starts)

    def index_at(self, epoch: int) -> int:
        """The phase epoch ``epoch`` (counted from 0) runs in; an epoch past the last
        phase's end counts as the last phase's (where a finished run evaluates)."""
        starts = self.starts()
        return max(i for i, start in enumerate(starts) if start <= epoch or i == 0)

    def span(self, index: int) -> str:
        """The epochs phase ``index`` runs, in the words progress lines use (from 1)."""
        phase, first = self.phases[index], self.starts()[index] + 1
        if phase.epochs is None:
            return f"epochs {first} on"
        last = first + phase.epochs - 1
        return f"epoch {first}" if last == first else f"epochs {first}-{last}"

    def describe(self) -> str:
        """Multi-line text: each phase's name and epochs, then its schedule's lines."""
        lines = []
        for index, phase in enumerate(self.phases):
            lines.append(f"phase {phase.name} ({self.span(index)}):")
            lines.extend(f"  {line}" for line in phase.schedule.describe().splitlines())
        return "\n".join(lines)


def schedules_of(schedule: Schedule | Phases) -> tuple[Schedule, ...]:
    """The schedules a recipe's ``schedule()`` holds: itself, or each phase's."""
    return schedule.schedules if isinstance(schedule, Phases) else (schedule,)
