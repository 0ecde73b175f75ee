"""A run in phases: every phase's schedule bound, and the run's parts for the phase an
epoch falls in (``beatloop.core.schedule.phases`` holds the values).

All phases are bound before the first step, each by its own rules (a variable frozen in
one phase may be trained in the next), and every phase's problems are reported in one
``ScheduleError``, each naming its phase. An optimizer is built once, for every variable
its beats update over all phases (a Keras optimizer refuses variables it was not built
for). The engine swaps the parts it runs at epoch boundaries (``in_phase``); the
compiled loops are the phases' own, traced at assembly, so a run without phases runs
exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from beatloop.core.compiled.binding import BoundSchedule, bind, build_optimizers
from beatloop.core.failures.errors import ConfigError, ScheduleError
from beatloop.core.schedule.phases import Phases


def bind_phases(
    phases: Phases, models, optimizers, losses, batch_spec=None, context="the schedule", **how
) -> tuple[BoundSchedule, ...]:
    """Every phase's schedule bound (``bind``'s arguments; ``how``: its keywords), its
    optimizers built for the union of their variables over all phases, then each phase's
    losses traced on ``batch_spec`` (when given); problems of all phases in one error."""
    names = [phase.name for phase in phases.phases]
    bounds = _each(phases, names, context, lambda s, c: bind(
        s, models, optimizers, losses, None, c, build=False, **how
    ))  # fmt: skip
    problems = build_optimizers([beat for bound in bounds for beat in bound.beats])
    if problems:
        raise ScheduleError(problems, context)
    if batch_spec is None:
        return bounds
    return _each(phases, names, context, lambda s, c: bind(
        s, models, optimizers, losses, batch_spec, c, **how
    ))  # fmt: skip


def _each(phases: Phases, names, context: str, binding: Callable) -> tuple[BoundSchedule, ...]:
    """``binding(schedule, context)`` for every phase; their problems, named by phase,
    raised together."""
    bounds, problems = [], []
    for name, schedule in zip(names, phases.schedules, strict=True):
        try:
            bounds.append(binding(schedule, f"{context}, phase {name!r}"))
        except ScheduleError as error:
            problems += [f"phase {name!r}: {problem}" for problem in error.problems]
    if problems:
        raise ScheduleError(problems, context)
    return tuple(bounds)


@attrs.frozen
class PhaseParts:
    """What one phase runs: its bound schedule, compiled loops, metrics (each phase logs
    its own beats' figures) and divergence guard."""

    name: str
    bound: BoundSchedule
    train_loop: object
    validation_loop: object
    train_metrics: object
    validation_metrics: object
    divergence: object = None


@attrs.frozen
class PhasedRun:
    """The phases of a run and each one's parts, in order."""

    phases: Phases
    parts: tuple[PhaseParts, ...]

    def at(self, epoch: int) -> PhaseParts:
        """The parts epoch ``epoch`` (from 0) runs: a function of the epoch number only,
        so a resumed run picks the phase it stopped in."""
        return self.parts[self.phases.index_at(epoch)]

    def check_epochs(self, epochs: int) -> None:
        """Refuse a run longer than phases of fixed length cover."""
        covered = self.phases.epochs
        if covered is not None and epochs > covered:
            raise ConfigError(
                f"the recipe's phases cover {covered} epoch(s) "
                f"({'; '.join(self._spans())}), but epochs={epochs} was asked for: ask for "
                f"at most {covered}, or give the last phase epochs=None (the rest of the run)"
            )

    def _spans(self) -> list[str]:
        return [f"{p.name}: {self.phases.span(i)}" for i, p in enumerate(self.phases.phases)]

    def guards(self) -> list:
        """Every phase's divergence guard (none with the guard off)."""
        return [part.divergence for part in self.parts if part.divergence is not None]


def in_phase(parts, epoch: int):
    """The run's parts (a ``RunParts``) with those of the phase ``epoch`` falls in, for a
    recipe in phases; ``parts`` themselves otherwise, or when they are that phase's."""
    if parts.phased is None:
        return parts
    phase = parts.phased.at(epoch)
    if phase.train_metrics is parts.train_metrics:
        return parts
    fields = attrs.asdict(phase, recurse=False)
    fields.pop("name")
    return attrs.evolve(parts, **fields)


def enter_phase(engine, epoch: int) -> None:
    """Make ``engine`` (an ``Engine``) run the phase ``epoch`` falls in: its loops,
    metrics and guard; its evaluation and callbacks (``run.bound``) see the phase's."""
    parts = in_phase(engine.parts, epoch)
    if parts is not engine.parts:
        engine.parts = engine.evaluation.parts = parts
        engine.run.bound = parts.bound


def check_epochs(parts, epochs: int) -> None:
    """Refuse a run longer than a recipe's phases of fixed length cover."""
    if parts.phased is not None:
        parts.phased.check_epochs(epochs)


def updates_by_beat(bounds: PhasedRun | Iterable[BoundSchedule]) -> dict[str, list[str]]:
    """The paths of the variables each beat updates and each update writes, by name (over
    all phases of a ``PhasedRun``: a beat in several phases, every variable it updates in
    any of them, once)."""
    if isinstance(bounds, PhasedRun):
        bounds = [part.bound for part in bounds.parts]
    updates: dict[str, list[str]] = {}
    for bound in bounds:
        owners = [(b.name, b.variables) for b in bound.beats]
        owners += [(u.name, u.writes) for u in bound.updates if u.writes]
        for name, variables in owners:
            paths = updates.setdefault(name, [])
            paths += [v.path for v in variables if v.path not in paths]
    return updates


def bind_schedule(schedule, *args, **kwargs) -> tuple[BoundSchedule, ...]:
    """A recipe's schedule bound (``bind``'s arguments): one bound schedule, or every
    phase's."""
    if isinstance(schedule, Phases):
        return bind_phases(schedule, *args, **kwargs)
    return (bind(schedule, *args, **kwargs),)


def phase_parts(
    schedule, bounds, loops, guards, train_metrics, validation_metrics
) -> PhasedRun | None:
    """Each phase's parts (``loops``: its training and validation loops), or ``None``
    for a schedule without phases."""
    if not isinstance(schedule, Phases):
        return None
    parts = []
    for phase, bound, (train, validation), guard in zip(
        schedule.phases, bounds, loops, guards, strict=True
    ):
        names = [beat.name for beat in bound.beats]
        parts.append(
            PhaseParts(
                phase.name,
                bound,
                train,
                validation,
                train_metrics.only(names),
                validation_metrics.only(names),
                guard,
            )
        )
    return PhasedRun(schedule, tuple(parts))
