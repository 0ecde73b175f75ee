"""Beats and schedules: what one training step does, as printable, comparable data.

A ``Beat`` is one gradient update (a loss, the optimizer that applies it, the
variables it updates); a ``Group`` is beats whose gradients all come from one
forward computation and one state; a ``Schedule`` is the ordered entries of one
step (beats, groups, and the updates and acts of ``beatloop.core.schedule.updates``) plus the
variables declared frozen or shared. None holds a TensorFlow
object: binding them to built models is ``beatloop.core.compiled.binding``'s job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Literal

import attrs
import tensorflow as tf

from beatloop.core.failures.errors import ScheduleError
from beatloop.core.failures.fields import FieldError, one_line_frozen
from beatloop.core.schedule.conditions import check_condition, condition_words
from beatloop.core.schedule.rhythm import check_rhythm
from beatloop.core.schedule.transforms import (  # noqa: F401  (the built-in transforms' old home)
    ClipByGlobalNorm,
    ClipByNorm,
    ClipByValue,
    GradientTransform,
    check_gradient_fn,
    described,
)
from beatloop.core.schedule.updates import Act, NonGradient, UpdateEntry

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _as_tuple(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """Accept one selector or several; a lone string is one selector, not its letters."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _identifier(instance, attribute, value) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise FieldError(
            type(instance).__name__,
            attribute.name,
            f" takes a Python-style name (letters, digits, underscores), got {value!r}",
        )


def _selectors(instance, attribute, value) -> None:
    for selector in value:
        if not isinstance(selector, str) or not selector:
            raise FieldError(
                type(instance).__name__,
                attribute.name,
                f" holds selectors like 'model' or 'model:dense/*', got {selector!r}",
            )


_positive_int = [attrs.validators.instance_of(int), attrs.validators.ge(1)]
_positive_float = [attrs.validators.instance_of((int, float)), attrs.validators.gt(0)]


# --- post-update constraints ---------------------------------------------------------


@one_line_frozen
class ClipValues:
    """After each update, clip the beat's variables into ``[low, high]`` (e.g. pixels
    into [0, 1] when the variable being trained is an image)."""

    low: float = attrs.field(validator=attrs.validators.instance_of((int, float)))
    high: float = attrs.field(validator=attrs.validators.instance_of((int, float)))

    def __attrs_post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"ClipValues needs low < high, got {self.low} and {self.high}")

    def __call__(self, value: tf.Tensor) -> tf.Tensor:
        return tf.clip_by_value(value, self.low, self.high)

    def describe(self) -> str:
        return f"clip values into [{self.low:g}, {self.high:g}] after each update"


Constraint = ClipValues


# --- beats and schedules -------------------------------------------------------------


@one_line_frozen
class Beat:
    """One gradient update of a training step.

    ``updates`` selects the variables the beat's optimizer applies to: ``"model"`` takes
    every trainable variable of that model, ``"model:pattern"`` those whose Keras variable
    path matches the glob ``pattern`` (e.g. ``"backbone:dense_1/*"``). ``training`` names
    the models that run in training mode during the beat; ``None`` means the models the
    beat updates. ``repeat`` runs the beat several times per step on the same batch;
    ``every`` runs it only on steps whose number is a multiple of ``every``: steps 0, N,
    2N, ..., counted from 0 over the whole run (across epochs and resumes).
    ``transform`` changes the gradients before the update: any callable
    ``fn(gradients, variables) -> gradients`` (lists aligned with the beat's variables;
    true gradients under loss scaling), e.g. ``ClipByNorm(1.0)``; ``constraint`` maps
    the updated variables after it. ``log`` chooses the figure logged under the beat's name:
    ``"mean"`` (its loss averaged over the epoch's steps and repeats, weighted by batch
    size, as Keras's loss tracker) or ``"last"`` (the last step's last repeat).
    ``only_if`` (a recipe method's name or a function ``fn(models, batch)``,
    ``fn(models, batch, loss)`` or ``fn(models, batch, loss, gradients)``, its gradients
    aligned with its variables, returning a scalar boolean) is asked at the beat's turn,
    after its loss and gradients: when false nothing changes (no update, no optimizer
    step). ``accumulate=N`` sums the gradients of N turns (weighted by their batch sizes)
    and applies them once, as one update on the N batches together (docs/schedules.md).
    """

    loss: str = attrs.field(validator=_identifier)
    optimizer: str = attrs.field(validator=_identifier)
    updates: tuple[str, ...] = attrs.field(converter=_as_tuple, validator=_selectors)
    name: str = attrs.field(default=None)
    repeat: int = attrs.field(default=1, validator=_positive_int)
    every: int = attrs.field(default=1, validator=_positive_int)
    transform: GradientTransform | None = attrs.field(default=None)
    training: tuple[str, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(_as_tuple)
    )
    constraint: Constraint | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(ClipValues))
    )
    log: Literal["mean", "last"] = attrs.field(
        default="mean", validator=attrs.validators.in_(("mean", "last"))
    )
    only_if: str | Callable | None = attrs.field(default=None, validator=check_condition)
    accumulate: int = attrs.field(default=1, validator=_positive_int)

    def __attrs_post_init__(self) -> None:
        if self.name is None:
            object.__setattr__(self, "name", self.loss)
        _identifier(self, attrs.fields(Beat).name, self.name)
        if not self.updates:
            raise FieldError("Beat", "updates", f": beat {self.name!r} updates no variables")
        check_rhythm(self, "beat")
        example = "beatloop.ClipByNorm(1.0)"
        check_gradient_fn(self.transform, "transform", f"beat {self.name!r}", example)

    def describe(self) -> str:
        """One line: name, loss, optimizer, what it updates and how often."""
        parts = [
            f"{self.name}: loss={self.loss} optimizer={self.optimizer}",
            f"updates={','.join(self.updates)}",
        ]
        parts += _rhythm(self.repeat, self.every, self.only_if, self.accumulate)
        if self.transform is not None:
            parts.append(_transform_words(self.transform))
        parts += _modes(self.training)
        if self.constraint is not None:
            parts.append(f"constraint=({self.constraint.describe()})")
        if self.log != "mean":
            parts.append(f"log={self.log}")
        return " ".join(parts)


