"""TensorFlow errors turned into beatloop's: a data problem found while a step runs, or
while a recipe's losses first meet the data, becomes one readable ``DataError``.

``data_errors`` names the data set (training or validation) and the recipe: in a
model input that does not fit (``InputMismatchError``, found
when a step is traced), a class label out of range
(``LabelRangeError``, read from TensorFlow's error: the
compiled step holds no extra op for it), an exception in the data pipeline (its Python
exception and line, when it has them) and any other op error a batch causes.
"""

from __future__ import annotations

import contextlib
import linecache
import re
from collections.abc import Mapping

import tensorflow as tf

from beatloop.core.compiled.user_code import assertion_summary, called_as, own_frame
from beatloop.core.data.batches import batch_shapes
from beatloop.core.devices.collectives import collective_error
from beatloop.core.devices.workers import peer_failure
from beatloop.core.failures.errors import (
    BeatloopError,
    DataError,
    InputMismatchError,
    LabelRangeError,
    UserCodeError,
)

#: A recipe's label keys: batch key -> (the config field giving its number of classes,
#: that field's value). See ``beatloop.core.running.recipe.Recipe.label_classes``.
LabelClasses = Mapping[str, tuple[str, object]]

# TensorFlow's words for a label out of range: the kernel's own, and (with op
# determinism on) the gather that replaces it.
_LABEL_VALUE = re.compile(
    r"Received a label value of (-?\d+) which is outside the valid range of \[0, (\d+)\)"
)
_INDEX_VALUE = re.compile(r"indices\[[^\]]*\] = (-?\d+) is not in \[0, (\d+)\)")
_LABEL_OPS = re.compile(r"SparseSoftmaxCrossEntropyWithLogits")
_PIPELINE = re.compile(r"\[\[(\{\{node )?IteratorGetNext")
_PYTHON_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n([^\n]*)')
# The op that failed and the Python frames that defined it, outermost first (a graph
# error's own traceback, without code lines).
_DEFINED_AT = re.compile(
    r"Detected at node (\S+) defined at \(most recent call last\):\n(.*?)\n\n\S", re.S
)
_DEFINITION_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


#: The most batches ``largest_label`` reads (a data set that repeats has no end).
LABEL_SCAN_BATCHES = 100_000


@contextlib.contextmanager
def data_errors(
    role: str,
    label: str | None = None,
    classes: LabelClasses | None = None,
    data: tf.data.Dataset | None = None,
):
    """Errors the ``role`` data set (training, validation) causes, as one readable
    DataError naming it and the recipe ``label``: a model input that does not fit, a
    class label out of range (``classes``: the recipe's label keys; with ``data``, that
    data set, its largest label read once, on the host, so the advice covers every
    label), an exception in the data pipeline, another op error in a step; a failed
    assertion of the recipe's own code becomes a UserCodeError and a failed
    cross-replica collective op a CollectiveError. Other errors, and those saying another
    worker went away, pass unchanged."""
    try:
        yield
    except InputMismatchError as error:
        raise error.completed(recipe=label, data_set=role) from None
    except tf.errors.OpError as error:
        if peer_failure(error) is not None:
            raise  # another worker went away: the engine says so (core/devices/workers.py)
        failed = assertion_error(error, label)
        if failed is not None:
            raise failed from failed.original
        collective = collective_error(error, role, label)
        if collective is not None:
            raise collective from error
        found = data_error(error, role, label, classes or {})
        if found is None:
            raise
        if isinstance(found, UserCodeError):
            raise found from found.original
        if isinstance(found, LabelRangeError) and data is not None:
            found = with_largest(found, largest_label(data, found.keys))
        raise found from None


def with_largest(error: LabelRangeError, largest: int | None) -> LabelRangeError:
    """``error`` advising from the whole data's ``largest`` label."""
    if largest is None:
        return error
    completed = LabelRangeError(
        error.label, error.limit, keys=error.keys, field=error.field, classes=error.classes,
        largest=largest, data_set=error.data_set, recipe=error.recipe,
    )  # fmt: skip
    completed.original = error.original
    return completed


