"""Gradient transforms and combinations: what a beat or a group does to its gradients
before the update, as callables the user may write.

A **transform** is ``fn(gradients, variables) -> gradients`` for one beat (lists aligned
with the beat's variables); the built-in clips are transforms. A **combination** is
``fn(gradients, variables) -> gradients`` for a group: ``variables`` are the variables
two or more of its beats update, ``gradients[i][j]`` beat ``i``'s gradient of variable
``j``, and it returns one gradient per variable. Both see true (unscaled) gradients under
loss scaling. ``PCGrad`` is the built-in combination. Nothing here is bound to a run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Literal

import attrs
import tensorflow as tf

from beatloop.core.failures.errors import ConfigError, ScheduleError
from beatloop.core.failures.fields import one_line_frozen

SIGNATURE = "fn(gradients, variables) -> gradients"


def _positive_float(instance, attribute, value) -> None:
    """A clip's bound: a number above zero, else a ConfigError saying so."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(
            f"{type(instance).__name__}({attribute.name}=...) takes a number above 0; got {value!r}"
        )


def _reduction(instance, attribute, value) -> None:
    """A combination's reduction: one it knows, else a ConfigError naming them."""
    if value not in ("sum", "mean"):
        raise ConfigError(
            f"{type(instance).__name__}(reduction=...) takes 'sum' or 'mean'; got {value!r}"
        )


# --- checking a user's callable ---------------------------------------------------------


def signature_problem(fn) -> str | None:
    """Why ``fn`` cannot be called as ``fn(gradients, variables)``, or ``None`` if it can
    (or its signature cannot be read, as for some C functions)."""
    if not callable(fn):
        return "which is not callable"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind([], [])
    except TypeError:
        if inspect.isclass(fn):
            return f"a class, not an instance: pass one, e.g. {fn.__qualname__}(...)"
        return f"whose signature {signature} cannot take two positional arguments"
    return None


def shown(fn) -> str:
    """How ``describe()`` and errors name a transform or combination: a built-in by its
    ``describe()``, a function or class by its ``__qualname__``, anything else by repr."""
    name = getattr(fn, "__qualname__", None)
    if isinstance(name, str):
        return name
    return repr(fn)


def check_gradient_fn(fn, field: str, where: str, example: str) -> None:
    """Refuse a ``field=`` value of ``where`` (a beat or group) that is not a
    ``fn(gradients, variables) -> gradients`` callable, naming what it got."""
    if fn is None:
        return
    problem = signature_problem(fn)
    if problem is not None:
        got = shown(fn) if callable(fn) else f"{fn!r} (a {type(fn).__name__})"
        raise ScheduleError(
            [
                f"{where}: {field}= must be a callable {SIGNATURE} (e.g. {example}); "
                f"got {got}, {problem}"
            ]
        )


def described(fn) -> str:
    """A transform or combination in ``describe()``'s words: its own ``describe()`` for
    a built-in, else its name."""
    describe = getattr(fn, "describe", None)
    return describe() if callable(describe) and not inspect.isclass(fn) else shown(fn)


# --- built-in transforms ---------------------------------------------------------------


@one_line_frozen
class ClipByGlobalNorm:
    """Scale all of a beat's gradients together so their global norm is at most ``norm``."""

    norm: float = attrs.field(validator=_positive_float)

    def __call__(self, grads: list[tf.Tensor], variables=None) -> list[tf.Tensor]:
        clipped, _ = tf.clip_by_global_norm(grads, self.norm)
        return list(clipped)

    def describe(self) -> str:
        return f"clip by global norm {self.norm:g}"


@one_line_frozen
class ClipByNorm:
    """Clip each gradient tensor separately to an L2 norm of at most ``norm``."""

    norm: float = attrs.field(validator=_positive_float)

    def __call__(self, grads: list[tf.Tensor], variables=None) -> list[tf.Tensor]:
        return [tf.clip_by_norm(g, self.norm) for g in grads]

    def describe(self) -> str:
        return f"clip each tensor to norm {self.norm:g}"


@one_line_frozen
class ClipByValue:
    """Clip every gradient element into ``[-value, value]``."""

    value: float = attrs.field(validator=_positive_float)

    def __call__(self, grads: list[tf.Tensor], variables=None) -> list[tf.Tensor]:
        return [tf.clip_by_value(g, -self.value, self.value) for g in grads]

    def describe(self) -> str:
        return f"clip values to ±{self.value:g}"


GradientTransform = Callable[[list, list], list]


# --- built-in combinations -------------------------------------------------------------


@one_line_frozen
class PCGrad:
    """Gradient surgery (Yu et al., "Gradient Surgery for Multi-Task Learning", NeurIPS
    2020): each task's gradient, flattened over the shared variables, is projected onto
    the normal plane of every other task's gradient it conflicts with, then the projected
    gradients are summed (``reduction="sum"``) or averaged (``"mean"``).

    The paper visits the other tasks in a random order; here task ``i`` visits the
    others in index order (0, 1, ..., skipping ``i``), so a run is deterministic. Each
    projection tests and uses the gradient projected so far against the *original*
    ``g_j``: if ``g_i . g_j < 0``, ``g_i <- g_i - (g_i . g_j) / |g_j|^2 g_j``.
    """

    reduction: Literal["sum", "mean"] = attrs.field(default="sum", validator=_reduction)

    def __call__(self, gradients: list[list[tf.Tensor]], variables=None) -> list[tf.Tensor]:
        flat = [tf.concat([tf.reshape(g, [-1]) for g in task], axis=0) for task in gradients]
        projected = [self._projected(i, flat) for i in range(len(flat))]
        total = tf.add_n(projected)
        if self.reduction == "mean":
            total = total / tf.cast(len(projected), total.dtype)
        shapes = [g.shape for g in gradients[0]]  # a variable's gradient has its static shape
        pieces = tf.split(total, [shape.num_elements() for shape in shapes], axis=0)
        return [tf.reshape(p, shape) for p, shape in zip(pieces, shapes, strict=True)]

    @staticmethod
    def _projected(i: int, flat: list[tf.Tensor]) -> tf.Tensor:
        """Task ``i``'s gradient with its conflicts with the other tasks projected away."""
        g = flat[i]
        for j, other in enumerate(flat):
            if j == i:
                continue
            dot = tf.reduce_sum(g * other)
            step = tf.math.divide_no_nan(dot, tf.reduce_sum(other * other)) * other
            g = tf.where(dot < 0, g - step, g)
        return g

    def describe(self) -> str:
        return "PCGrad" if self.reduction == "sum" else f"PCGrad(reduction={self.reduction})"


#: The built-in transforms and combinations, called as they are (no AutoGraph, no
#: user-code wrapping).
BUILT_IN = (ClipByGlobalNorm, ClipByNorm, ClipByValue, PCGrad)
