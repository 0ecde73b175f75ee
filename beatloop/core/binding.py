"""Binding a schedule to built models, optimizers and losses, checking DESIGN's rules.

:func:`bind` resolves every beat's selectors to variables, builds each optimizer for
exactly the variables its beats update, and traces every beat's loss once (without
running it) to find variables that would get no gradient. All problems are collected and
raised together as one :class:`ScheduleError`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping

import attrs
import keras
import tensorflow as tf

from beatloop.core.beats import Beat, Schedule
from beatloop.core.errors import ScheduleError, did_you_mean
from beatloop.core.forward import forward
from beatloop.core.randomness import global_random_ops, new_operations, warn_global_random


@attrs.frozen
class BoundBeat:
    """A beat with its names resolved to the objects it uses; reads like its beat
    (``name``, ``repeat``, ``every``, ``transform``, ``constraint``)."""

    beat: Beat
    loss_fn: Callable
    optimizer: keras.optimizers.Optimizer
    variables: tuple[keras.Variable, ...]
    updated_models: tuple[str, ...]
    training: frozenset[str]

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
        return self.beat.repeat

    @property
    def every(self) -> int:
        return self.beat.every

    @property
    def transform(self):
        return self.beat.transform

    @property
    def constraint(self):
        return self.beat.constraint

    def forward(
        self,
        models: Mapping[str, keras.Layer],
        batch,
        *,
        training: bool = True,
        random: tf.random.Generator | None = None,
    ):
        """This beat's loss and outputs; ``training=False`` runs every model in inference;
        ``random`` is the generator the loss draws noise from."""
        return forward(
            self.loss_fn,
            self.name,
            models,
            self.training if training else frozenset(),
            tuple(models[name] for name in self.updated_models),
            batch,
            random,
        )


@attrs.frozen
class BoundSchedule:
    """A validated schedule bound to the models, optimizers and losses of one run."""

    schedule: Schedule
    beats: tuple[BoundBeat, ...]
    models: Mapping[str, keras.Layer]
    optimizers: Mapping[str, keras.optimizers.Optimizer]
    random: tf.random.Generator = attrs.field(factory=lambda: tf.random.Generator.from_seed(0))

    def describe_variables(self) -> str:
        """Each beat followed by the paths and shapes of the variables it updates."""
        lines = []
        for beat in self.beats:
            lines.append(f"{beat.name} ({len(beat.variables)} variables):")
            lines.extend(f"    {v.path} {tuple(v.shape)}" for v in beat.variables)
        return "\n".join(lines)


def variable_owner(models: Mapping[str, keras.Layer]) -> dict[int, str]:
    """Map each trainable variable (by id) to the first model that holds it."""
    owner: dict[int, str] = {}
    for name, model in models.items():
        for variable in model.trainable_variables:
            owner.setdefault(id(variable), name)
    return owner


def select(
    selector: str, models: Mapping[str, keras.Layer], problems: list[str], where: str
) -> list[keras.Variable]:
    """Resolve ``"model"`` or ``"model:glob"`` to trainable variables, noting problems."""
    model_name, _, pattern = selector.partition(":")
    if model_name not in models:
        problems.append(
            f"{where} selects {selector!r}, but there is no model {model_name!r}"
            f"{did_you_mean(model_name, models)}; models: {', '.join(models)}"
        )
        return []
    variables = list(models[model_name].trainable_variables)
    if pattern:
        variables = [
            v
            for v in variables
            if fnmatch.fnmatchcase(v.path, pattern) or fnmatch.fnmatchcase(v.path, "*/" + pattern)
        ]
    if not variables:
        paths = ", ".join(v.path for v in models[model_name].trainable_variables) or "(none)"
        problems.append(
            f"{where} selects {selector!r}, which matches no trainable variable; "
            f"{model_name!r} has: {paths}"
        )
    return variables


def bind(
    schedule: Schedule,
    models: Mapping[str, keras.Layer],
    optimizers: Mapping[str, keras.optimizers.Optimizer],
    losses: Mapping[str, Callable],
    batch_spec: Mapping[str, tf.TensorSpec] | None = None,
    context: str = "the schedule",
    random: tf.random.Generator | None = None,
    strategy: tf.distribute.Strategy | None = None,
) -> BoundSchedule:
    """Check every rule, build optimizers, and return the bound schedule.

    With ``batch_spec`` given, every beat's loss is traced once on a batch of that spec
    to find claimed variables its loss gives no gradient to. ``random`` is the generator
    losses draw noise from (a fresh one seeded with 0 if omitted). With a ``strategy``
    the probe is traced on its replicas, where distributed variables have gradients.
    """
    if random is None:
        random = tf.random.Generator.from_seed(0)
    problems = [
        problem
        for beat in schedule.beats
        for problem in _name_problems(beat, models, optimizers, losses)
    ]
    resolved = {beat.name: _selected(beat, models, problems) for beat in schedule.beats}
    problems += _ownership_problems(schedule, models, resolved, problems)
    beats = []
    if not problems:
        owner = variable_owner(models)
        beats = [
            _bind_beat(beat, optimizers, losses, resolved[beat.name], owner)
            for beat in schedule.beats
        ]
        problems += _build_optimizers(beats)
    if batch_spec is not None and not problems:
        problems += _gradient_problems(beats, models, batch_spec, random, strategy, context)
    if problems:
        raise ScheduleError(problems, context)
    return BoundSchedule(schedule, tuple(beats), dict(models), dict(optimizers), random)


def _selected(beat: Beat, models, problems: list[str]) -> list[keras.Variable]:
    """The variables a beat's ``updates`` select, each once (problems noted)."""
    where = f"beat {beat.name!r}"
    return _unique(
        v for selector in beat.updates for v in select(selector, models, problems, where)
    )