def largest_label(data: tf.data.Dataset, keys) -> int | None:
    """The largest value of the batch ``keys`` over ``data`` (dict batches; at most
    ``LABEL_SCAN_BATCHES`` of them), read in one pass on the host; ``None`` when no
    batch holds one of them."""
    spec = data.element_spec
    keys = [key for key in keys if isinstance(spec, Mapping) and key in spec]
    keys = [key for key in keys if spec[key].dtype.is_integer]
    if not keys:
        return None
    lowest = tf.constant(tf.int64.min, tf.int64)

    def larger(largest, batch):
        values = [tf.reduce_max(tf.cast(batch[key], tf.int64)) for key in keys]
        return tf.reduce_max(tf.stack([largest, *values]))

    largest = int(data.take(LABEL_SCAN_BATCHES).reduce(lowest, larger))
    return None if largest == tf.int64.min else largest


def data_error(
    error: tf.errors.OpError, role: str, label: str | None, classes: LabelClasses
) -> DataError | UserCodeError | None:
    """The DataError for an op error the ``role`` data set caused, or ``None`` for one
    it did not (an error outside the data pipeline that is not an invalid argument).
    TensorFlow's error is its ``original``. An invalid argument of an op the recipe's
    own line made (not one inside a model) is that line's UserCodeError instead."""
    message = error.message or str(error)
    found = label_error(message, role, label, classes)
    if found is None:
        head = f"{label}: " if label else ""
        if _PIPELINE.search(message):
            cause = python_failure(message) or f"{type(error).__name__}: {op_error_summary(error)}"
            found = DataError(f"{head}the {role} data pipeline failed: {cause}")
        elif isinstance(error, tf.errors.InvalidArgumentError):
            own = own_op_error(error, label)
            if own is not None:
                return own
            found = DataError(f"{head}a {role} step failed on its batch: {op_error_summary(error)}")
        else:
            return None
    found.original = error
    return found


def assertion_error(error: tf.errors.OpError, label: str | None) -> UserCodeError | None:
    """A failed assertion (``tf.debugging.assert_*``, ``tf.debugging.Assert``) that the
    recipe's own code defined, as the UserCodeError naming its function and line, read
    from the op's definition traceback in TensorFlow's error; ``None`` for any other
    error. The original is an ``InvalidArgumentError`` of the assertion's words, caused
    by TensorFlow's error."""
    message = error.message or str(error)
    found = _DEFINED_AT.search(message + "\n\n.")
    if found is None or "Assert" not in found[1].split("/"):
        return None
    frames = [(f, int(n), fn) for f, n, fn in _DEFINITION_FRAME.findall(found[2])]
    called = called_as(frames)
    if called is None:  # an assertion outside the recipe's code (a data pipeline's)
        return None
    what, inner = called
    at = own_frame(
        (file, line, function, linecache.getline(file, line).strip() or None)
        for file, line, function in reversed(inner)
    )
    words = tf.errors.InvalidArgumentError(None, None, assertion_summary(message))
    words.__cause__ = error
    return UserCodeError(what, words, at=at, recipe=label)


#: Words of a shape that did not hold when the step ran.
_SHAPE_WORDS = re.compile(r"shape|dimension|must equal|Incompatible", re.IGNORECASE)


def own_op_error(error: tf.errors.OpError, label: str | None) -> UserCodeError | None:
    """An op error of an op the recipe's own line made directly (its definition
    traceback ends in the recipe's function, not in a model or library), as the
    UserCodeError naming that function and line; ``None`` for any other. A shape that did
    not hold gets the usual cause in its words: a batch's size is known only when the
    step runs."""
    message = error.message or str(error)
    found = _DEFINED_AT.search(message + "\n\n.")
    if found is None:
        return None
    frames = [(f, int(n), fn) for f, n, fn in _DEFINITION_FRAME.findall(found[2])]
    called = called_as(frames)
    if called is None:
        return None
    what, inner = called
    file, line, function = inner[-1]
    at = own_frame([(file, line, function, linecache.getline(file, line).strip() or None)])
    if at is None:  # the op was made inside a model, a loss class or another library
        return None
    summary = op_error_summary(error)
    if _SHAPE_WORDS.search(summary):
        summary += (
            "; a batch's size is known only when the step runs (its static shape is "
            "(None, ...)): the last batch of a pass can be smaller, and under a strategy "
            "each replica gets its share, so take sizes from tf.shape(x), not fixed numbers"
        )
    words = type(error)(None, None, summary)
    words.__cause__ = error
    return UserCodeError(what, words, at=at, recipe=label)


