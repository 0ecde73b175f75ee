"""One-line errors for the fields of beatloop's public attrs classes.

attrs refuses ``Beat(accumulate=1.5)`` with a tuple of its message, the ``Attribute``
and the validator; ``one_line_frozen`` (``attrs.frozen`` with a ``field_transformer``)
wraps every field's validator so the refusal is a ``FieldError`` of one line naming the
class and field, what the field takes and what it got. ``attrs_problem`` says the same of an error
attrs raised elsewhere (a recipe's config class, built by ``make_config``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from beatloop.core.failures.errors import BeatloopError, ConfigError


class FieldError(ConfigError, TypeError):
    """A value a public class's field does not take (``Beat(accumulate=0)``,
    ``fit(keep_best=123)``), in one line: ``OWNER(FIELD=...) takes WHAT, got VALUE
    (TYPE)``. Also a ``TypeError``, as attrs' type checks were. Attributes: ``owner``,
    ``field`` and ``problem`` (the words after the field)."""

    def __init__(self, owner: str, field: str, problem: str):
        self.owner, self.field, self.problem = owner, field, problem
        super().__init__(f"{owner}({field}=...){problem}")

    def __reduce__(self):  # pickled (a trial's error, sent back) with its three parts
        return FieldError, (self.owner, self.field, self.problem)

    def owned_by(self, owner: str) -> FieldError:
        """This error naming ``owner`` (``fit``, whose arguments become the class's fields)."""
        return FieldError(owner, self.field, self.problem)


def one_line_frozen(cls: type | None = None, **options: Any) -> Any:
    """``attrs.frozen`` whose validated fields refuse a value with a ``FieldError`` (the
    decorator of beatloop's public attrs classes)."""
    decorate = attrs.frozen(field_transformer=_one_line_fields, **options)
    return decorate if cls is None else decorate(cls)


def _one_line_fields(cls: type, fields: list[attrs.Attribute]) -> list[attrs.Attribute]:
    """An attrs ``field_transformer``: each validated field's validator in a ``_OneLine``."""
    return [f if f.validator is None else f.evolve(validator=_OneLine(f.validator)) for f in fields]


@attrs.frozen
class _OneLine:
    """A field's validator whose refusal is a ``FieldError`` (beatloop's own errors,
    already written for the user, pass as they are)."""

    inner: Callable

    def __call__(self, instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        try:
            self.inner(instance, attribute, value)
        except BeatloopError:
            raise
        except (TypeError, ValueError) as error:
            problem = refusal(self.inner, value, error)
            raise FieldError(type(instance).__name__, attribute.name, problem) from None


def refusal(validator: Callable, value: Any, error: BaseException) -> str:
    """`` takes WHAT, got VALUE (TYPE)``; for a validator that is not attrs' own, its
    message (the first line, when attrs made it a tuple)."""
    wanted = takes(validator)
    if wanted is None:
        first = str(error.args[0] if error.args else error).strip()
        return f": {first.splitlines()[0] if first else type(error).__name__}"
    return f" takes {wanted}, got {value!r} ({type(value).__name__})"


def attrs_problem(error: BaseException, owner: str) -> str | None:
    """One line for an error an attrs validator raised (its args: message, ``Attribute``,
    ..., the value), ``None`` for any other error."""
    args = error.args
    if len(args) < 2 or not isinstance(args[1], attrs.Attribute):
        return None
    attribute = args[1]
    wanted = takes(attribute.validator) if attribute.validator is not None else None
    where = f"config field {attribute.name!r} of {owner}"
    if wanted is None or len(args) < 4:
        return f"{where}: {args[0]}"
    return f"{where} takes {wanted}, got {args[-1]!r} ({type(args[-1]).__name__})"


def takes(validator: Callable) -> str | None:
    """What one of attrs' own validators (``instance_of``, ``in_``, ``ge`` and the like,
    ``optional``, and lists of them) accepts, in words; ``None`` for any other."""
    kind = type(validator).__name__
    if kind == "_OneLine":
        return takes(validator.inner)
    if kind == "_OptionalValidator":
        inner = takes(validator.validator)
        return None if inner is None else f"None or {inner}"
    if kind == "_InValidator":
        return "one of " + ", ".join(repr(option) for option in validator.options)
    parts = list(validator._validators) if kind == "_AndValidator" else [validator]
    types = [p.type for p in parts if type(p).__name__ == "_InstanceOfValidator"]
    bounds = [p for p in parts if type(p).__name__ == "_NumberValidator"]
    if len(types) + len(bounds) != len(parts) or len(types) > 1:
        return None
    noun = _type_words(types[0]) if types else "a number"
    limits = " and ".join(f"{b.compare_op} {b.bound!r}" for b in bounds)
    return f"{noun} {limits}" if limits else noun


def _type_words(kind: type | tuple[type, ...]) -> str:
    """``an int``; ``an int or a float`` for a tuple of types."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        f"{'an' if k.__name__[0] in 'aeiouAEIOU' else 'a'} {k.__name__}" for k in kinds
    )
