"""Averaged weights evaluated: an ``EMA(..., evaluated=True)``'s target values put in
its source's place for validation, evaluation and export, and the source's own put back
after (Keras's ``SwapEMAWeights``), so training goes on with them untouched.

The swap is plain assignments between compiled calls: the traced loops are the same
with and without it, and evaluating the average equals evaluating a model holding the
average's values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import tensorflow as tf

from beatloop.core.schedule.updates import EMA

#: What the source's own validation figures are called beside the average's:
#: ``val_raw_loss`` beside ``val_loss``.
RAW = "raw_"


def evaluated_pairs(updates: Sequence) -> tuple:
    """The ``(source, average)`` variable pairs of the bound updates' evaluated EMAs."""
    return tuple(
        (source, target)
        for update in updates
        if isinstance(update.entry, EMA) and update.entry.evaluated
        for target, source in update.pairs
    )


def overlapping_sources(updates: Sequence) -> list[str]:
    """Problems: a source variable two evaluated EMAs would both replace."""
    owner: dict[int, str] = {}
    problems = []
    for update in updates:
        if not (isinstance(update.entry, EMA) and update.entry.evaluated):
            continue
        for _, source in update.pairs:
            first = owner.setdefault(id(source), update.name)
            if first != update.name:
                problems.append(
                    f"EMA {first!r} and EMA {update.name!r} are both evaluated=True for "
                    f"{source.path!r}: evaluate one average of a variable"
                )
    return problems


@contextlib.contextmanager
def averaged_weights(pairs: Sequence) -> Iterator[None]:
    """Each source variable holds its average's value inside the block, its own after
    (also when the block raises)."""
    own = [tf.identity(source.value) for source, _ in pairs]  # a copy: assigns don't alias it
    for source, average in pairs:
        source.assign(average)
    try:
        yield
    finally:
        for (source, _), value in zip(pairs, own, strict=True):
            source.assign(value)


def raw_figures(figures: dict[str, float], prefix: str) -> dict[str, float]:
    """``figures`` of the source's own weights, renamed ``PREFIX raw_ NAME``."""
    return {prefix + RAW + name.removeprefix(prefix): value for name, value in figures.items()}
