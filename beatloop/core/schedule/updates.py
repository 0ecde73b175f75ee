"""Schedule entries that are not gradient updates: ``Update`` (and its built-ins ``EMA``
and ``Copy``), which assign model variables, and ``Act``, which makes data inside the
step (an agent acting, a buffer filling).

Like beats they are printable, comparable values with a name and an ``every``; they hold
the user's function, printed by its ``__qualname__``. They run in the compiled training
step only, at their place in the schedule: never in validation, evaluation or binding.
Binding them to variables is ``beatloop.core.compiled.update_binding``'s job.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence

import attrs

from beatloop.core.failures.errors import ScheduleError
from beatloop.core.failures.fields import one_line_frozen
from beatloop.core.schedule.conditions import check_condition, condition_words

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _selector_tuple(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """One selector or several; a lone string is one selector, not its letters."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Sequence):
        raise ScheduleError(
            [f"`writes` takes selectors like 'model' or 'model:dense/*', got {value!r}"]
        )
    return tuple(value)


def _refuse(instance, attribute, expected: str, value) -> None:
    raise ScheduleError(
        [f"{type(instance).__name__}({attribute.name}=...) must be {expected}, got {value!r}"]
    )


def _callable(instance, attribute, value) -> None:
    if not callable(value):
        _refuse(instance, attribute, "a function", value)


def _takes(*params: str):
    """A validator: the function can be called with ``params`` (positionally), checked
    when the entry is made rather than when the step is traced."""
    wanted = f"fn({', '.join(params)})"

    def check(instance, attribute, value) -> None:
        _callable(instance, attribute, value)
        try:
            signature = inspect.signature(value)
        except (TypeError, ValueError):  # some C functions: nothing to read
            return
        try:
            signature.bind(*params)
        except TypeError:
            raise ScheduleError(
                [
                    f"{type(instance).__name__}(fn=...) must be a function {wanted}, got "
                    f"{qualname(value)}, whose signature {signature} cannot take "
                    f"{len(params)} positional argument{'s' if len(params) > 1 else ''}"
                ]
            ) from None

    return check