def _transform_words(transform) -> str:
    """``transform=(clip ...)`` for a built-in, ``transform=name`` for the user's own."""
    if callable(getattr(transform, "describe", None)):
        return f"transform=({transform.describe()})"
    return f"transform={described(transform)}"


def _rhythm(repeat: int, every: int, only_if=None, accumulate: int = 1) -> list[str]:
    """How often a beat or group runs and updates, in ``describe()``'s words (nothing if
    once a step, unconditionally)."""
    counts = (("repeat", repeat), ("every", every))
    words = [f"{n}={v}" for n, v in counts if v != 1] + condition_words(only_if)
    return words + ([f"accumulate={accumulate}"] if accumulate != 1 else [])


def _modes(training: tuple[str, ...] | None) -> list[str]:
    """The models a beat or group runs in training mode, if it names them."""
    return [] if training is None else [f"training={','.join(training) or '(none)'}"]


def _grouped_beats(instance, attribute, value) -> None:
    if not value:
        raise ValueError("a group needs at least one beat")
    for beat in value:
        if not isinstance(beat, Beat):
            raise TypeError(f"a group holds Beat values, got {type(beat).__name__}")
        per_beat = [f for f in ("repeat", "every", "accumulate") if getattr(beat, f) != 1]
        per_beat += [f for f in ("training", "only_if") if getattr(beat, f) is not None]
        if per_beat:
            raise ValueError(
                f"beat {beat.name!r} sets {', '.join(per_beat)}, but in a group the beats "
                "share one forward: set them on the Group instead"
            )


