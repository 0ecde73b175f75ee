"""``only_if=`` in the compiled step: a condition bound to what it names, asked at its
entry's turn, agreed by every replica; and updates applied only while it holds.

One device runs the update inside ``tf.cond``: a false condition costs nothing. Under a
strategy of several replicas TensorFlow refuses the optimizer's sum over replicas inside
a conditional, so the update runs and is then undone where the condition is false: the
variables it may change (the entry's and its optimizers') are read before it and chosen
back with ``tf.where``, which keeps the old bits exactly (``apply_when``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs
import tensorflow as tf

from beatloop.core.compiled.forward import ModelCalls
from beatloop.core.compiled.user_code import call_user
from beatloop.core.failures.errors import ScheduleError, UserCodeError
from beatloop.core.schedule.conditions import EXPECTED, condition_arity, condition_name


@attrs.frozen
class Condition:
    """A bound ``only_if``: the function ``fn`` asked with ``arity`` arguments (3: the
    entry's loss too; 4: and its gradients), or ``after``, the name of the gradient
    entry whose update in this step it follows (an update's condition); ``shown`` is
    how errors name it; ``kind`` and ``entry`` the entry it gates (``beat``, ``rebuild``)."""

    shown: str
    fn: Callable | None = None
    arity: int = 2
    after: str | None = None
    kind: str = "beat"
    entry: str = ""

    @property
    def named(self) -> str:
        """The condition and its entry, as messages name them."""
        return f"condition {self.shown!r} of {self.kind} {self.entry!r}"


def bind_condition(
    entry, methods: Mapping[str, Callable], problems: list[str], entries: Sequence[str] = ()
) -> Condition | None:
    """``entry.only_if`` bound: a recipe method by name, or (for an update or EMA, whose
    ``entries`` are the schedule's beats and groups) the name of an entry it follows;
    problems noted."""
    only_if = getattr(entry, "only_if", None)
    if only_if is None:
        return None
    kind = type(entry).__name__
    where = f"{kind} {entry.name!r}: only_if={condition_name(only_if)}"
    owner = {"kind": kind.lower() if kind in ("Beat", "Group") else kind, "entry": entry.name}
    if isinstance(only_if, str) and only_if in entries:
        return Condition(only_if, after=only_if, **owner)
    if isinstance(only_if, str):
        if only_if not in methods:
            named = f"the name of a beat or group ({', '.join(entries)}) or " if entries else ""
            problems.append(f"{where} names no method of the recipe: give {named}{EXPECTED}")
            return None
        fn = methods[only_if]
    else:
        fn = only_if
    arity = condition_arity(fn) or 2
    if entries and arity > 2:
        problems.append(
            f"{where} takes a loss, but an update has none: give fn(models, batch), or the "
            "name of the beat it follows"
        )
    return Condition(condition_name(only_if), fn, arity, **owner)


def holds(
    condition: Condition, models, batch, *, random, state, loss, gradients=None, gathering=None
):
    """Whether ``condition`` holds now, as one boolean for every replica: asked on each
    replica (``loss`` and ``gradients`` are the global batch's, equal on all), it holds
    when it holds on all of them."""
    calls = ModelCalls(models, frozenset(), random, batch, state, gathering)
    args = (calls, batch, loss, gradients)[: condition.arity]
    value = _asked(condition, args)
    value = _checked(value, condition)
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    refusals = context.all_reduce(tf.distribute.ReduceOp.SUM, 1 - tf.cast(value, tf.int32))
    return tf.equal(refusals, 0)


def _asked(condition: Condition, args: tuple):
    """The condition's function called; an error in it names the condition and its
    entry. A tensor turned into a Python bool (``bool(loss > 0.05)``), which a traced
    step cannot do, is a ScheduleError saying to return the tensor (found when the step
    is traced, before the run trains)."""
    what, beat = "condition", condition.entry
    if condition.kind != "beat":
        what, beat = f"{condition.kind} {condition.entry!r}: condition", None
    try:
        return call_user(condition.fn, what, beat, *args)
    except UserCodeError as error:
        if not isinstance(error.original, tf.errors.OperatorNotAllowedInGraphError):
            raise
        refused = ScheduleError(
            [
                f"{condition.named} uses a tensor as a Python bool (bool(...) or an if/and/or "
                "AutoGraph could not convert); return the tensor itself, e.g. "
                "`return loss > 0.05`, combined with tf.logical_and/tf.logical_or"
            ]
        )
        refused.original = error.original  # its cause, which a re-raise from None drops
        raise refused from error.original


def _checked(value, condition: Condition) -> tf.Tensor:
    """A condition's value as a scalar boolean tensor, else a ScheduleError (when traced):
    a number (an integer 0 or 1 too, as a float) is refused: a condition is a boolean."""
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError):
        tensor = None
    if tensor is None or tensor.shape.rank not in (0, None) or not tensor.dtype.is_bool:
        dtype = getattr(value, "dtype", None) if tensor is None else tensor.dtype
        found = type(value).__name__ if dtype is None else tf.as_dtype(dtype).name
        shape = getattr(tensor, "shape", None)
        raise ScheduleError(
            [
                f"{condition.named} returned {found}"
                + (f" of shape {tuple(shape)}" if shape is not None and shape.rank else "")
                + "; it must return a scalar boolean tensor (e.g. tf.reduce_mean(kl) < 0.02, "
                "or tf.cast(x, tf.bool) for a number)"
            ]
        )
    return tensor


def global_gradients(grads, scale) -> list:
    """A beat's gradients as a condition sees them: the global batch's (summed over
    replicas) and true (unscaled, under loss scaling)."""
    context = tf.distribute.get_replica_context()
    grads = [tf.convert_to_tensor(g) for g in grads]
    if context is not None and context.num_replicas_in_sync > 1:
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
    if scale is None:
        return list(grads)
    return [g / tf.cast(scale, g.dtype) for g in grads]


def global_loss(loss: tf.Tensor, weight) -> tf.Tensor:
    """The loss a condition sees: the global batch's (replicas' losses weighted by their
    shares, summed), the loss itself on one device."""
    context = tf.distribute.get_replica_context()
    if weight is None or context is None or context.num_replicas_in_sync == 1:
        return loss
    share = tf.math.multiply_no_nan(loss, tf.cast(weight, loss.dtype))
    return context.all_reduce(tf.distribute.ReduceOp.SUM, share)


def apply_when(holds_now: tf.Tensor, apply: Callable[[], None], guarded: Sequence) -> tf.Tensor:
    """Run ``apply`` (updates of the ``guarded`` variables) only where ``holds_now``;
    returns ``holds_now``. See the module's docstring for the two ways."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:

        def run():
            apply()
            return tf.constant(True)

        return tf.cond(holds_now, run, lambda: tf.constant(False))
    before = [tf.identity(_value(v)) for v in guarded]
    with tf.control_dependencies(before):
        apply()
    for variable, old in zip(guarded, before, strict=True):
        variable.assign(tf.where(holds_now, _value(variable), old))
    return holds_now


def _value(variable) -> tf.Tensor:
    """A Keras or TensorFlow variable's current value."""
    return tf.convert_to_tensor(variable)


def guarded_variables(beats) -> list:
    """What an update of ``beats`` may change: their variables and every variable of
    their optimizers (slots, iterations, a loss scale), each once."""
    seen: dict[int, object] = {}
    for beat in beats:
        for variable in (*beat.variables, *beat.optimizer.variables):
            seen.setdefault(id(variable), variable)
    return list(seen.values())


def counted(flag: tf.Tensor) -> tf.Tensor:
    """1.0 for an update that happened, counted once over replicas (metrics sum them)."""
    one = tf.cast(flag, tf.float32)
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return one
    return tf.where(tf.equal(context.replica_id_in_sync_group, 0), one, tf.zeros_like(one))
