"""An environment checked before a run's first step (``Environment.check``): its methods
traced once, without AutoGraph, as a recipe's step and greedy roll-out trace them, on
its declared sizes and ``initial_state()``'s dtypes and shapes, and what they return
compared with what the recipes keep and feed their models. Nothing runs: the ops are
made in a graph of their own, then dropped (no variable, generator or name of the run's
is touched).

A mismatch is a ``ConfigError`` naming the environment (its name and class), the method,
what was expected and what was found; an exception the method raises is a
``UserCodeError`` caused by it, at the environment's own line; a Python branch on a
tensor, a ``ConfigError`` saying to write it with ``tf.where`` or ``tf.cond``.
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Callable, Mapping

import tensorflow as tf

from beatloop.core.failures.errors import BeatloopError, ConfigError, UserCodeError

_SIZES = ("observation_size", "action_count", "horizon")
_STATE_RULE = (
    "a state keeps initial_state()'s keys, dtypes and shapes (the recipes keep it in "
    "variables made from initial_state() and assign them what reset and step return)"
)


def check_environment(env, copies: int | None = None) -> None:
    """Refuse ``env`` when its sizes are not positive integers or its single-copy
    methods (``reset``, ``observe``, ``step``; with ``copies``, the batched ones on that
    many copies too) do not fit them."""
    who = f"environment {env.name!r} ({type(env).__module__}.{type(env).__qualname__})"
    for size in _SIZES:
        value = _called(env, who, size, lambda size=size: getattr(env, size))
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{who}: {size} is {value!r}; expected a positive integer")
    first = _first_state(env, who)
    with tf.Graph().as_default():  # symbolic, and apart from the run's graphs
        random = tf.random.Generator.from_seed(0)
        _check_single(env, who, first, random)
        if copies is not None:
            _check_batched(env, who, first, random, copies)


def _first_state(env, who: str) -> dict[str, tf.Tensor]:
    """``initial_state()``, called eagerly as the recipes call it: a dict of tensors."""
    found = _called(env, who, "initial_state()", env.initial_state)
    if not isinstance(found, Mapping) or not all(isinstance(key, str) for key in found):
        raise ConfigError(
            f"{who}: initial_state() returns {_kind(found)}; expected a dict of name -> tensor"
        )
    state = {}
    for key, value in found.items():
        try:
            state[key] = tf.convert_to_tensor(value)
        except (TypeError, ValueError) as error:
            raise ConfigError(
                f"{who}: initial_state() gives {key!r} {_kind(value)}, which is no tensor"
            ) from error
    return state


def _check_single(env, who: str, first: dict, random) -> None:
    """``reset``, ``observe`` and ``step`` of one copy, as ``dqn`` steps it and both
    recipes' greedy roll-outs do."""
    state = {key: _placeholder(value.dtype, value.shape) for key, value in first.items()}
    start = _called(env, who, "reset(random)", env.reset, random)
    _check_state(who, "reset(random)", start, first)
    method = "observe(state)"
    observation = _called(env, who, method, env.observe, state)
    size = [env.observation_size]
    _check_tensor(who, method, "an observation", observation, tf.float32, size,
                  f"a float32 vector of observation_size {env.observation_size}, shape "
                  f"{tuple(size)}")  # fmt: skip
    action = _placeholder(tf.int32, [])
    method = "step(state, action, random)"
    moved = _called(env, who, method, env.step, state, action, random)
    after, reward, terminal = _move(who, method, moved)
    _check_state(who, method, after, first)
    _check_tensor(who, method, "a reward", reward, tf.float32, [], "a float32 scalar, shape ()")
    _check_tensor(who, method, "a terminal flag", terminal, tf.bool, [], "a bool scalar, shape ()")


def _check_batched(env, who: str, first: dict, random, copies: int) -> None:
    """``reset_batch``, ``observe_batch`` and ``step_batch`` of ``copies`` copies, as
    ``ppo`` steps them."""
    state = {k: _placeholder(v.dtype, [copies, *v.shape]) for k, v in first.items()}
    method = f"reset_batch(random, {copies})"
    start = _called(env, who, method, env.reset_batch, random, copies)
    _check_state(who, method, start, first, copies)
    method = "observe_batch(state)"
    observation = _called(env, who, method, env.observe_batch, state)
    shape = [copies, env.observation_size]
    _check_tensor(who, method, "observations", observation, tf.float32, shape,
                  f"float32 vectors of observation_size {env.observation_size}, one per "
                  f"copy: shape {tuple(shape)}")  # fmt: skip
    action = _placeholder(tf.int32, [copies])
    method = "step_batch(state, action, random)"
    moved = _called(env, who, method, env.step_batch, state, action, random)
    after, reward, terminal = _move(who, method, moved)
    _check_state(who, method, after, first, copies)
    each = f"one per copy: shape ({copies},)"
    _check_tensor(who, method, "rewards", reward, tf.float32, [copies], f"float32, {each}")
    _check_tensor(who, method, "terminal flags", terminal, tf.bool, [copies], f"bool, {each}")


