"""What a schedule becomes once bound to a run's models, optimizers and losses.

A ``BoundBeat`` is a beat with its names resolved; a ``BoundGroup`` is one
entry of the step — a lone beat, or a group of beats sharing one forward — and knows
how to compute its beats' losses and gradients; a ``BoundUpdate`` is an update or an
act with the variables it writes; a ``BoundSchedule`` holds them all.
The step, validation and the binding's gradient probe all go through
``BoundGroup.losses``, so they can never disagree about what a beat's loss is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import attrs
import keras
import tensorflow as tf

from beatloop.core.compiled.accumulation import Accumulators
from beatloop.core.compiled.conditional import Condition
from beatloop.core.compiled.forward import ModelCalls, forward, loss_of_outputs, shared_forward
from beatloop.core.compiled.user_code import call_user
from beatloop.core.devices.replicas import declared, entry_weight
from beatloop.core.schedule.beats import Beat, Group, Schedule
from beatloop.core.schedule.updates import EMA, Act, Copy, NonGradient


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
        gathering=None,
    ):
        """This (lone) beat's loss and outputs; ``training=False`` runs every model in
        inference; ``random`` is the generator the loss draws noise from, ``state`` the
        recipe's state, ``gathering`` how its gathers pad (``collectives.Gathering``)."""
        return forward(
            self.loss_fn,
            self.name,
            models,
            self.training if training else frozenset(),
            self.regularised(models),
            batch,
            random,
            state,
            gathering,
        )


@attrs.frozen
class BoundGroup:
    """One entry of a bound step: a lone beat (``forward_fn`` is ``None``: its loss calls
    the models itself), or beats sharing one forward computation (and, with ``combine``,
    one update from their combined gradients). ``condition`` (``only_if``) gates its
    updates; ``accumulators`` hold the sums of an entry that ``accumulate``s."""

    name: str
    beats: tuple[BoundBeat, ...]
    forward_fn: Callable | None
    training: frozenset[str]
    repeat: int = 1
    every: int = 1
    combine: Callable | None = None
    condition: Condition | None = None
    accumulate: int = 1
    accumulators: Accumulators | None = None

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

    def losses(
        self, models, batch, *, training: bool = True, random=None, state=None, gathering=None
    ):
        """``(losses, outputs)``: each beat's loss in order, and the outputs metrics may
        use by beat name (a group's forward outputs also under the group's name);
        ``gathering``: how ``models.all_gather`` pads (``collectives.Gathering``)."""
        if self.forward_fn is None:
            (beat,) = self.beats
            loss, outputs = beat.forward(
                models, batch, training=training, random=random, state=state, gathering=gathering
            )
            return [loss], {beat.name: outputs}
        mode = self.training if training else frozenset()
        shared = shared_forward(
            self.forward_fn, self.name, models, mode, batch, random, state, gathering
        )
        losses, outputs = [], {self.name: shared}
        for beat in self.beats:
            regularised = beat.regularised(models)
            loss, outputs[beat.name] = loss_of_outputs(
                beat.loss_fn, beat.name, shared, regularised, batch
            )
            losses.append(loss)
        return losses, outputs

    def gradients(self, models, batch, *, weight=None, random=None, state=None, gathering=None):
        """``(losses, outputs, gradients)`` with every beat's gradients taken from the
        same state, one tape per beat; ``gradients[i]`` are beat ``i``'s (loss-scaled)
        gradients of its variables, ``None`` where its loss does not reach one. On a
        replica, ``weight`` is its share of the global batch, or, when the losses declare
        a batch of their own (``models.own_batch``), its share of that one."""
        with contextlib.ExitStack() as stack:
            tapes = [stack.enter_context(tf.GradientTape()) for _ in self.beats]
            since = declared(random)
            losses, outputs = self.losses(
                models, batch, random=random, state=state, gathering=gathering
            )
            if weight is not None:
                weight = entry_weight(random, since, weight, f"entry {self.name!r}")
            scaled = [
                beat.optimizer.scale_loss(loss if weight is None else weighted(loss, weight))
                for beat, loss in zip(self.beats, losses, strict=True)
            ]
        gradients = [
            tape.gradient(loss, list(beat.variables))
            for tape, loss, beat in zip(tapes, scaled, self.beats, strict=True)
        ]
        return losses, outputs, gradients


def weighted(loss: tf.Tensor, weight: tf.Tensor) -> tf.Tensor:
    """A replica's loss times its share; zero on a replica with no rows (the last,
    short batch), whose mean over no examples is NaN and must not reach the sum."""
    return tf.math.multiply_no_nan(loss, tf.cast(weight, loss.dtype))