@one_line_frozen
class Group:
    """Beats updated *simultaneously*: one forward computation, every beat's gradients
    taken from the same state, then each beat's optimizer applies its own.

    ``forward`` names a function of the recipe's ``forwards()``: it takes
    ``(models, batch)`` and returns the outputs (a dict) that each beat's loss then takes
    as ``(outputs, batch)``. ``training``, ``repeat`` and ``every`` work as on a
    ``Beat``, for the whole group: ``training=None`` runs the models any of its
    beats update in training mode; ``repeat`` runs forward, gradients and updates again;
    ``every=N`` runs the group on steps 0, N, 2N, ... of the run; ``only_if`` and
    ``accumulate`` gate and combine the updates of all its beats (its condition's
    ``loss`` is a dict of its beats' losses by name).

    ``combine``, a callable ``fn(gradients, variables) -> gradients`` (e.g. ``PCGrad()``),
    turns the beats' gradients of the variables two or more of them update into one
    gradient each: ``variables`` in the order of the first beat updating each,
    ``gradients[i][j]`` beat ``i``'s gradient of variable ``j``. The beats must then share
    one optimizer, which applies everything in one update.
    """

    forward: str = attrs.field(validator=_identifier)
    beats: tuple[Beat, ...] = attrs.field(converter=tuple, validator=_grouped_beats)
    name: str = attrs.field(default=None)
    repeat: int = attrs.field(default=1, validator=_positive_int)
    every: int = attrs.field(default=1, validator=_positive_int)
    training: tuple[str, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(_as_tuple)
    )
    combine: GradientTransform | None = attrs.field(default=None)
    only_if: str | Callable | None = attrs.field(default=None, validator=check_condition)
    accumulate: int = attrs.field(default=1, validator=_positive_int)

    def __attrs_post_init__(self) -> None:
        if self.name is None:
            object.__setattr__(self, "name", self.forward)
        _identifier(self, attrs.fields(Group).name, self.name)
        check_rhythm(self, "group")
        check_gradient_fn(self.combine, "combine", f"group {self.name!r}", "beatloop.PCGrad()")

    def describe(self) -> str:
        """One line: the group, its forward, then each beat in brackets."""
        parts = [f"{self.name}: simultaneous forward={self.forward}"]
        rhythm = _rhythm(self.repeat, self.every, self.only_if, self.accumulate)
        parts += [*rhythm, *_modes(self.training)]
        if self.combine is not None:
            parts.append(f"combine={described(self.combine)}")
        parts.extend(f"[{beat.describe()}]" for beat in self.beats)
        return " ".join(parts)


Step = Beat | Group
#: What a schedule holds, in step order.
Entry = Beat | Group | NonGradient


def _entries(value) -> tuple[Entry, ...]:
    return (value,) if isinstance(value, Entry) else tuple(value)


def _flat(entries) -> tuple[Beat, ...]:
    """The beats of ``entries``, those in groups included (updates and acts left out)."""
    return tuple(
        b
        for e in entries
        if isinstance(e, Beat | Group)
        for b in (e.beats if isinstance(e, Group) else (e,))
    )


@one_line_frozen
class Schedule:
    """The ordered entries of one training step (beats, groups of beats, updates such
    as ``EMA``, acts), and the variables frozen or shared. ``beats`` holds every entry.

    ``frozen`` selectors name trainable variables no beat may update (e.g. a fixed
    feature network); ``shared`` selectors name variables that several beats update on
    purpose (e.g. a multi-task backbone). Both use the selector syntax of ``Beat.updates``.
    """

    beats: tuple[Entry, ...] = attrs.field(converter=_entries)
    frozen: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple, validator=_selectors)
    shared: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple, validator=_selectors)

    @beats.validator
    def _check_beats(self, attribute, value) -> None:
        if not any(isinstance(entry, Beat | Group) for entry in value):
            raise ValueError("a schedule needs at least one beat")
        for entry in value:
            if not isinstance(entry, Entry):
                raise TypeError(
                    "a schedule holds Beat, Group, Update, EMA, Copy and Act values, got "
                    f"{type(entry).__name__}"
                )
        names = [b.name for b in _flat(value)]
        names += [e.name for e in value if not isinstance(e, Beat)]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ScheduleError(
                [
                    "beat, group, update and act names must be unique within a schedule; "
                    f"repeated: {', '.join(repeated)} (give each a distinct `name`)"
                ]
            )

    @property
    def all_beats(self) -> tuple[Beat, ...]:
        """Every beat in step order, those in groups included."""
        return _flat(self.beats)

    @property
    def loss_names(self) -> tuple[str, ...]:
        """Distinct loss names in beat order."""
        return tuple(dict.fromkeys(b.loss for b in self.all_beats))

    @property
    def groups(self) -> tuple[Group, ...]:
        """The schedule's groups, in step order."""
        return tuple(entry for entry in self.beats if isinstance(entry, Group))

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Every entry in step order: beats, groups, updates and acts."""
        return self.beats

    @property
    def updates(self) -> tuple[UpdateEntry, ...]:
        """The updates (``Update``, ``EMA``, ``Copy``), in step order."""
        return tuple(entry for entry in self.beats if isinstance(entry, UpdateEntry))

    @property
    def acts(self) -> tuple[Act, ...]:
        """The acts, in step order."""
        return tuple(entry for entry in self.beats if isinstance(entry, Act))

    def describe(self) -> str:
        """Multi-line text: one line per entry in step order, then frozen and shared
        selectors."""
        lines = [f"{i}. {beat.describe()}" for i, beat in enumerate(self.beats, 1)]
        if self.frozen:
            lines.append(f"frozen: {', '.join(self.frozen)}")
        if self.shared:
            lines.append(f"shared: {', '.join(self.shared)}")
        return "\n".join(lines)
