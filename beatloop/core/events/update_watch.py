"""What a gated entry's settings did in the first epoch, said once: a beat or group whose
``only_if`` never held (it trained nothing all epoch) and an ``accumulate`` larger than
the turns an epoch gives it (an epoch's end applies a partial sum, so it made one update
an epoch), each an ``IgnoredSettingWarning`` naming the entry and the numbers.

Decided on the host from the ``<beat>_updates`` figures the run logs anyway and the step
counter: the compiled step does nothing for it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import attrs

from beatloop.core.compiled.metrics import UPDATES
from beatloop.core.events.callbacks import Callback, Order
from beatloop.core.events.loss_watch import loss_watches
from beatloop.core.events.run import Run
from beatloop.core.failures.errors import IgnoredSettingWarning


@attrs.frozen
class Gated:
    """A beat or group with ``only_if`` or ``accumulate``, as the watch reads it: its
    ``counted`` beat's ``_updates`` figure, its condition's name (``None``: none)."""

    kind: str
    name: str
    counted: str
    condition: str | None
    accumulate: int
    every: int


class UpdateWatch(Callback):
    """At the end of the first epoch this process runs, warns of each gated entry whose
    condition never held in it, and of each whose ``accumulate`` exceeds its turns."""

    #: After the writers: the epoch's progress line comes first, then the warning.
    order = Order.WRITER + 1

    def __init__(self, entries: Sequence[Gated]):
        self.entries = tuple(entries)
        self._first: int | None = None
        self._done = False

    def on_epoch_start(self, run: Run, epoch: int) -> None:
        if self._first is None:  # the epoch's first step (a resumed epoch's included)
            self._first = run.step - int(run.counters.epoch_batches)

    def on_epoch_end(self, run: Run, epoch: int, logs: Mapping[str, float]) -> None:
        if self._done:
            return
        self._done = True
        for entry in self.entries:
            updates = logs.get(entry.counted + UPDATES)
            if updates is None:  # an entry of a later phase
                continue
            turns = _turns(self._first, run.step, entry.every)
            for words in _findings(entry, epoch + 1, turns, float(updates)):
                warnings.warn(words, IgnoredSettingWarning, stacklevel=2)


def _turns(first: int, end: int, every: int) -> int:
    """How many of the steps ``first`` to ``end - 1`` ``every`` selects (0, N, 2N, ...)."""
    return -(-end // every) - -(-first // every)


def _findings(entry: Gated, epoch: int, turns: int, updates: float) -> list[str]:
    """What to say of ``entry`` after epoch ``epoch`` (counted from 1)."""
    found = []
    named = f"{entry.kind} {entry.name!r}"
    if entry.condition is not None and turns > 0 and updates == 0:
        found.append(
            f"{named} made no update in epoch {epoch}: its condition {entry.condition!r} "
            f"(only_if) held on none of its {turns} turns, so it trained nothing; check the "
            f"condition ({entry.counted}{UPDATES} counts the updates of each epoch)"
        )
    if entry.accumulate > turns > 0:
        found.append(
            f"{named} has accumulate={entry.accumulate}, more than the {turns} turns epoch "
            f"{epoch} gave it: an epoch's end applies what it has summed, so it makes one "
            f"update an epoch, of {turns} batches; give accumulate={turns} or less, or longer "
            "epochs (steps_per_epoch)"
        )
    return found


def update_watches(bounds: Sequence) -> list[Callback]:
    """The run's update watch over the gated entries of every bound schedule (one per
    phase); none when no entry has ``only_if`` or ``accumulate``."""
    entries = [
        Gated(
            "beat" if group.forward_fn is None else "group",
            group.name,
            group.beats[0].name,
            None if group.condition is None else group.condition.shown,
            group.accumulate,
            group.every,
        )
        for bound in bounds
        for group in bound.groups
        if group.condition is not None or group.accumulators is not None
    ]
    return [UpdateWatch(list(dict.fromkeys(entries)))] if entries else []


def run_watches(beats: Sequence, bounds: Sequence, divergence: float | None) -> list[Callback]:
    """Every watch a run adds: the loss watch (``loss_watch``) and the update watch."""
    return [*loss_watches(beats, divergence), *update_watches(bounds)]