def on_rows(loss: tf.Tensor, weight: tf.Tensor | None) -> tf.Tensor:
    """A loss as the figures and checks take it: as it is, but zero on a replica with no
    rows (``weight``, its share, is 0), where a mean over no examples is NaN."""
    if weight is None:
        return loss
    return tf.math.multiply_no_nan(loss, tf.sign(tf.cast(weight, loss.dtype)))


@attrs.frozen
class BoundUpdate:
    """An update or act of the step, bound: ``writes`` are the model variables it owns;
    an ``EMA`` or ``Copy`` has its ``(target, source)`` variable ``pairs``; ``condition``
    is its bound ``only_if``."""

    entry: NonGradient
    writes: tuple[keras.Variable, ...] = ()
    pairs: tuple[tuple[keras.Variable, keras.Variable], ...] = ()
    condition: Condition | None = None

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def every(self) -> int:
        return self.entry.every

    @property
    def kind(self) -> str:
        """``"act"`` or ``"update"``, as messages and ``describe_variables`` say."""
        return "act" if isinstance(self.entry, Act) else "update"

    def run(self, models, batch, *, random=None, state=None) -> None:
        """Assign what the entry assigns, every model in inference mode; the user's
        function goes through ``call_user`` (its errors name it)."""
        entry = self.entry
        if isinstance(entry, EMA):
            for target, source in self.pairs:
                keep = tf.constant(entry.decay, target.dtype)
                mix = tf.constant(1 - entry.decay, target.dtype)
                target.assign(keep * target.value + mix * source.value)
        elif isinstance(entry, Copy):
            for target, source in self.pairs:
                target.assign(source.value)
        elif isinstance(entry, Act):
            run_act(entry, ModelCalls(models, frozenset(), random, batch, state), batch)
        else:
            run_update(entry, ModelCalls(models, frozenset(), random, None, state))


def run_update(entry, calls: ModelCalls) -> None:
    """An ``Update``'s function on the models (named so its errors say "update")."""
    call_user(entry.fn, _kind("update", entry), None, calls)


def run_act(entry: Act, calls: ModelCalls, batch) -> None:
    """An ``Act``'s function on the models and the batch (its errors say "act")."""
    call_user(entry.fn, _kind("act", entry), None, calls, batch)


def _kind(kind: str, entry) -> str:
    """What errors call the entry's function: ``act`` (``act 'fn'``), or with the
    entry's name when it is not the function's (``act 'collect', function 'fn'``)."""
    name = getattr(entry.fn, "__name__", None)
    return kind if entry.name == name else f"{kind} {entry.name!r}, function"


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
    #: The step's entries in order: ``groups`` and the ``BoundUpdate`` of each update
    #: and act (just ``groups`` when the schedule has none).
    entries: tuple[BoundGroup | BoundUpdate, ...] = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        if self.entries is None:
            object.__setattr__(self, "entries", self.groups)

    @property
    def updates(self) -> tuple[BoundUpdate, ...]:
        """The bound updates and acts, in step order."""
        return tuple(e for e in self.entries if isinstance(e, BoundUpdate))

    def describe_variables(self) -> str:
        """Each beat followed by the variables it updates, then each update that writes
        model variables, with them: one line per variable, ``MODEL/PATH (shape)``, MODEL
        the recipe's name of the model (not repeated for a model whose every path starts
        with it, as a ``Sequential`` of that name's do). The model comes first because
        two models' variables can share a path (the ``ppo`` recipe's policy and value
        networks each have a ``hidden_1/kernel``); a variable two models hold (a shared
        layer) is named by the first of them."""
        prefix: dict[int, str] = {}
        for name, model in self.models.items():
            named = all(v.path.startswith(f"{name}/") for v in model.variables)
            for variable in model.variables:
                prefix.setdefault(id(variable), "" if named else f"{name}/")

        def line(variable) -> str:
            return f"    {prefix.get(id(variable), '')}{variable.path} {tuple(variable.shape)}"

        lines = []
        for beat in self.beats:
            lines.append(f"{beat.name} ({len(beat.variables)} variables):")
            lines.extend(line(v) for v in beat.variables)
        for update in self.updates:
            if update.writes:
                lines.append(f"{update.name} (update, writes {len(update.writes)} variables):")
                lines.extend(line(v) for v in update.writes)
        return "\n".join(lines)
