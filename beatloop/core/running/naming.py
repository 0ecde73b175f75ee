"""Keras's automatic names counted per run, so a run's graphs do not depend on what the
process built before it.

Keras names every unnamed layer, model, optimizer, metric and loss from process-wide
counters (``dense``, ``dense_1``, ...), and a layer's name is the name scope of the ops
it adds to a traced graph. Grappler's arithmetic optimizer orders the operands of a sum
by node name, so the same recipe built after other models can sum in another order and
end a few ulp apart. A run builds and traces its parts inside its own ``RunNames``:
counted from zero, as in a fresh process. Models the user passes were named when the
user built them; ``history_named`` finds those whose names sort otherwise than a fresh
process's would. (The counters are Keras's private state: only this module touches them.)
"""

from __future__ import annotations

import collections
import contextlib
import re
import sys
import warnings
from collections.abc import Iterator, Mapping

import keras
from keras.src.backend.common import global_state
from keras.src.utils.naming import to_snake_case

from beatloop.core.failures.errors import ReproducibilityWarning

#: Where Keras keeps its name counters (``keras.src.utils.naming``).
_COUNTERS = "object_name_uids"
_NUMBERED = re.compile(r"^(?P<prefix>.+)_(?P<number>\d+)$")


class RunNames:
    """One run's name counters: empty at first, kept between the run's scopes (a later
    evaluation traced for new data goes on counting where the run's build stopped)."""

    def __init__(self) -> None:
        self.counters: collections.defaultdict[str, int] = collections.defaultdict(int)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Keras names objects from this run's counters inside the block; afterwards the
        process's counters go on from the larger of both, so names Keras gives later
        stay unique against everything built so far."""
        before = global_state.get_global_attribute(_COUNTERS)
        global_state.set_global_attribute(_COUNTERS, self.counters)
        try:
            yield
        finally:
            merged = collections.defaultdict(int, before or {})
            for prefix, count in self.counters.items():
                merged[prefix] = max(merged[prefix], count)
            global_state.set_global_attribute(_COUNTERS, merged)


def history_named(models: Mapping[str, keras.Layer]) -> list[str]:
    """The automatic names in ``models`` (each model and every layer in it) whose order
    differs from the order a fresh process building these models first would give them
    (``dense_9``, ``dense_10`` sort otherwise than ``dense``, ``dense_1``): node names
    follow them, so the graph's sums may be ordered otherwise. Names in the same order
    give the same graph, renamed."""
    numbers: dict[str, list[int]] = {}
    for model in models.values():
        for layer in model._flatten_layers(include_self=True, recursive=True):
            automatic = to_snake_case(type(layer).__name__)
            match = _NUMBERED.match(layer.name)
            if layer.name == automatic:
                numbers.setdefault(automatic, []).append(0)
            elif match and match["prefix"] == automatic:
                numbers.setdefault(automatic, []).append(int(match["number"]))
    reordered = []
    for prefix, taken in sorted(numbers.items()):
        taken = sorted(set(taken))  # creation order: Keras numbers as it goes
        actual = [_automatic(prefix, n) for n in taken]
        fresh = [_automatic(prefix, n) for n in range(len(taken))]
        if _lexical_order(actual) != _lexical_order(fresh):
            reordered.extend(actual)
    return reordered


def _automatic(prefix: str, number: int) -> str:
    return prefix if number == 0 else f"{prefix}_{number}"


def _lexical_order(names: list[str]) -> list[int]:
    """The positions of ``names`` in the order node names under them sort in."""
    return sorted(range(len(names)), key=lambda index: names[index] + "/")


def warn_history_named(models: Mapping[str, object], label: str) -> None:
    """One ``ReproducibilityWarning``, pointing at the user's call, when models the user
    passed (Keras objects, not ``.keras`` files, whose names are stored) carry automatic
    names ordered otherwise than a fresh process would order them."""
    given = {name: m for name, m in models.items() if isinstance(m, keras.Layer)}
    names = history_named(given)
    if names:
        warnings.warn(
            ReproducibilityWarning(
                f"{label}: models= ({', '.join(sorted(given))}) carry Keras names numbered "
                f"after objects built before them ({', '.join(names[:3])}), in another "
                "order than a fresh process gives: graph node names follow them, so the "
                "run may end a few ulp off a fresh process's; name the models and layers, "
                "or build them first in a fresh process"
            ),
            stacklevel=_outside_beatloop(),
        )


def _outside_beatloop() -> int:
    """The ``stacklevel`` of the innermost caller outside beatloop (the user's line)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("beatloop"):
        frame, level = frame.f_back, level + 1
    return level
