"""A run's op determinism: TensorFlow's switch for deterministic kernels and input
pipelines, decided once per run, set for the process and kept in the run's record.

The switch changes numbers, not only speed: while it is on, TensorFlow's Python builds
its cross-entropy losses from composite ops where it otherwise runs one fused kernel
(so the two traces differ in the last bits), and runs ``tf.data`` maps with stateful
ops one at a time. A resume therefore sets it as the run it resumes had it, whatever
the process had before; a run that asks for it otherwise is refused
(``RunRecord.differences``).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.framework import config as tf_config


def decided(asked: bool | None, recorded: bool | None, seeded: bool) -> bool:
    """The run's op determinism: as ``asked``; else as the run being resumed had it
    (``recorded``); else on when the user gave a seed (asking for a repeatable run)."""
    if asked is not None:
        return asked
    if recorded is not None:
        return recorded
    return seeded


def set_for_run(on: bool) -> None:
    """Turn TensorFlow's op determinism on or off for this process (a run's traces and
    data pipelines follow it from here on)."""
    if on:
        tf.config.experimental.enable_op_determinism()
    else:
        tf_config.disable_op_determinism()


def is_on() -> bool:
    """Whether op determinism is on in this process (what a run's record keeps)."""
    return bool(tf_config.is_op_determinism_enabled())
