"""What a schedule becomes once bound to a run's models, optimizers and losses.

A ``BoundBeat`` is a beat with its names resolved; a ``BoundGroup`` is one
entry of the step — a lone beat, or a group of beats sharing one forward — and knows
how to compute its beats' losses and gradients; a ``BoundSchedule`` holds them all.
The step, validation and the binding's gradient probe all go through
``BoundGroup.losses``, so they can never disagree about what a beat's loss is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import attrs
import keras
import tensorflow as tf

from beatloop.core.beats import Beat, Group, Schedule
from beatloop.core.forward import forward, loss_of_outputs, shared_forward


@attrs.frozen
class BoundBeat:
    """A beat with its names resolved to the objects it uses; reads like its beat
    (``name``, ``repeat``, ``every``, ``transform``, ``constraint``, ``log``). A beat in
    a group repeats and skips steps with its group."""

    beat: Beat
    loss_fn: Callable
    optimizer: keras.optimizers.Optimizer
    variables: tuple[keras.Variable, ...]
    updated_models: tuple[str, ...]
    training: frozenset[str]
    group: Group | None = None

    @property
    def name(self) -> str:
        return self.beat.name

    @property
    def loss_name(self) -> str:
        return self.beat.loss

    @property
    def optimizer_name(self) -> str:
        return self.beat.optimizer

    @property
    def repeat(self) -> int:
        return self.beat.repeat if self.group is None else self.group.repeat

    @property
    def every(self) -> int:
        return self.beat.every if self.group is None else self.group.every

    @property
    def transform(self):
        return self.beat.transform

    @property
    def constraint(self):
        return self.beat.constraint

    @property
    def log(self) -> str:
        return self.beat.log

    def regularised(self, models: Mapping[str, keras.Layer]) -> tuple[keras.Layer, ...]:
        """The models whose regularisation losses join this beat's loss."""
        return tuple(models[name] for name in self.updated_models)

    def forward(
        self,
        models: Mapping[str, keras.Layer],
        batch,
        *,
        training: bool = True,
        random: tf.random.Generator | None = None,
        state: Mapping[str, tf.Variable] | None = None,
    ):
        """This (lone) beat's loss and outputs; ``training=False`` runs every model in
        inference; ``random`` is the generator the loss draws noise from, ``state`` the
        recipe's state."""
        return forward(
            self.loss_fn,
            self.name,
            models,
            self.training if training else frozenset(),
            self.regularised(models),
            batch,
            random,
            state,
        )


@attrs.frozen
class BoundGroup:
    """One entry of a bound step: a lone beat (``forward_fn`` is ``None``: its loss calls
    the models itself), or beats sharing one forward computation (and, with ``combine``,
    one update from their combined gradients)."""

    name: str
    beats: tuple[BoundBeat, ...]
    forward_fn: Callable | None
    training: frozenset[str]
    repeat: int = 1
    every: int = 1
    combine: Callable | None = None

    @classmethod
    def alone(cls, beat: BoundBeat) -> BoundGroup:
        return cls(beat.name, (beat,), None, beat.training, beat.repeat, beat.every)

    @property
    def combined_variables(self) -> tuple[keras.Variable, ...]:
        """The variables two or more of the group's beats update, in the order of the
        first beat that updates each: what ``combine`` combines."""
        counts: dict[int, int] = {}
        for beat in self.beats:
            for variable in {id(v): v for v in beat.variables}.values():
                counts[id(variable)] = counts.get(id(variable), 0) + 1
        ordered = {id(v): v for beat in self.beats for v in beat.variables}
        return tuple(v for key, v in ordered.items() if counts[key] > 1)

    def losses(self, models, batch, *, training: bool = True, random=None, state=None):
        """``(losses, outputs)``: each beat's loss in order, and the outputs metrics may
        use by beat name (a group's forward outputs also under the group's name)."""
        if self.forward_fn is None:
            (beat,) = self.beats
            loss, outputs = beat.forward(
                models, batch, training=training, random=random, state=state
            )
            return [loss], {beat.name: outputs}
        mode = self.training if training else frozenset()
        shared = shared_forward(self.forward_fn, self.name, models, mode, batch, random, state)
        losses, outputs = [], {self.name: shared}
        for beat in self.beats:
            regularised = beat.regularised(models)
            loss, outputs[beat.name] = loss_of_outputs(
                beat.loss_fn, beat.name, shared, regularised, batch
            )
            losses.append(loss)
        return losses, outputs

    def gradients(self, models, batch, *, weight=None, random=None, state=None):
        """``(losses, outputs, gradients)`` with every beat's gradients taken from the
        same state, one tape per beat; ``gradients[i]`` are beat ``i``'s (loss-scaled)
        gradients of its variables, ``None`` where its loss does not reach one. On a
        replica, ``weight`` is its share of the global batch."""
        with contextlib.ExitStack() as stack:
            tapes = [stack.enter_context(tf.GradientTape()) for _ in self.beats]
            losses, outputs = self.losses(models, batch, random=random, state=state)
            scaled = [
                beat.optimizer.scale_loss(loss if weight is None else loss * weight)
                for beat, loss in zip(self.beats, losses, strict=True)
            ]
        gradients = [
            tape.gradient(loss, list(beat.variables))
            for tape, loss, beat in zip(tapes, scaled, self.beats, strict=True)
        ]
        return losses, outputs, gradients


@attrs.frozen
class BoundSchedule:
    """A validated schedule bound to the models, optimizers and losses of one run:
    ``beats`` in step order, and ``groups``, the step's entries, covering them."""

    schedule: Schedule
    beats: tuple[BoundBeat, ...]
    groups: tuple[BoundGroup, ...]
    models: Mapping[str, keras.Layer]
    optimizers: Mapping[str, keras.optimizers.Optimizer]
    random: tf.random.Generator = attrs.field(factory=lambda: tf.random.Generator.from_seed(0))
    #: The recipe's state (``Recipe.build_state``): variables by name, reachable from
    #: losses, updates and acting as ``models.state``; none when it declares none.
    state: Mapping[str, tf.Variable] = attrs.field(factory=dict)

    def describe_variables(self) -> str:
        """Each beat followed by the paths and shapes of the variables it updates."""
        lines = []
        for beat in self.beats:
            lines.append(f"{beat.name} ({len(beat.variables)} variables):")
            lines.extend(f"    {v.path} {tuple(v.shape)}" for v in beat.variables)
        return "\n".join(lines)
