"""Layers that hold a variable rather than compute: how a recipe makes a picture being
optimised, or loss weights the compiled step reads, into a named part the schedule can
select, the binder can check and a checkpoint can hold (public: ``docs/api.md``)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

__all__ = ["VariableLayer"]


class VariableLayer(keras.layers.Layer):
    """One variable, created at construction from ``initial``; calling the layer ignores
    its input and returns the variable's value."""

    def __init__(
        self, initial: np.ndarray | list[float], *, trainable: bool, variable_name: str, **kwargs
    ):
        super().__init__(**kwargs)
        initial = np.asarray(initial, dtype=np.float32)
        self.variable = self.add_weight(
            shape=initial.shape,
            initializer=keras.initializers.Constant(initial),
            trainable=trainable,
            name=variable_name,
        )
        self.built = True  # the variable exists already: nothing to build lazily

    def call(self, inputs=None):
        return tf.convert_to_tensor(self.variable)
