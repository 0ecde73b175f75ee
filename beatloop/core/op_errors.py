"""TensorFlow errors turned into beatloop's: a data problem found while a step runs, or
while a recipe's losses first meet the data, becomes one readable :class:`DataError`."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping

import tensorflow as tf

from beatloop.core.errors import DataError


@contextlib.contextmanager
def data_errors(role: str):
    """A TensorFlow error raised by the data in a step (a label out of range, a bad
    cast) becomes one readable DataError naming the ``role`` (training, validation)."""
    try:
        yield
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


def batch_shapes(spec: Mapping) -> str:
    """``{x: (None, 64) float32, ...}``: the shapes and dtypes of a batch spec."""
    return "{" + ", ".join(f"{k}: {tuple(s.shape)} {s.dtype.name}" for k, s in spec.items()) + "}"


def failure_message(label: str, what: str, spec: Mapping, error: Exception) -> str:
    """``label``'s ``what`` (a loss, its schedule) failed on batches of ``spec``."""
    message = str(error).strip().splitlines()
    detail = " ".join(line.strip() for line in message[:6])
    return (
        f"{label}: running its {what} on batches of {batch_shapes(spec)} failed: "
        f"{type(error).__name__}: {detail}"
    )
