"""The forward half of a beat: call the loss with models in the declared mode, add
regularisation, and split the loss from the outputs metrics need.

Shared by the compiled step, validation and the binding's gradient probe, so the three
can never disagree about what a beat's loss is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping

import keras
import tensorflow as tf

from beatloop.core.errors import BeatloopError
from beatloop.core.user_code import call_user


class ModelCalls(Mapping[str, Callable]):
    """The recipe's models by name, each called in the mode its beat declares.

    ``models["generator"](z)`` calls the generator with ``training=True`` if the beat
    runs it in training mode, else ``training=False``; an explicit ``training=`` in the
    call (``models["discriminator"](x, training=True)``) overrides the beat's mode for
    that call. Float16/bfloat16 outputs of a mixed-precision model come back as float32.
    ``models.raw(name)`` gives the model itself (its variables, sub-models).
    ``models.random`` is the run's ``tf.random.Generator``: draw noise from it
    (``models.random.normal(shape)``) so a resumed run draws exactly the numbers the
    uninterrupted one would have.
    """

    def __init__(
        self,
        models: Mapping[str, keras.Layer],
        training: frozenset[str],
        random: tf.random.Generator | None = None,
    ):
        self._models = models
        self._training = training
        self._random = random

    def __getitem__(self, name: str) -> Callable:
        return functools.partial(_call_in_float32, self._models[name], name in self._training)

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def raw(self, name: str) -> keras.Layer:
        """The model object itself, for its variables or sub-layers."""
        return self._models[name]

    def is_training(self, name: str) -> bool:
        """Whether ``name`` runs in training mode in this beat."""
        return name in self._training

    @property
    def random(self) -> tf.random.Generator:
        """The run's random generator (checkpointed with the weights)."""
        if self._random is None:
            raise BeatloopError(
                "this loss was called without the run's random generator; call it through "
                "a bound beat (BoundBeat.forward) or the engine"
            )
        return self._random


_HALF = (tf.float16, tf.bfloat16)


def _call_in_float32(model: keras.Layer, mode: bool, /, *args, **kwargs):
    """Call ``model`` in the beat's ``mode`` unless the call says ``training=`` itself;
    half-precision outputs (a mixed-precision model's) come back as float32, so losses
    are computed and reduced in float32."""
    kwargs.setdefault("training", mode)
    outputs = model(*args, **kwargs)
    return tf.nest.map_structure(
        lambda t: tf.cast(t, tf.float32) if getattr(t, "dtype", None) in _HALF else t, outputs
    )


def split_loss_output(result, beat_name: str) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """A loss function returns a scalar or ``{"loss": scalar, ...}``; return both parts."""
    if isinstance(result, Mapping):
        if "loss" not in result:
            raise BeatloopError(
                f"the loss of beat {beat_name!r} returned a dict without a 'loss' entry "
                f"(keys: {sorted(result)}); put the scalar to minimise under 'loss'"
            )
        outputs = dict(result)
        loss = outputs.pop("loss")
    else:
        loss, outputs = result, {}
    loss = tf.convert_to_tensor(loss)
    if loss.shape.rank not in (0, None):
        raise BeatloopError(
            f"the loss of beat {beat_name!r} must be a scalar, got shape {loss.shape}; "
            "reduce it (e.g. tf.reduce_mean) before returning it"
        )
    if loss.dtype != tf.float32:
        loss = tf.cast(loss, tf.float32)
    return loss, outputs


def forward(
    loss_fn: Callable,
    beat_name: str,
    models: Mapping[str, keras.Layer],
    training: frozenset[str],
    regularised: tuple[keras.Layer, ...],
    batch: Mapping[str, tf.Tensor],
    random: tf.random.Generator | None = None,
) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """Run one beat's loss; add the regularisation losses of the models it updates.

    Summed the way Keras's ``compute_loss`` sums them (main loss first, each extra
    loss reduced to a float scalar), so a one-beat schedule matches ``fit`` to round-off.
    """
    result = call_user(loss_fn, "loss", beat_name, ModelCalls(models, training, random), batch)
    return regularised_loss(result, beat_name, regularised)


def shared_forward(
    forward_fn: Callable,
    group_name: str,
    models: Mapping[str, keras.Layer],
    training: frozenset[str],
    batch: Mapping[str, tf.Tensor],
    random: tf.random.Generator | None = None,
):
    """Run a group's forward function once: the outputs each of its beats' losses take."""
    calls = ModelCalls(models, training, random)
    return call_user(forward_fn, "forward", f"group {group_name!r}", calls, batch)


def loss_of_outputs(
    loss_fn: Callable,
    beat_name: str,
    outputs,
    regularised: tuple[keras.Layer, ...],
    batch: Mapping[str, tf.Tensor],
) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """A grouped beat's loss from its group's forward outputs, regularised like
    :func:`forward`."""
    result = call_user(loss_fn, "loss", beat_name, outputs, batch)
    return regularised_loss(result, beat_name, regularised)


def regularised_loss(result, beat_name: str, regularised: tuple[keras.Layer, ...]):
    """A loss function's result split into loss and outputs, with the regularisation
    losses of the ``regularised`` models added to the loss."""
    loss, outputs = split_loss_output(result, beat_name)
    extra = [
        tf.reduce_sum(tf.cast(term, tf.float32)) for model in regularised for term in model.losses
    ]
    if extra:
        loss = tf.reduce_sum(tf.stack([loss, *extra]))
    return loss, outputs