def _called(env, who: str, method: str, fn: Callable, *args):
    """``fn(*args)``; what it raises said as the environment's ``method`` failing."""
    try:
        return fn(*args)
    except BeatloopError:
        raise
    except tf.errors.OperatorNotAllowedInGraphError as error:
        said = str(error).split(". ")[0]
        at = _own_line(env, error)
        raise ConfigError(
            f"{who}: {method} uses a tensor in Python control flow ({said}): environments are "
            "traced without AutoGraph, so an if, while, and/or or for on a tensor's value "
            "cannot work; write it with tf.where or tf.cond (a loop: tf.while_loop)"
            + (f"\n  at {at}" if at else "")
        ) from error
    except Exception as error:
        raise UserCodeError(f"{who}: {method}", error, at=_own_line(env, error)) from error


def _move(who: str, method: str, moved) -> tuple:
    """``(next_state, reward, terminal)`` of a step, or a ConfigError."""
    if not isinstance(moved, tuple | list) or len(moved) != 3:
        raise ConfigError(
            f"{who}: {method} returns {_kind(moved)}; expected (next_state, reward, terminal)"
        )
    return tuple(moved)


def _check_state(who: str, method: str, found, first: dict, copies: int | None = None) -> None:
    """``found`` has ``first``'s keys, dtypes and shapes (each after ``copies``)."""
    if not isinstance(found, Mapping) or set(found) != set(first):
        keys = sorted(found) if isinstance(found, Mapping) else None
        what = f"a state with keys {keys}" if keys is not None else _kind(found)
        raise ConfigError(
            f"{who}: {method} returns {what}; expected the keys of initial_state(), "
            f"{sorted(first)}: {_STATE_RULE}"
        )
    lead = [] if copies is None else [copies]
    for key, value in first.items():
        shape = [*lead, *value.shape]
        rule = f"{value.dtype.name} of shape {tuple(shape)}, as initial_state() gives it: "
        _check_tensor(who, method, f"state[{key!r}]", found[key], value.dtype, shape,
                      rule + _STATE_RULE, exact=True)  # fmt: skip


def _check_tensor(
    who: str, method: str, what: str, value, dtype, shape, rule: str, exact: bool = False
) -> None:
    """``value`` is a tensor of ``dtype`` and ``shape`` (an unknown dimension passes
    unless ``exact``: a state's shapes must not change in a loop)."""
    try:
        value = tf.convert_to_tensor(value, dtype_hint=dtype)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{who}: {method} returns {what} that is {_kind(value)}") from error
    found = value.shape
    fits = found.rank == len(shape) and all(
        (f is None and not exact) or f == e for f, e in zip(found.as_list(), shape, strict=True)
    )
    if value.dtype == dtype and fits:
        return
    cast = f" (tf.cast it to {tf.as_dtype(dtype).name})" if value.dtype != dtype else ""
    raise ConfigError(
        f"{who}: {method} returns {what} of {value.dtype.name}, shape {_shape(found)}; "
        f"expected {rule}{cast}"
    )


def _placeholder(dtype, shape) -> tf.Tensor:
    return tf.compat.v1.placeholder(dtype, shape)


def _shape(shape: tf.TensorShape) -> str:
    return "unknown" if shape.rank is None else str(tuple(shape.as_list()))


def _kind(value) -> str:
    return f"a {type(value).__name__}"


def _own_line(env, error: BaseException) -> str:
    """``file:line in function: code`` of the innermost frame of ``error`` in the files
    of the environment's own classes (not beatloop's base class), or ``""``."""
    core = os.path.normcase(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = set()
    for cls in type(env).__mro__:
        try:
            files.add(os.path.normcase(os.path.abspath(inspect.getsourcefile(cls) or "")))
        except TypeError:  # a built-in class (object)
            continue
    files = {path for path in files if not path.startswith(core + os.sep)}
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if os.path.normcase(os.path.abspath(frame.filename)) in files:
            code = f": {frame.line.strip()}" if frame.line else ""
            return f"{frame.filename}:{frame.lineno} in {frame.name}{code}"
    return ""
