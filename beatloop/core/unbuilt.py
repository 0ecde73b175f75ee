"""Models built lazily (e.g. ``Sequential`` without ``Input``): their variables created
before binding, by running the recipe's losses once on a zero batch (``build_unbuilt``)."""

from __future__ import annotations

from collections.abc import Mapping

import keras
import tensorflow as tf

from beatloop.core.batches import batch_shapes
from beatloop.core.beats import Group
from beatloop.core.errors import BeatloopError, DataError, InputMismatchError, UserCodeError
from beatloop.core.forward import forward, shared_forward
from beatloop.core.op_errors import failure_message
from beatloop.core.phases import schedules_of
from beatloop.core.recipe import Recipe


def build_unbuilt(
    recipe: Recipe, models: Mapping[str, keras.Layer], spec, random, label: str
) -> None:
    """Create the variables of models built lazily (e.g. ``Sequential`` without ``Input``)
    by running every lone beat's loss and every group's forward once in inference mode on
    a zero batch of the data's spec. They draw from a copy of ``random``, so the run's
    stream still starts at its seed."""
    if all(model.built for model in models.values()):
        return
    random = tf.random.Generator.from_state(random.state.read_value(), random.algorithm)
    batch = {
        key: tf.zeros([1 if d is None else d for d in s.shape.as_list()], s.dtype)
        for key, s in spec.items()
    }
    losses, forwards = recipe.losses(), recipe.forwards()
    entries = [entry for schedule in schedules_of(recipe.schedule()) for entry in schedule.beats]
    for entry in entries:
        grouped = isinstance(entry, Group)
        name = entry.forward if grouped else entry.loss
        function = (forwards if grouped else losses).get(name)
        if function is None:  # binding names what is missing
            continue
        try:
            if grouped:
                shared_forward(function, entry.name, models, frozenset(), batch, random)
            else:
                forward(function, entry.name, models, frozenset(), (), batch, random)
        except UserCodeError as error:
            raise error.in_recipe(label, batch_shapes(spec)) from error.original
        except InputMismatchError as error:  # found on the zero batch: show the data's shape
            shape = spec[error.key].shape if error.key in spec else None
            found = None if shape is None or shape.rank is None else tuple(shape.as_list())
            raise error.completed(found=found) from None
        except BeatloopError:
            raise
        except Exception as error:  # a user's model meeting the data: say which, briefly
            raise DataError(failure_message(label, name, spec, error)) from None
