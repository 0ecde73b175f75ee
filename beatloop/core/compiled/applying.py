"""How an entry's gradients become updates: a beat's transform, its optimizer's
``apply`` and its constraint; a combining group's one update from its beats' combined
gradients; and the binding rules a combining group must meet.

Transforms and combinations see true gradients: under loss scaling they are unscaled
first and scaled back after (the scale is a power of two, so both are exact), and the
loss-scaling optimizer's own unscaling and overflow check still hold.

They also see the global batch's gradients: on several replicas each replica's
gradients (its loss weighted by its share) are summed over replicas first, as one device
would compute them; the optimizer then sums what every replica hands it, so the first
replica hands the transformed (or combined) gradient and the others zeros, and the sum is
that gradient exactly (``handed_once``). An optimizer that clips itself (``clipnorm``,
``global_clipnorm``, ``clipvalue``: Keras clips what each replica hands it, before the
sum) is handed the global gradients once too, so it clips them as on one device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import keras
import tensorflow as tf

from beatloop.core.compiled.user_code import call_user
from beatloop.core.failures.errors import ScheduleError
from beatloop.core.schedule.transforms import BUILT_IN, SIGNATURE, described, shown


def loss_scale(optimizer) -> tf.Variable | None:
    """The current loss scale of a loss-scaling optimizer, ``None`` for any other."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.dynamic_scale
    return None


def apply_update(beat, grads, *, summed: bool = False) -> None:
    """Transform a beat's gradients (the global batch's: see the module's docstring),
    apply them with its optimizer, then map the updated variables through its
    constraint. ``summed``: the gradients are already the global batch's on every
    replica (accumulated sums), handed to the optimizer once."""
    variables = list(beat.variables)
    if beat.transform is not None or summed or clips(beat.optimizer):
        context = replicated()
        if context is not None and not summed:
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, list(grads))
        if beat.transform is not None:
            grads = transformed(beat, grads, loss_scale(beat.optimizer))
        if context is not None:
            grads = handed_once(context, grads)
    beat.optimizer.apply(grads, variables)
    constrain(beat)


def clips(optimizer) -> bool:
    """Whether ``optimizer`` (or the one a loss-scaling optimizer wraps) clips the
    gradients it is handed (``clipnorm``, ``global_clipnorm`` or ``clipvalue``)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return any(getattr(inner, name, None) is not None for name in CLIPS)


#: A Keras optimizer's own clipping options.
CLIPS = ("clipnorm", "global_clipnorm", "clipvalue")


def apply_gradients(group, gradients: list[list], *, summed: bool = False) -> None:
    """An entry's update from its beats' gradients: one combined update, or each beat's
    own (``summed``: see ``apply_update``)."""
    if group.combine is not None:
        apply_combined(group, gradients, summed=summed)
        return
    for beat, grads in zip(group.beats, gradients, strict=True):
        apply_update(beat, grads, summed=summed)


def replicated() -> tf.distribute.ReplicaContext | None:
    """The replica context of a step on several replicas; ``None`` on one device (or
    under a strategy of one replica, where a replica's gradients are the batch's)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context


def handed_once(context: tf.distribute.ReplicaContext, grads: list) -> list:
    """What a replica hands its optimizer (which sums over replicas) when every replica
    holds the same global gradients: the first replica's, zeros from the others."""
    first = tf.equal(context.replica_id_in_sync_group, 0)

    def once(grad):
        if isinstance(grad, tf.IndexedSlices):  # an embedding's: kept sparse, as Keras takes it
            values = tf.where(first, grad.values, tf.zeros_like(grad.values))
            return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
        return tf.where(first, grad, tf.zeros_like(grad))

    return [once(grad) for grad in grads]


def constrain(beat) -> None:
    """Map a beat's variables through its constraint, if it has one."""
    if beat.constraint is not None:
        for variable in beat.variables:
            variable.assign(beat.constraint(variable))


def transformed(beat, grads, scale) -> list:
    """A beat's transform applied to its true gradients (see the module's docstring)."""
    if scale is None:
        return transform_of(beat, grads)
    true = [g / tf.cast(scale, g.dtype) for g in grads]
    return [g * tf.cast(scale, g.dtype) for g in transform_of(beat, true)]


def transform_of(beat, grads) -> list:
    """``beat.transform(grads, variables)``, its result checked: one gradient a variable."""
    result = _called(beat.transform, "gradient transform", beat.name, grads, beat.variables)
    where = f"beat {beat.name!r}: transform {shown(beat.transform)}"
    return checked(result, beat.variables, where)


def _called(fn: Callable, what: str, where: str, gradients, variables) -> list:
    """A built-in as it is; the user's own through ``call_user`` (errors name it)."""
    if isinstance(fn, BUILT_IN):
        return fn(gradients, list(variables))
    return call_user(fn, what, where, gradients, list(variables))


