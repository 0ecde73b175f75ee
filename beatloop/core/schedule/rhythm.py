"""How an entry's ``repeat`` and ``accumulate`` combine: they do not.

An accumulation's turns all see the same weights (nothing is applied until its N-th
turn), so a repeat would add the same batch's gradient again instead of updating on it
again: ``repeat=2, accumulate=2`` would be one plain update a step. Refused when the
entry is made.
"""

from __future__ import annotations

from beatloop.core.failures.errors import ScheduleError


def check_rhythm(entry, kind: str) -> None:
    """Refuse a ``Beat`` or ``Group`` (``kind``: ``"beat"``, ``"group"``) that sets both
    ``repeat`` and ``accumulate`` above 1."""
    if entry.repeat > 1 and entry.accumulate > 1:
        raise ScheduleError(
            [
                f"{kind} {entry.name!r} sets repeat={entry.repeat} with "
                f"accumulate={entry.accumulate}, which do not combine: an accumulation's turns "
                "all see the same weights, so a repeat would only sum the same batch again; "
                "give repeat (several updates on each batch) or accumulate (one update over "
                "several batches)"
            ]
        )
