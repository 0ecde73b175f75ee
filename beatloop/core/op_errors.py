"""TensorFlow errors turned into beatloop's: a data problem found while a step runs, or
while a recipe's losses first meet the data, becomes one readable :class:`DataError`.

:func:`data_errors` names the data set (training or validation) and the recipe: in a
model input that does not fit (:class:`~beatloop.core.errors.InputMismatchError`, found
when a step is traced) and in an op error a batch causes.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping

import tensorflow as tf

from beatloop.core.batches import batch_shapes
from beatloop.core.errors import DataError, InputMismatchError


@contextlib.contextmanager
def data_errors(role: str, label: str | None = None):
    """Errors the ``role`` data set (training, validation) causes, as one readable
    DataError naming it and the recipe ``label``: a model input that does not fit, an
    op error in a step (a label out of range, a bad cast)."""
    try:
        yield
    except InputMismatchError as error:
        raise error.completed(recipe=label, data_set=role) from None
    except tf.errors.InvalidArgumentError as error:
        raise DataError(f"a {role} step failed on its batch: {op_error_summary(error)}") from None


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
