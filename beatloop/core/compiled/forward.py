"""The forward half of a beat: call the loss with models in the declared mode, add
regularisation, and split the loss from the outputs metrics need.

Shared by the compiled step, validation and the binding's gradient probe, so the three
can never disagree about what a beat's loss is.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping

import keras
import tensorflow as tf

from beatloop.core.compiled.user_code import call_user
from beatloop.core.data.paths import spec_paths
from beatloop.core.devices import collectives
from beatloop.core.devices.replicas import OwnBatch, ReplicaRandom
from beatloop.core.failures.errors import BeatloopError, InputMismatchError, MismatchFound


class ModelCalls(Mapping[str, Callable]):
    """The recipe's models by name, each called in the mode its beat declares.

    ``models["generator"](z)`` calls the generator with ``training=True`` if the beat
    runs it in training mode, else ``training=False``; an explicit ``training=`` in the
    call (``models["discriminator"](x, training=True)``) overrides the beat's mode for
    that call. Float16/bfloat16 outputs of a mixed-precision model come back as float32.
    ``models.raw(name)`` gives the model itself (its variables, sub-models).
    ``models.all_gather(x)`` is the global batch's ``x`` under a distribution strategy
    (every replica's rows, in replica order), ``x`` itself on one device, padded as
    ``gathering`` says (``collectives.Gathering``, the engine's, fixed when the step is
    traced); ``models.batch_offset`` is where this replica's rows start in it.
    ``models.own_batch(rows)`` is a batch of ``rows`` rows the loss makes itself (a
    minibatch sampled from a replay buffer): on N replicas each takes its share of the
    rows, drawn once for all, and its loss is weighted by that share (``OwnBatch``).
    ``models.state`` is the recipe's state (``Recipe.build_state``): variables by name.
    ``models.random`` is the run's ``tf.random.Generator``: draw noise from it
    (``models.random.normal(shape)``) so a resumed run draws exactly the numbers the
    uninterrupted one would have. In validation (and evaluation) it is validation's own
    generator, reset to the run's seed at the start of each pass.

    A call is checked against the model's declared inputs (``keras.Input``) before Keras
    runs it: another rank, another size in a known non-batch dimension, or strings for
    numbers (or the reverse) is an ``InputMismatchError`` naming the model, the input,
    both shapes and the batch key; a shape error Keras raises inside a model that
    declares no inputs is reported the same way. The checks run in Python when a step
    is traced: a compiled step holds no op for them.
    """

    def __init__(
        self,
        models: Mapping[str, keras.Layer],
        training: frozenset[str],
        random: tf.random.Generator | None = None,
        batch: Mapping[str, tf.Tensor] | None = None,
        state: Mapping[str, tf.Variable] | None = None,
        gathering: collectives.Gathering | None = None,
    ):
        self._models = models
        self._training = training
        self._random = random
        self._batch = batch
        self._state = {} if state is None else state
        self._gathering = gathering

    def __getitem__(self, name: str) -> Callable:
        model = self._models[name]
        return functools.partial(_call_in_float32, model, name in self._training, name, self._batch)

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def get(self, name: str, default=None):
        """``models[name]``, or ``default`` when the recipe has no model ``name``."""
        return self[name] if name in self._models else default

    @tf.autograph.experimental.do_not_convert
    def raw(self, name: str) -> keras.Layer:
        """The model object itself, for its variables or sub-layers."""
        return self._models[name]

    def is_training(self, name: str) -> bool:
        """Whether ``name`` runs in training mode in this beat."""
        return name in self._training

    @property
    def state(self) -> Mapping[str, tf.Variable]:
        """The recipe's state: the variables its ``build_state`` made, by name (none when
        it declares none), checkpointed with the models."""
        return self._state

    @tf.autograph.experimental.do_not_convert
    def all_gather(self, x):
        """The global batch's ``x``: every replica's ``x`` (a tensor or a structure of
        them, each with the replica's rows of the batch on its first axis) concatenated
        along axis 0 in replica order, so a loss can see the negatives of the whole
        batch; ``x`` itself on one device. The gradient flows back to each replica's own
        rows. Every replica must gather the same shape but for axis 0."""
        return collectives.all_gather(x, self._batch, self._gathering)

    @property
    def batch_offset(self) -> tf.Tensor:
        """The row of the global batch where this replica's rows start (an int32 scalar,
        0 on one device): ``models.all_gather(x)[offset : offset + n]`` is ``x``."""
        return collectives.batch_offset(self._batch)

    @tf.autograph.experimental.do_not_convert
    def own_batch(self, rows) -> OwnBatch:
        """A batch of ``rows`` rows (an int or an integer tensor) this loss makes itself,
        such as a minibatch sampled from a replay buffer in recipe state (``OwnBatch``):
        ``size`` is the rows this replica computes, ``random`` draws them (each draw made
        once over all ``rows``, this replica's returned), ``take(x)`` this replica's rows
        of an ``x`` of ``rows`` rows. Under a strategy the step weights the entry's loss
        (a mean over its own rows) by this share; on one device it changes nothing."""
        random = self.random
        if isinstance(random, ReplicaRandom):
            return random.own_batch(rows)
        return OwnBatch.of_one_device(rows, random)

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


# beatloop's own code, called from a recipe's converted loss: left unconverted (its checks
# run in Python when traced; converting them would only cost time).
@tf.autograph.experimental.do_not_convert
def _call_in_float32(
    model: keras.Layer, mode: bool, name: str = "model", batch=None, /, *args, **kwargs
):
    """Call ``model`` in the beat's ``mode`` unless the call says ``training=`` itself;
    half-precision outputs (a mixed-precision model's) come back as float32, so losses
    are computed and reduced in float32. The inputs are checked first (see
    ``ModelCalls``); ``name`` is the model's, ``batch`` the loss's batch."""
    kwargs.setdefault("training", mode)
    given = args[0] if args else kwargs.get("inputs")
    declared = declared_inputs(model)
    if declared is not None:
        check_inputs(name, declared, given, batch)
    try:
        outputs = model(*args, **kwargs)
    except ValueError as error:
        if declared is not None or not tf.is_tensor(given) or not _SHAPE_ERROR.search(str(error)):
            raise
        found = tf.TensorShape(given.shape)
        mismatch = InputMismatchError(
            name,
            0,
            None if found.rank is None else tuple(found.as_list()),
            given.dtype.name,
            key=_batch_key(given, batch),
            detail=keras_message(error),
            original=error,
        )
        raise MismatchFound(mismatch) from None
    return tf.nest.map_structure(
        lambda t: tf.cast(t, tf.float32) if getattr(t, "dtype", None) in _HALF else t, outputs
    )


#: Shape errors from inside a model (Keras's input checks, TensorFlow's shape inference).
_SHAPE_ERROR = re.compile(r"incompatible|Dimensions must be equal|shape", re.IGNORECASE)


def declared_inputs(model: keras.Layer) -> list | None:
    """The inputs a model declares (a functional or Sequential model's ``Input``s, or a
    Sequential's once built), as Keras tensors; ``None`` for a model that declares none
    (a subclassed model, a Sequential not yet built)."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if not isinstance(inputs, list | tuple) or not inputs:
        return None
    if not all(hasattr(t, "shape") and hasattr(t, "dtype") for t in inputs):
        return None
    return list(inputs)


def check_inputs(name: str, declared: list, given, batch=None) -> None:
    """Raise (as ``MismatchFound``) the first of ``given``'s tensors that does not
    fit the model's ``declared`` input, under Keras's own rules: the batch size is free,
    and a last dimension of 1 may be added or dropped. A structure that cannot be
    matched with the declared inputs is left to Keras."""
    for index, expected, tensor in _paired(declared, given):
        expected_shape = tuple(expected.shape)
        found = tf.TensorShape(tensor.shape)
        expected_dtype = tf.as_dtype(expected.dtype)
        strings = (expected_dtype == tf.string) != (tensor.dtype == tf.string)
        if not strings and _fits(expected_shape, found):
            continue
        raise MismatchFound(
            InputMismatchError(
                name,
                index,
                None if found.rank is None else tuple(found.as_list()),
                tensor.dtype.name,
                expected=(None, *expected_shape[1:]) if expected_shape else (),
                expected_dtype=expected_dtype.name,
                key=_batch_key(tensor, batch),
            )
        )


def _paired(declared: list, given) -> list[tuple[int | str, object, tf.Tensor]]:
    """``(input, declared input, tensor given)`` for each tensor of a call that can be
    matched with a declared input: a lone tensor, a list or tuple of them in order, or a
    dict of them by input name."""
    if tf.is_tensor(given):
        return [(0, declared[0], given)] if len(declared) == 1 else []
    if isinstance(given, Mapping):
        names = [getattr(t, "name", None) for t in declared]
        if all(n in given and tf.is_tensor(given[n]) for n in names):
            return [(n, t, given[n]) for n, t in zip(names, declared, strict=True)]
        return []
    matched = isinstance(given, list | tuple) and len(given) == len(declared)
    if matched and all(tf.is_tensor(t) for t in given):
        return list(zip(range(len(given)), declared, given, strict=True))
    return []


def _fits(expected: tuple, found: tf.TensorShape) -> bool:
    """Whether a tensor of shape ``found`` fits a declared input of shape ``expected``
    as Keras takes it: any batch size, a trailing 1 added or dropped, unknown dimensions
    fitting any size."""
    if found.rank is None or not expected:
        return True
    want, got = list(expected[1:]), found.as_list()[1:]
    if found.rank == len(expected) + 1 and got and got[-1] == 1:
        got = got[:-1]
    elif found.rank == len(expected) - 1 and want and want[-1] == 1:
        want = want[:-1]
    if found.rank == 0 or len(want) != len(got):
        return False
    return all(w is None or g is None or w == g for w, g in zip(want, got, strict=True))


def _batch_key(tensor, batch) -> str | None:
    """The path (``x``, ``x/token_ids``) of ``batch``'s tensor that ``tensor`` is."""
    return next((path for path, value in spec_paths(batch or {}).items() if value is tensor), None)


def keras_message(error: BaseException) -> str:
    """What Keras said, on one line: without its "Exception encountered when calling"
    preamble, the arguments it lists and its terminal colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    text = text.split("Arguments received by")[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("Exception encountered when")]
    detail = " ".join(lines)
    return detail if len(detail) <= 500 else detail[:500] + "..."


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
    state: Mapping[str, tf.Variable] | None = None,
    gathering: collectives.Gathering | None = None,
) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """Run one beat's loss; add the regularisation losses of the models it updates.

    Summed the way Keras's ``compute_loss`` sums them (main loss first, each extra
    loss reduced to a float scalar), so a one-beat schedule matches ``fit`` to round-off.
    """
    calls = ModelCalls(models, training, random, batch, state, gathering)
    result = call_user(loss_fn, "loss", beat_name, calls, batch)
    return regularised_loss(result, beat_name, regularised)


def shared_forward(
    forward_fn: Callable,
    group_name: str,
    models: Mapping[str, keras.Layer],
    training: frozenset[str],
    batch: Mapping[str, tf.Tensor],
    random: tf.random.Generator | None = None,
    state: Mapping[str, tf.Variable] | None = None,
    gathering: collectives.Gathering | None = None,
):
    """Run a group's forward function once: the outputs each of its beats' losses take."""
    calls = ModelCalls(models, training, random, batch, state, gathering)
    return call_user(forward_fn, "forward", f"group {group_name!r}", calls, batch)


def loss_of_outputs(
    loss_fn: Callable,
    beat_name: str,
    outputs,
    regularised: tuple[keras.Layer, ...],
    batch: Mapping[str, tf.Tensor],
) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """A grouped beat's loss from its group's forward outputs, regularised like
    ``forward``."""
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