def _name_problems(beat: Beat, models, optimizers, losses) -> list[str]:
    """A beat's loss, optimizer and training-mode models that do not exist."""
    where = f"beat {beat.name!r}"
    problems = []
    if beat.loss not in losses:
        problems.append(
            f"{where} uses loss {beat.loss!r}{did_you_mean(beat.loss, losses)}, which the "
            f"recipe does not define; losses: {', '.join(losses) or '(none)'}"
        )
    if beat.optimizer not in optimizers:
        problems.append(
            f"{where} uses optimizer {beat.optimizer!r}"
            f"{did_you_mean(beat.optimizer, optimizers)}, which the recipe does not "
            f"define; optimizers: {', '.join(optimizers) or '(none)'}"
        )
    for name in beat.training or ():
        if name not in models:
            problems.append(
                f"{where} runs {name!r} in training mode, but there is no such model; "
                f"models: {', '.join(models)}"
            )
    return problems


def _ownership_problems(
    schedule: Schedule, models, resolved: Mapping[str, list], problems: list[str]
) -> list[str]:
    """Variables no beat updates and nobody froze, frozen ones a beat updates, and ones
    two beats update without being declared shared. (Selector problems of ``frozen``
    and ``shared`` go to ``problems``.)"""
    claimed: dict[int, list[str]] = {}
    for name, variables in resolved.items():
        for variable in variables:
            claimed.setdefault(id(variable), []).append(name)
    frozen = {id(v) for s in schedule.frozen for v in select(s, models, problems, "frozen")}
    shared = {id(v) for s in schedule.shared for v in select(s, models, problems, "shared")}
    owner = variable_owner(models)
    found = []
    for model in models.values():
        for variable in model.trainable_variables:
            key, beats = id(variable), claimed.get(id(variable), [])
            where = f"variable {variable.path!r} of model {owner[key]!r}"
            if not beats and key not in frozen:
                found.append(
                    f"{where} is updated by no beat and not declared frozen "
                    "(add it to a beat's `updates` or to Schedule(frozen=...))"
                )
            if beats and key in frozen:
                found.append(f"{where} is declared frozen but beat(s) {beats} update it")
            if len(set(beats)) > 1 and key not in shared:
                found.append(
                    f"{where} is updated by beats {beats} but not declared shared "
                    "(add it to Schedule(shared=...) if that is intended)"
                )
    return list(dict.fromkeys(found))


def _unique(variables) -> list[keras.Variable]:
    seen: dict[int, keras.Variable] = {}
    for variable in variables:
        seen.setdefault(id(variable), variable)
    return list(seen.values())


def _bind_beat(beat, optimizers, losses, variables, owner) -> BoundBeat:
    updated = tuple(dict.fromkeys(owner[id(v)] for v in variables))
    training = frozenset(updated if beat.training is None else beat.training)
    return BoundBeat(
        beat, losses[beat.loss], optimizers[beat.optimizer], tuple(variables), updated, training
    )


def _build_optimizers(bound_beats: list[BoundBeat]) -> list[str]:
    """Build each optimizer once, for the union of its beats' variables."""
    problems = []
    by_optimizer: dict[int, tuple[keras.optimizers.Optimizer, str, list]] = {}
    for beat in bound_beats:
        _, _, variables = by_optimizer.setdefault(
            id(beat.optimizer), (beat.optimizer, beat.optimizer_name, [])
        )
        variables.extend(beat.variables)
    for optimizer, name, variables in by_optimizer.values():
        variables = _unique(variables)
        if optimizer.built:
            known = {id(v) for v in optimizer._trainable_variables}
            strangers = [v.path for v in variables if id(v) not in known]
            if strangers:
                problems.append(
                    f"optimizer {name!r} was already built for other variables and cannot "
                    f"update {strangers}; pass a fresh optimizer"
                )
        else:
            optimizer.build(variables)
    return problems


def _gradient_problems(
    bound_beats, models, batch_spec, random, strategy=None, context="the schedule"
) -> list[str]:
    """Trace each beat's loss and gradients (nothing runs) and report None gradients;
    warn of losses that draw from global random ops (they break exact resume)."""
    problems: list[str] = []
    global_random: dict[str, list[str]] = {}

    def probe(batch):
        for beat in bound_beats:
            with tf.GradientTape() as tape, new_operations() as created:
                loss, _ = beat.forward(models, batch, random=random)
            global_random[beat.name] = global_random_ops(created)
            grads = tape.gradient(loss, list(beat.variables))
            for variable, grad in zip(beat.variables, grads, strict=True):
                if grad is None:
                    problems.append(
                        f"beat {beat.name!r} claims variable {variable.path!r}, but its "
                        f"loss {beat.loss_name!r} gives it no gradient (is the model called "
                        "inside the loss, on a path connected to the result?)"
                    )
        return tf.constant(0)

    if strategy is None:
        tf.function(probe).get_concrete_function(dict(batch_spec))
    else:  # traced once per replica: the same problems, found twice
        distributed = lambda batch: strategy.run(probe, args=(batch,))  # noqa: E731
        tf.function(distributed).get_concrete_function(dict(batch_spec))
    warn_global_random(global_random, context)
    return list(dict.fromkeys(problems))