def checked(result, variables: Sequence, where: str) -> list:
    """``result`` as a list of one gradient per variable, each of its variable's shape,
    else a ScheduleError (at trace time, before a wrong shape reaches the optimizer)."""
    count = len(variables)
    if not isinstance(result, Sequence) or len(result) != count:
        found = f"{len(result)} item(s)" if isinstance(result, Sequence) else repr(result)
        raise ScheduleError(
            [
                f"{where} returned {found} for {count} variable(s); a {SIGNATURE} "
                "returns one gradient per variable, in the variables' order"
            ]
        )
    if any(g is None for g in result):
        raise ScheduleError([f"{where} returned None for a gradient; return a tensor for each"])
    wrong = [
        f"{where} returned a gradient of shape {_shape(grad)} for variable {variable.path!r} "
        f"of shape {tuple(variable.shape)}; return each gradient in its variable's shape, "
        "in the variables' order"
        for grad, variable in zip(result, variables, strict=True)
        if not _shape_fits(grad, variable)
    ]
    if wrong:
        raise ScheduleError(wrong)
    return list(result)


def _shape_fits(grad, variable) -> bool:
    """Whether ``grad``'s static shape can be ``variable``'s (an embedding's sparse
    gradient: its rows' shape)."""
    if isinstance(grad, tf.IndexedSlices):
        rows = tf.TensorShape(grad.values.shape)
        return rows.rank is None or rows[1:].is_compatible_with(variable.shape[1:])
    return tf.TensorShape(getattr(grad, "shape", None)).is_compatible_with(variable.shape)


def _shape(grad) -> str:
    """A gradient's static shape in words (``(unknown rank)`` when unknown)."""
    shape = tf.TensorShape(getattr(grad, "shape", None))
    return "(unknown rank)" if shape.rank is None else str(tuple(shape.as_list()))


# --- a combining group -------------------------------------------------------------------


def apply_combined(group, gradients: list[list], *, summed: bool = False) -> None:
    """A combining group's one update: each beat's (true, global) gradients through its
    transform, the combined variables' gradients through ``group.combine``, then one
    ``optimizer.apply`` over the union of the beats' variables (the combined ones with
    the combined gradient), then each beat's constraint. ``summed``: as ``apply_update``."""
    optimizer = group.beats[0].optimizer
    scale = loss_scale(optimizer)
    context = replicated()
    if context is not None and not summed:
        gradients = context.all_reduce(tf.distribute.ReduceOp.SUM, [list(g) for g in gradients])
    if scale is not None:
        gradients = [[g / tf.cast(scale, g.dtype) for g in grads] for grads in gradients]
    gradients = [
        grads if beat.transform is None else transform_of(beat, grads)
        for beat, grads in zip(group.beats, gradients, strict=True)
    ]
    combined = combined_gradients(group, gradients)
    union: dict[int, tuple] = {}
    for beat, grads in zip(group.beats, gradients, strict=True):
        for variable, grad in zip(beat.variables, grads, strict=True):
            union.setdefault(id(variable), (variable, combined.get(id(variable), grad)))
    variables = [variable for variable, _ in union.values()]
    grads = [grad for _, grad in union.values()]
    if scale is not None:
        grads = [g * tf.cast(scale, g.dtype) for g in grads]
    if context is not None:
        grads = handed_once(context, grads)
    optimizer.apply(grads, variables)
    for beat in group.beats:
        constrain(beat)


def combined_gradients(group, gradients: list[list]) -> dict[int, tf.Tensor]:
    """``group.combine`` on the combined variables: ``{id(variable): gradient}``. A beat
    that does not update one of them contributes zeros for it. (On several replicas the
    gradients are already the global batch's: ``apply_combined`` sums them first.)"""
    shared = group.combined_variables
    per_beat = []
    for beat, grads in zip(group.beats, gradients, strict=True):
        own = {id(v): g for v, g in zip(beat.variables, grads, strict=True)}
        per_beat.append([own.get(id(v), tf.zeros_like(v)) for v in shared])
    where = f"group {group.name!r}: combine {shown(group.combine)}"
    result = _called(group.combine, "gradient combination", group.name, per_beat, shared)
    result = checked(result, shared, where)
    return {id(v): g for v, g in zip(shared, result, strict=True)}


def combine_problems(group, resolved: Mapping[str, list]) -> list[str]:
    """A combining group's beats must share one optimizer (it applies the combined
    update once) and two or more of them must update some variable (what it combines)."""
    if group.combine is None:
        return []
    where = f"group {group.name!r} combines its beats' gradients"
    where += f" (combine={described(group.combine)})"
    problems = []
    optimizers = dict.fromkeys(beat.optimizer for beat in group.beats)
    if len(optimizers) > 1:
        uses = ", ".join(f"beat {b.name!r} uses {b.optimizer!r}" for b in group.beats)
        problems.append(
            f"{where} and applies them in one update, so its beats must use one optimizer; "
            f"{uses} (give them the same optimizer, or drop combine=)"
        )
    counts: dict[int, int] = {}
    for beat in group.beats:
        for key in {id(v) for v in resolved.get(beat.name, [])}:
            counts[key] = counts.get(key, 0) + 1
    if not any(count > 1 for count in counts.values()):
        problems.append(
            f"{where}, but no variable is updated by two or more of its beats: nothing to "
            "combine (let several beats update the shared variables, declared shared)"
        )
    return problems
