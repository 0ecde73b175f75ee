"""Binding an entry's run-time "how often": its ``only_if`` condition and, for an entry
that ``accumulate``s, its sums (``beatloop.core.compiled.conditional`` and
``beatloop.core.compiled.accumulation`` run them in the step)."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from beatloop.core.compiled.accumulation import Accumulators
from beatloop.core.compiled.bound import BoundGroup
from beatloop.core.compiled.conditional import bind_condition
from beatloop.core.compiled.user_code import as_written
from beatloop.core.schedule.beats import Beat, Group, Schedule
from beatloop.core.schedule.phases import schedules_of


def gated_groups(schedule: Schedule, groups, methods, problems: list[str]) -> list[BoundGroup]:
    """The bound entries (``groups``, in step order) with their conditions and sums."""
    entries = _gradient_entries(schedule)
    return [_gated(g, e, methods, problems) for g, e in zip(groups, entries, strict=True)]


def _gradient_entries(schedule: Schedule) -> list[Beat | Group]:
    """The beats and groups of ``schedule``, in step order (as its bound groups)."""
    return [entry for entry in schedule.beats if isinstance(entry, Beat | Group)]


def _gated(group: BoundGroup, entry: Beat | Group, methods, problems: list[str]) -> BoundGroup:
    """A bound entry with its condition and, accumulating, its sums."""
    condition = bind_condition(entry, methods, problems)
    if condition is None and entry.accumulate == 1:
        return group
    sums = Accumulators.of(group.name, group.beats) if entry.accumulate > 1 else None
    return attrs.evolve(group, condition=condition, accumulate=entry.accumulate, accumulators=sums)


def conditioned_updates(schedule: Schedule, updates, methods, problems: list[str]) -> list:
    """The bound updates with their conditions (a beat's or group's name ties one to
    that entry's update in the step)."""
    names = [entry.name for entry in _gradient_entries(schedule)]
    return [
        attrs.evolve(u, condition=bind_condition(u.entry, methods, problems, names))
        if getattr(u.entry, "only_if", None) is not None
        else u
        for u in updates
    ]


def condition_methods(recipe, schedule) -> dict[str, Callable]:
    """The recipe's methods that the conditions of ``schedule`` (a ``Schedule`` or
    ``Phases``) name, by name (a name that is no method is left to ``bind`` to report)."""
    named = {
        entry.only_if
        for each in schedules_of(schedule)
        for entry in (*each.beats, *(b for g in each.groups for b in g.beats))
        if isinstance(getattr(entry, "only_if", None), str)
    }
    methods = {name: getattr(recipe, name, None) for name in sorted(named)}
    return {name: as_written(recipe, fn) for name, fn in methods.items() if callable(fn)}


def counted_beats(bounds) -> list[str]:
    """The names of the beats whose updates are counted (those of gated entries), over
    every bound schedule (one per phase)."""
    names = [
        beat.name
        for bound in bounds
        for group in bound.groups
        if group.condition is not None or group.accumulators is not None
        for beat in group.beats
    ]
    return list(dict.fromkeys(names))
