"""Layers for recipe authors (public: ``docs/api.md``): ``VariableLayer``, a layer that
holds a variable rather than computes (a picture being optimised, loss weights the
compiled step reads, as a named part the schedule can select, the binder can check and a
checkpoint can hold); ``inputs_like`` and ``joined_features``, a built-in model's inputs
for a batch key that holds one tensor or a dict or tuple of them (named inputs);
``copy_of``, a model's architecture with variables of its own (an average, a target)."""

from __future__ import annotations

from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

__all__ = ["VariableLayer", "copy_of", "inputs_like", "joined_features"]


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


def inputs_like(spec):
    """``keras.Input``s for batches of ``spec`` (a batch key's ``tf.TensorSpec``, or a
    dict or tuple of them): one ``Input`` of the same shape (the batch dimension left
    out) and dtype per tensor, in the same structure, a dict's inputs named by their
    keys, so a functional model built on them takes the data's batches as they are."""
    if isinstance(spec, Mapping):
        return {name: _input(value, str(name)) for name, value in spec.items()}
    if isinstance(spec, tuple | list):
        return [_input(value) for value in spec]
    return _input(spec)


def _input(spec, name: str | None = None):
    if isinstance(spec, Mapping | tuple | list):
        raise ValueError(
            f"inputs_like makes one keras.Input per tensor of a dict or tuple, found a nested "
            f"{type(spec).__name__} under {name!r}: flatten the data's features one level"
        )
    return keras.Input(tuple(spec.shape[1:]), dtype=spec.dtype.name, name=name)


def joined_features(inputs) -> keras.KerasTensor:
    """One float32 feature row per example from ``inputs`` (a tensor, or a dict or tuple
    of them, e.g. ``inputs_like``'s): each cast to float32, flattened, and joined in
    ``tf.nest``'s order (a dict's by sorted key): what a built-in dense model reads when
    the data gives several feature tensors."""
    flat = [
        keras.layers.Flatten()(keras.ops.cast(tensor, "float32"))
        for tensor in tf.nest.flatten(inputs)
    ]
    return flat[0] if len(flat) == 1 else keras.layers.Concatenate()(flat)


def copy_of(model: keras.Layer, name: str) -> keras.Layer:
    """A model of ``model``'s architecture with variables of its own
    (``keras.models.clone_model``: its config, fresh values), for the model ``name`` that
    starts as a copy of it (an average, a target network: a recipe's
    ``derived_models``); a model Keras cannot copy is a ``ConfigError`` saying what to
    pass instead."""
    from beatloop import ConfigError

    try:
        return keras.models.clone_model(model)
    except Exception as error:
        raise ConfigError(
            f"model {name!r} is made as a copy of model {model.name!r}, which "
            f"keras.models.clone_model cannot copy ({type(error).__name__}: {error}); pass "
            f"models={{{name!r}: ...}} with a model of the same architecture"
        ) from error