def label_error(
    message: str, role: str, label: str | None, classes: LabelClasses
) -> LabelRangeError | None:
    """A label out of range, read from TensorFlow's ``message`` (either wording), named
    by the recipe's label keys ``classes`` of that many classes; ``None`` for another
    error."""
    found = _LABEL_VALUE.search(message)
    if found is None and _LABEL_OPS.search(message):
        found = _INDEX_VALUE.search(message)
    if found is None:
        return None
    value, limit = int(found[1]), int(found[2])
    keys = _label_keys(classes, limit)
    fields = {classes[key][0] for key in keys}
    field, setting = classes[keys[0]] if len(fields) == 1 else (None, None)
    return LabelRangeError(
        value, limit, keys=tuple(keys), field=field, classes=setting, data_set=role, recipe=label
    )


def _label_keys(classes: LabelClasses, limit: int) -> list[str]:
    """The label keys the bad label can be in: those with ``limit`` classes, else those
    whose number of classes is not a plain count, else all of them."""

    def counted(setting) -> bool:
        return isinstance(setting, int) and not isinstance(setting, bool)

    for keep in (
        lambda n: counted(n) and n == limit,
        lambda n: not counted(n),
        lambda n: True,
    ):
        keys = [key for key, (_, setting) in classes.items() if keep(setting)]
        if keys:
            return keys
    return []


def python_failure(message: str) -> str | None:
    """``Type: message — at file:line in function: code`` of a Python exception whose
    traceback an op error carries (a ``tf.py_function`` in a data pipeline), naming the
    innermost line of the user's own code; ``None`` when it carries none."""
    start = message.find("Traceback (most recent call last):")
    if start < 0:
        return None
    text = message[start:].split("\n\t [[")[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    frames = [
        (file, int(line), function, code.strip() or None)
        for file, line, function, code in _PYTHON_FRAME.findall(text)
    ]
    at = own_frame(reversed(frames))
    return lines[-1] + (f" — at {at}" if at else "")


def op_error_summary(error: tf.errors.OpError) -> str:
    """The cause of a graph error without its traceback: its last paragraph and the op."""
    message = (error.message or str(error)).strip()
    cause = " ".join(message.split("\n\n")[-1].split())
    if len(cause) > 300:
        cause = cause[:300] + "..."
    node = re.search(r"Detected at node (\S+)", message)
    return f"{cause} (in op {node.group(1)})" if node else cause


def failure_message(label: str, what: str, spec: Mapping, error: Exception) -> str:
    """``label``'s ``what`` (a loss, its schedule) failed on batches of ``spec``."""
    message = str(error).strip().splitlines()
    detail = " ".join(line.strip() for line in message[:6])
    return (
        f"{label}: running its {what} on batches of {batch_shapes(spec)} failed: "
        f"{type(error).__name__}: {detail}"
    )


@contextlib.contextmanager
def schedule_errors(label: str, spec):
    """Errors of the recipe ``label``'s schedule traced on batches of ``spec``: its own
    code's naming the recipe, TensorFlow's as a DataError."""
    try:
        yield
    except UserCodeError as error:
        raise error.in_recipe(label, batch_shapes(spec)) from error.original
    except BeatloopError as error:
        if getattr(error, "original", None) is not None:  # its cause, kept apart
            raise error from error.original
        raise
    except (ValueError, TypeError, tf.errors.OpError) as error:
        raise DataError(failure_message(label, "schedule", spec, error)) from None
