"""Which known name a mistyped one probably meant, for the "did you mean" of errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest_name(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``name`` most likely means: a near spelling, else one that contains
    ``name`` whole or is contained in it, ignoring case (``env`` for ``environment``:
    edit distance alone misses a long word for its abbreviation), the most alike first.
    The shorter of the two must have 3 characters or more; ``None`` when none fits."""
    candidates = list(candidates)
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if close:
        return close[0]
    folded = name.casefold()
    contained = [
        c
        for c in candidates
        if min(len(c), len(name)) >= 3 and (c.casefold() in folded or folded in c.casefold())
    ]
    contained.sort(key=lambda c: -difflib.SequenceMatcher(None, name, c).ratio())
    return contained[0] if contained else None
