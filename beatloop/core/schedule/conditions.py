"""``only_if=``: the run-time half of a schedule entry's "how often".

A condition is the name of a recipe method or a function, called at the entry's turn in
the compiled step with what a loss is given (``models``, ``batch``) and, if it takes a
third parameter, the entry's loss on this batch, and a fourth, its gradients; it returns
a scalar boolean tensor.
Here it is data: checked when the entry is made, printed by ``describe()``. Calling it
is ``beatloop.core.compiled.conditional``'s job.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

from beatloop.core.failures.errors import ScheduleError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: What a condition is, in error messages.
EXPECTED = (
    "the name of a recipe method or a function fn(models, batch), fn(models, batch, loss) "
    "or fn(models, batch, loss, gradients) returning a scalar boolean tensor"
)


def check_condition(instance, attribute, value) -> None:
    """An attrs validator: ``None``, a Python-style name, or a function of two to four
    positional parameters."""
    where = f"{type(instance).__name__}({attribute.name}=...)"
    if value is None:
        return
    if isinstance(value, str):
        if not _NAME.match(value):
            raise ScheduleError([f"{where} must be {EXPECTED}, got {value!r}"])
        return
    if not callable(value):
        raise ScheduleError([f"{where} must be {EXPECTED}, got {value!r}"])
    if condition_arity(value) is None:
        signature = inspect.signature(value)
        raise ScheduleError(
            [
                f"{where} must be {EXPECTED}; {condition_name(value)}{signature} takes "
                "neither two, three nor four positional arguments"
            ]
        )


def condition_arity(fn: Callable) -> int | None:
    """4 when ``fn`` takes ``(models, batch, loss, gradients)``, 3 when ``(models, batch,
    loss)``, 2 when ``(models, batch)``, ``None`` when none of them (a signature that
    cannot be read counts as two)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return 2
    for count in (4, 3, 2):
        try:
            signature.bind(*range(count))
        except TypeError:
            continue
        return count
    return None


def condition_name(value) -> str:
    """How a condition is printed: a method's name as given, a function's ``__qualname__``."""
    if isinstance(value, str):
        return value
    return getattr(value, "__qualname__", None) or type(value).__qualname__


def condition_words(only_if) -> list[str]:
    """``only_if=name`` in ``describe()``'s words (nothing without a condition)."""
    return [] if only_if is None else [f"only_if={condition_name(only_if)}"]
