"""Binding a schedule's updates and acts: the variables each update writes, and the
``(target, source)`` pairs of an ``EMA`` or ``Copy``.

Problems (an unknown model, a count or shape that does not pair) are noted in the one
list ``bind`` raises as a ``ScheduleError``; the ownership rules (a written variable
belongs to its update) are checked with the beats' in ``binding``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import keras

from beatloop.core.compiled.averaged import overlapping_sources
from beatloop.core.compiled.bound import BoundGroup, BoundUpdate
from beatloop.core.schedule.updates import EMA, Copy, NonGradient

#: Resolves one selector to trainable variables, noting problems (``binding.select``).
Select = Callable[[str, Mapping[str, keras.Layer], list, str], list]


def bind_updates(schedule, models, problems: list[str], select: Select) -> list[BoundUpdate]:
    """Each update and act of ``schedule`` bound, in step order (problems noted)."""
    entries = [e for e in schedule.beats if isinstance(e, NonGradient)]
    updates = [_bound(entry, models, problems, select) for entry in entries]
    problems.extend(overlapping_sources(updates))
    return updates


def _bound(entry, models, problems: list[str], select: Select) -> BoundUpdate:
    where = f"{type(entry).__name__} {entry.name!r}"
    if isinstance(entry, EMA | Copy):
        sources = select(entry.source, models, problems, f"{where} (source)")
        targets = select(entry.target, models, problems, f"{where} (target)")
        pairs = _pairs(where, entry, sources, targets, problems)
        return BoundUpdate(entry, tuple(_unique(targets)), pairs)
    written = [v for s in getattr(entry, "writes", ()) for v in select(s, models, problems, where)]
    return BoundUpdate(entry, tuple(_unique(written)))


def _pairs(where: str, entry, sources, targets, problems: list[str]) -> tuple:
    """Source and target variables paired in order; a count, shape or dtype that does
    not pair is a problem."""
    if not sources or not targets:
        return ()
    if len(sources) != len(targets):
        problems.append(
            f"{where} pairs the trainable variables of {entry.source!r} and {entry.target!r} "
            f"in order, but they have {len(sources)} and {len(targets)}: give models of the "
            "same architecture (or selectors that match the same variables)"
        )
        return ()
    found = [
        f"{where} pairs {s.path!r} {_kind_of(s)} with {t.path!r} {_kind_of(t)}, which differ: "
        "give models of the same architecture"
        for s, t in zip(sources, targets, strict=True)
        if tuple(s.shape) != tuple(t.shape) or s.dtype != t.dtype
    ]
    problems.extend(found)
    if found:
        return ()
    if any(s is t for s, t in zip(sources, targets, strict=True)):
        problems.append(f"{where} has the same variables as source and target")
        return ()
    return tuple(zip(targets, sources, strict=True))


def _kind_of(variable) -> str:
    return f"{tuple(variable.shape)} {variable.dtype}"


def _unique(variables) -> list:
    seen: dict[int, keras.Variable] = {}
    for variable in variables:
        seen.setdefault(id(variable), variable)
    return list(seen.values())


def written_by(updates: list[BoundUpdate]) -> dict[int, list[str]]:
    """Each written variable (by id) and the updates that write it."""
    writers: dict[int, list[str]] = {}
    for update in updates:
        for variable in update.writes:
            writers.setdefault(id(variable), []).append(update.name)
    return writers


def in_step_order(schedule, groups: list[BoundGroup], updates: list[BoundUpdate]) -> tuple:
    """The bound entries in the schedule's order (``groups`` alone when it has no updates
    or acts: the step then is exactly what it was without them)."""
    if not updates:
        return tuple(groups)
    by_name = {update.name: update for update in updates}
    remaining = iter(groups)
    return tuple(
        by_name[e.name] if isinstance(e, NonGradient) else next(remaining) for e in schedule.beats
    )
