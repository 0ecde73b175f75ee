"""Running a recipe's own code (a loss, a metric update, a forward function) so that a
mistake in it is reported in it.

``call_user`` turns an exception raised inside such a function into a
``UserCodeError`` naming the function, the beat and the
recipe's own line that failed (traced by autograph or not), with the original exception
as its cause. beatloop's own errors, and TensorFlow's op errors (the data, found while
a step runs), pass through unchanged; the engine reports the latter as data errors.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping

import tensorflow as tf
from tensorflow.python.autograph.core import ag_ctx as autograph_ctx
from tensorflow.python.autograph.core import converter as autograph_converter
from tensorflow.python.autograph.impl import api as autograph_api

from beatloop.core.data.batches import batch_shapes
from beatloop.core.failures.errors import BeatloopError, MismatchFound, UserCodeError

#: Packages whose frames are never the recipe's own (besides beatloop's machinery and
#: the standard library).
LIBRARIES = ("tensorflow", "keras", "tf_keras", "numpy", "absl", "optree", "tree", "ml_dtypes")
_GENERATED = "__autograph_generated_file"


def call_user(fn: Callable, what: str, beat: str | None, *args):
    """``fn(*args)``; an exception from ``fn`` itself becomes a UserCodeError naming
    ``what`` it is (``"loss"``, ``"metric update"``, ``"forward"``), its name and ``beat``.

    When traced, ``fn`` runs converted by AutoGraph (its Python ``if``/``for`` on tensors
    become graph control flow), as if the compiled function calling it were converted:
    beatloop's own compiled functions are traced without AutoGraph (their control flow
    is explicit), so only the recipe's code pays for conversion. Eagerly (debug mode)
    ``fn`` runs as written.
    """
    try:
        if tf.inside_function():
            with autograph_ctx.ControlStatusCtx(autograph_ctx.Status.ENABLED, _USER_CODE):
                return autograph_api.converted_call(fn, args, None, options=_USER_CODE)
        return fn(*args)
    except Exception as error:
        raise reported(error, f"{what} {function_name(fn)!r}", beat)  # noqa: B904


def as_written(recipe, function: Callable) -> Callable:
    """``function`` (a recipe's loss, forward or metric update), marked to be traced
    without AutoGraph when the recipe says its code needs none (``autograph = False``)."""
    if getattr(recipe, "autograph", True):
        return function
    return tf.autograph.experimental.do_not_convert(function)


def recipe_functions(recipe, functions: Mapping[str, Callable]) -> dict[str, Callable]:
    """A recipe's losses or forwards by name, each ``as_written``."""
    return {name: as_written(recipe, function) for name, function in functions.items()}


#: How AutoGraph converts a recipe's function: as ``tf.function`` would convert the
#: functions its function calls (recursively, TensorFlow's and Keras's own code left as it
#: is; no optional features: Python lists stay lists).
_USER_CODE = autograph_converter.ConversionOptions(
    recursive=True, user_requested=False, internal_convert_user_code=True, optional_features=None
)


def reported(error: Exception, function: str, beat: str | None) -> Exception:
    """The exception to raise for ``error``: itself when it passes through, the data
    mismatch it carries (naming the recipe's line), else a UserCodeError caused by it
    (a failed eager ``tf.debugging`` assertion too: the recipe's own check)."""
    if isinstance(error, MismatchFound):
        mismatch = error.error.completed(at=user_frame(error))
        mismatch.__suppress_context__ = True
        return mismatch
    if _eager_assertion(error):
        return UserCodeError(function, error, beat=beat, at=user_frame(error))
    if passes_through(error):
        return error
    return UserCodeError(function, error, beat=beat, at=user_frame(error))


def passes_through(error: Exception) -> bool:
    """beatloop's own errors, and TensorFlow op errors (the data, found when a step
    runs: the engine reports those as data errors)."""
    return isinstance(error, BeatloopError | tf.errors.OpError)


#: The files whose eager code raises a failed ``tf.debugging`` assertion.
_ASSERTIONS = ("check_ops.py", "control_flow_assert.py")
#: What the recipe's function is, by the beatloop function that called ``call_user``.
_CALLERS = {
    "forward": "loss",
    "loss_of_outputs": "loss",
    "shared_forward": "forward",
    "on_replica": "metric update",
    "run_update": "update",
    "run_act": "act",
}


def _eager_assertion(error: Exception) -> bool:
    """Whether ``error`` is a ``tf.debugging`` assertion that failed eagerly (debug mode,
    or the zero batch lazily built models are built on)."""
    if not isinstance(error, tf.errors.InvalidArgumentError):
        return False
    frames = traceback.extract_tb(error.__traceback__)
    return any(os.path.basename(frame.filename) in _ASSERTIONS for frame in frames)


def called_as(
    frames: list[tuple[str, int, str]],
) -> tuple[str, list[tuple[str, int, str]]] | None:
    """For the frames (``(file, line, function)``, outermost first) that defined an op:
    ``("loss 'name'", frames inside it)`` when the op was made in a recipe's function
    that ``call_user`` called (a loss, forward or metric update); ``None`` when it was
    made elsewhere."""
    here = os.path.normcase(os.path.abspath(__file__))
    calls = [
        index
        for index, (file, _, function) in enumerate(frames)
        if function == "call_user" and os.path.normcase(os.path.abspath(file)) == here
    ]
    if not calls or calls[-1] + 1 >= len(frames):
        return None
    index = calls[-1]
    caller = frames[index - 1][2] if index else ""
    what = _CALLERS.get(caller, "function")
    return f"{what} {frames[index + 1][2]!r}", frames[index + 1 :]


def assertion_summary(message: str) -> str:
    """A failed graph assertion's own words, without TensorFlow's traceback and op names:
    ``assertion failed: [labels must be < 5] [Condition x < y did not hold ...]``."""
    last = message.strip().split("\n\n")[-1]
    roots = re.split(r"\n\s*\(\d+\) [A-Z_]+:\s*", last)
    if len(roots) > 2 and "root error" in roots[0]:  # each replica's: the first
        last = roots[1]
    last = re.sub(r"\s*\[\[.*?\]\]", "", last, flags=re.S)
    last = re.sub(r"\s*\[Op:[^\]]*\].*$", "", last, flags=re.S)
    return " ".join(last.split())


@contextlib.contextmanager
def in_recipe(label: str, spec: Mapping[str, tf.TensorSpec] | None = None):
    """A UserCodeError raised inside names the recipe ``label`` and, when given, the
    shapes of the batches (``spec``) the recipe's code was called on."""
    try:
        yield
    except UserCodeError as error:
        raise error.in_recipe(label, spec and batch_shapes(spec)) from error.original


def function_name(fn: Callable) -> str:
    """A user function's own name: a plain or bound function's, a partial's function's,
    or a callable object's class name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def user_frame(error: BaseException) -> str | None:
    """``file:line in function: code`` of the innermost frame of the recipe's own code
    in ``error``'s traceback: not beatloop's machinery (its built-in recipes count as
    recipe code), TensorFlow, Keras, the standard library or code autograph generated."""
    return own_frame(_frames(error))


def own_frame(frames: Iterable[tuple[str, int, str, str | None]]) -> str | None:
    """``file:line in function: code`` of the first of ``frames`` (``(file, line,
    function, code)``, innermost first) in the user's own code, as ``user_frame``
    picks it."""
    for filename, lineno, function, code in frames:
        if not _in_library(filename) and _GENERATED not in filename:
            shown = _shown_path(filename)
            return f"{shown}:{lineno} in {function}" + (f": {code.strip()}" if code else "")
    return None


def _frames(error: BaseException) -> Iterator[tuple[str, int, str, str | None]]:
    """``(file, line, function, code)`` innermost first. Under autograph the frames of
    converted functions are generated code; the error then carries autograph's
    translation of them back to the source, which is used first."""
    metadata = getattr(error, "ag_error_metadata", None)
    for frame in getattr(metadata, "translated_stack", ()):
        yield frame.filename, frame.lineno, frame.function_name, frame.code
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        yield frame.filename, frame.lineno, frame.name, frame.line


def _in_library(filename: str) -> bool:
    """Whether ``filename`` is in beatloop's machinery (not its built-in recipes), one of
    the ``LIBRARIES`` or the standard library."""
    if filename.startswith("<frozen "):
        return True
    path = os.path.normcase(os.path.abspath(filename))
    beatloop, recipes, stdlib, installed = _roots()
    if path.startswith(recipes):
        return False
    if path.startswith((beatloop, *_package_roots())):
        return True
    return path.startswith(stdlib) and not path.startswith(installed)


def _package_roots() -> tuple[str, ...]:
    modules = (sys.modules.get(name) for name in LIBRARIES)
    files = [module.__file__ for module in modules if getattr(module, "__file__", None)]
    return tuple(_folder(os.path.dirname(file)) for file in files)


@functools.cache
def _roots() -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
    """beatloop's folder, its recipes' folder, the standard library's folders and the
    installed packages' folders (which can lie inside the standard library's)."""
    beatloop = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = sysconfig.get_paths()
    return (
        _folder(beatloop),
        _folder(os.path.join(beatloop, "recipes")),
        tuple(_folder(paths[key]) for key in ("stdlib", "platstdlib")),
        tuple(_folder(paths[key]) for key in ("purelib", "platlib")),
    )


def _folder(path: str) -> str:
    return os.path.normcase(os.path.abspath(path)) + os.sep


def _shown_path(filename: str) -> str:
    """``filename`` relative to the working directory when it lies inside it."""
    path = os.path.abspath(filename)
    inside = os.path.normcase(path).startswith(_folder(os.getcwd()))
    return os.path.relpath(path) if inside else filename
