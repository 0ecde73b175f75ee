"""Building models that make their variables lazily (a ``Sequential`` without ``Input``)
before binding: a traced call of the recipe's losses and forwards, never an eager one.

Tracing a ``tf.function`` builds a Keras model (its variables are created and
initialised outside the graph, eagerly, so a strategy's scope mirrors them) without
running the graph: the recipe's code runs only as
Python, on symbolic tensors, so no variable, no recipe state and no random generator
changes (docs/schedules.md, "What runs when").
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import tensorflow as tf

from beatloop.core.compiled.forward import forward, shared_forward
from beatloop.core.compiled.op_errors import failure_message
from beatloop.core.compiled.user_code import recipe_functions
from beatloop.core.data.batches import batch_shapes
from beatloop.core.failures.errors import (
    BeatloopError,
    DataError,
    InputMismatchError,
    UserCodeError,
)
from beatloop.core.schedule.beats import Beat, Group
from beatloop.core.schedule.phases import schedules_of


def build_unbuilt(
    recipe,
    models: Mapping[str, keras.Layer],
    spec,
    random: tf.random.Generator,
    label: str,
    state: Mapping[str, tf.Variable] | None = None,
) -> None:
    """Create the variables of models built lazily by tracing every lone beat's loss and
    every group's forward once, in inference mode, on batches of ``spec``; nothing runs."""
    if all(model.built for model in models.values()):
        return
    calls, current = _calls(recipe), ["model building"]

    def probe(batch):
        with tf.variable_creator_scope(_created_outside):
            for function, grouped, name, function_name in calls:
                current[0] = function_name
                if grouped:
                    shared_forward(function, name, models, frozenset(), batch, random, state)
                else:
                    forward(function, name, models, frozenset(), (), batch, random, state)
        return tf.constant(0)

    try:
        tf.function(probe, autograph=False).get_concrete_function(dict(spec))
    except UserCodeError as error:
        raise error.in_recipe(label, batch_shapes(spec)) from error.original
    except InputMismatchError as error:  # the trace's batch: show the data's shape
        shape = spec[error.key].shape if error.key in spec else None
        found = None if shape is None or shape.rank is None else tuple(shape.as_list())
        raise error.completed(found=found) from None
    except BeatloopError:
        raise
    except Exception as error:  # a user's model meeting the data: say which, briefly
        raise DataError(failure_message(label, current[0], spec, error)) from None


def _created_outside(next_creator, **kwargs):
    """Create a model's variable outside the trace (initialised eagerly, as a model
    built outside any function is): a distribution strategy's mirrored variables
    cannot be lifted out of a function graph, whose replicas copy the first's value."""
    with tf.init_scope():
        return next_creator(**kwargs)


def _calls(recipe) -> list[tuple]:
    """``(function, grouped, entry name, function name)`` for each lone beat's loss and
    each group's forward the recipe defines, in every phase (binding names the ones it
    does not)."""
    losses = recipe_functions(recipe, recipe.losses())
    forwards = recipe_functions(recipe, recipe.forwards())
    calls = []
    entries = [entry for schedule in schedules_of(recipe.schedule()) for entry in schedule.beats]
    for entry in entries:
        if isinstance(entry, Group):
            function = forwards.get(entry.forward)
        elif isinstance(entry, Beat):
            function = losses.get(entry.loss)
        else:  # an update or an act: never run to build models
            continue
        if function is not None:
            grouped = isinstance(entry, Group)
            calls.append((function, grouped, entry.name, entry.forward if grouped else entry.loss))
    return calls