def _positive(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _refuse(instance, attribute, "a whole number of steps, 1 or more", value)


def _fraction(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        _refuse(instance, attribute, "a number from 0 to 1 (e.g. 0.99)", value)


def _flag(instance, attribute, value) -> None:
    if not isinstance(value, bool):
        _refuse(instance, attribute, "True or False", value)


def _selector(instance, attribute, value) -> None:
    if not isinstance(value, str) or not value or not _NAME.match(value.partition(":")[0]):
        _refuse(instance, attribute, "a model name or 'model:glob' selector", value)


def _selectors(instance, attribute, value) -> None:
    for selector in value:
        _selector(instance, attribute, selector)


def _name_of(entry, fn_or_model) -> str:
    """The entry's ``name``, or the default one, checked to be a Python-style name."""
    name = entry.name
    if name is None:
        name = getattr(fn_or_model, "__name__", fn_or_model)
    if not isinstance(name, str) or not _NAME.match(name):
        why = " (a lambda has no name of its own)" if name == "<lambda>" else ""
        raise ScheduleError(
            [
                f"{type(entry).__name__} needs a Python-style name (letters, digits, "
                f"underscores), got {name!r}{why}: give it `name=`, e.g. "
                f"{type(entry).__name__}(fn, name='collect')"
            ]
        )
    return name


def qualname(fn: Callable) -> str:
    """How a user's function is printed: its ``__qualname__`` (its class's name for a
    callable object)."""
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


@one_line_frozen
class Update:
    """A step entry that assigns variables without a gradient: ``fn(models)`` with every
    model in inference mode (``models.raw(name)`` for its variables, ``models.state``,
    ``models.random``), returning nothing. ``writes`` selects the model variables it
    assigns (``Beat.updates``'s syntax): binding gives them to this update, so no beat
    may update them (unless declared shared) and they need not be declared frozen; a
    model variable ``fn`` assigns outside ``writes`` is refused at bind (its function is
    traced once). ``name`` defaults to the function's name: a lambda needs ``name=``.
    ``every`` runs it on the steps whose number (counted from 0 over the whole run,
    across epochs and resumes) is a multiple of ``every``: 0, N, 2N, ...; ``only_if``
    (on ``Update``, ``EMA`` and ``Copy`` alike) runs it only when a condition holds: a
    beat's (or group's) name ties it to that entry having updated in this step, a recipe
    method's name or a function ``fn(models, batch)`` is asked at its turn."""

    fn: Callable = attrs.field(validator=_takes("models"))
    name: str = attrs.field(default=None)
    every: int = attrs.field(default=1, validator=_positive)
    writes: tuple[str, ...] = attrs.field(
        default=(), converter=_selector_tuple, validator=_selectors
    )
    only_if: str | Callable | None = attrs.field(default=None, validator=check_condition)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "name", _name_of(self, self.fn))

    def describe(self) -> str:
        writes = ",".join(self.writes) or "(no model variables)"
        described = f"{self.name}: update fn={qualname(self.fn)} writes={writes} every={self.every}"
        return " ".join([described, *condition_words(self.only_if)])


@one_line_frozen
class EMA:
    """Polyak averaging of a target network (BYOL, MoCo, mean teacher): each of the
    target's trainable variables ``t`` becomes ``decay * t + (1 - decay) * s``, where
    ``s`` is the source's variable at the same place (paired in order, shapes checked
    at bind). The name defaults to the target's.

    ``evaluated=True`` makes the average what the run is judged and shipped by, as
    Keras's ``SwapEMAWeights`` does: validation, ``evaluate``, ``export`` (and so
    ``keep_best``) run the source with the target's values in place of its trainable
    variables, put back after; training goes on with the source's own. Its ``val_``
    figures are then the average's, and the source's own are logged as ``val_raw_``."""

    source: str = attrs.field(validator=_selector)
    target: str = attrs.field(validator=_selector)
    decay: float = attrs.field(validator=_fraction)
    name: str = attrs.field(default=None)
    every: int = attrs.field(default=1, validator=_positive)
    only_if: str | Callable | None = attrs.field(default=None, validator=check_condition)
    evaluated: bool = attrs.field(default=False, validator=_flag)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "name", _name_of(self, self.target.partition(":")[0]))

    @property
    def writes(self) -> tuple[str, ...]:
        return (self.target,)

    def describe(self) -> str:
        described = (
            f"{self.name}: EMA source={self.source} target={self.target} "
            f"decay={self.decay:g} every={self.every}"
        )
        evaluated = ["evaluated"] if self.evaluated else []
        return " ".join([described, *condition_words(self.only_if), *evaluated])


@one_line_frozen
class Copy:
    """A hard target update (DQN's): each of the target's trainable variables becomes
    the source's variable at the same place (paired in order, shapes checked at bind).
    The name defaults to the target's."""

    source: str = attrs.field(validator=_selector)
    target: str = attrs.field(validator=_selector)
    name: str = attrs.field(default=None)
    every: int = attrs.field(default=1, validator=_positive)
    only_if: str | Callable | None = attrs.field(default=None, validator=check_condition)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "name", _name_of(self, self.target.partition(":")[0]))

    @property
    def writes(self) -> tuple[str, ...]:
        return (self.target,)

    def describe(self) -> str:
        described = f"{self.name}: Copy source={self.source} target={self.target}"
        return " ".join([f"{described} every={self.every}", *condition_words(self.only_if)])


@one_line_frozen
class Act:
    """Acting or collecting inside the training step: ``fn(models, batch)`` with every
    model in inference mode, writing recipe state (``models.state``: an environment
    stepped, a replay buffer filled); returns nothing. Validation, evaluation and
    binding never run it. Under a distribution strategy it runs once per step for all
    replicas (one agent), in cross-replica context, on the global batch, and the recipe
    state it writes is then mirrored to every replica (``replicas.once_per_step``).
    Assigning a model variable is refused at bind (its function is traced once): use an
    ``Update`` with ``writes=``. ``name`` defaults to the function's name (a lambda needs
    ``name=``); ``every`` selects steps as ``Update``'s does (0, N, 2N, ...)."""

    fn: Callable = attrs.field(validator=_takes("models", "batch"))
    name: str = attrs.field(default=None)
    every: int = attrs.field(default=1, validator=_positive)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "name", _name_of(self, self.fn))

    def describe(self) -> str:
        return f"{self.name}: act fn={qualname(self.fn)} every={self.every}"


#: The update entries (they write model variables); ``Act`` writes recipe state only.
UpdateEntry = Update | EMA | Copy
NonGradient = Update | EMA | Copy | Act
