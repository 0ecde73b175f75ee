"""Binding a schedule to built models, optimizers and losses, checking DESIGN's rules.

``bind`` resolves every beat's selectors to variables, builds each optimizer for
exactly the variables its beats update, and traces every beat's loss once (without
running it) to find variables that would get no gradient. All problems are collected and
raised together as one ``ScheduleError``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping

import keras
import tensorflow as tf

from beatloop.core.compiled.applying import combine_problems
from beatloop.core.compiled.bound import BoundBeat, BoundGroup, BoundSchedule
from beatloop.core.compiled.gating import conditioned_updates, gated_groups
from beatloop.core.compiled.gradient_probe import GradientProbe
from beatloop.core.compiled.randomness import new_operations
from beatloop.core.compiled.update_binding import bind_updates, in_step_order, written_by
from beatloop.core.compiled.writes import write_problems
from beatloop.core.failures.errors import ScheduleError, did_you_mean
from beatloop.core.schedule.beats import Beat, Group, Schedule

__all__ = [
    "BoundBeat",
    "BoundGroup",
    "BoundSchedule",
    "bind",
    "build_optimizers",
    "select",
    "variable_owner",
]


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
    *,
    forwards: Mapping[str, Callable] | None = None,
    supplied: frozenset[str] = frozenset(),
    state: Mapping[str, tf.Variable] | None = None,
    build: bool = True,
    probe: bool = True,
    methods: Mapping[str, Callable] | None = None,
) -> BoundSchedule:
    """Check every rule, build optimizers, and return the bound schedule.

    With ``batch_spec`` given, every beat's loss is traced once on a batch of that spec
    to find claimed variables its loss gives no gradient to, and every ``Update``'s and
    ``Act``'s function once to find what it assigns. ``random``
    is the generator losses draw noise from (a fresh one seeded with 0 if omitted). With
    a ``strategy`` the probe is traced on its replicas, where distributed variables have
    gradients. ``forwards`` are the forward functions the schedule's groups name.
    Variables of the ``supplied`` models (the recipe's ``supplied_models``) that no beat
    updates count as frozen without being declared so. ``state`` is the recipe's state
    (``Recipe.build_state``), which losses reach as ``models.state``. ``build=False``
    leaves the optimizers unbuilt (phases build each for its variables over all phases
    first: ``build_optimizers``). ``probe=False``: the caller's trace checks gradients.
    ``methods`` are the recipe's methods that ``only_if=`` names.
    """
    state = dict(state or {})
    random = tf.random.Generator.from_seed(0) if random is None else random
    forwards = forwards or {}
    problems = [p for b in schedule.all_beats for p in _names(b, models, optimizers, losses)]
    problems += [p for g in schedule.groups for p in _group_problems(g, models, forwards)]
    resolved = {beat.name: _selected(beat, models, problems) for beat in schedule.all_beats}
    updates = bind_updates(schedule, models, problems, select)
    updates = conditioned_updates(schedule, updates, methods or {}, problems)
    writers = written_by(updates)
    problems += _ownership_problems(schedule, models, resolved, problems, supplied, writers)
    problems += [p for g in schedule.groups for p in combine_problems(g, resolved)]
    groups: list[BoundGroup] = []
    if not problems:
        groups = _bind_groups(schedule, optimizers, losses, forwards, resolved, models)
        groups = gated_groups(schedule, groups, methods or {}, problems)
        if build:
            problems += build_optimizers([beat for group in groups for beat in group.beats])
    if batch_spec is not None and not problems:
        probed = (groups, models, batch_spec, random, strategy, context, state)
        problems += _gradient_problems(*probed) if probe else []
        problems += write_problems(updates, models, batch_spec, random, state, strategy)
    if problems:
        raise ScheduleError(problems, context)
    beats = tuple(beat for group in groups for beat in group.beats)
    entries = in_step_order(schedule, groups, updates)
    return BoundSchedule(
        schedule, beats, tuple(groups), dict(models), dict(optimizers), random, state, entries
    )


def _selected(beat: Beat, models, problems: list[str]) -> list[keras.Variable]:
    """The variables a beat's ``updates`` select, each once (problems noted)."""
    where = f"beat {beat.name!r}"
    return _unique(
        v for selector in beat.updates for v in select(selector, models, problems, where)
    )


def _names(beat: Beat, models, optimizers, losses) -> list[str]:
    """A beat's loss, optimizer and training-mode models that do not exist."""
    where = f"beat {beat.name!r}"
    return [
        *_unknown(where, "loss", beat.loss, losses, "the recipe does not define"),
        *_unknown(where, "optimizer", beat.optimizer, optimizers, "the recipe does not define"),
        *_unknown_modes(where, beat.training, models),
    ]


def _group_problems(group: Group, models, forwards) -> list[str]:
    """A group's forward and training-mode models that do not exist."""
    where = f"group {group.name!r}"
    return [
        *_unknown(where, "forward", group.forward, forwards, "the recipe's forwards() lacks"),
        *_unknown_modes(where, group.training, models),
    ]


def _unknown(where: str, kind: str, name: str, defined, source: str) -> list[str]:
    """``where`` uses ``kind`` ``name``, which is not among ``defined``: one problem."""
    if name in defined:
        return []
    return [
        f"{where} uses {kind} {name!r}{did_you_mean(name, defined)}, which {source}; "
        f"{'losses' if kind == 'loss' else kind + 's'}: {', '.join(defined) or '(none)'}"
    ]


def _unknown_modes(where: str, training, models) -> list[str]:
    """The models named in a ``training`` tuple that do not exist."""
    return [
        f"{where} runs {name!r} in training mode, but there is no such model; "
        f"models: {', '.join(models)}"
        for name in training or ()
        if name not in models
    ]


def _ownership_problems(
    schedule: Schedule,
    models,
    resolved: Mapping[str, list],
    problems: list[str],
    supplied: frozenset[str] = frozenset(),
    writers: Mapping[int, list[str]] | None = None,
) -> list[str]:
    """Variables no beat updates, no update writes and nobody froze (a supplied model's
    are frozen unless a beat updates them), frozen ones a beat updates or an update
    writes, and ones two beats (or a beat and an update, or two updates) update without
    being declared shared. (Selector problems of ``frozen`` and ``shared`` go to
    ``problems``.)"""
    claimed: dict[int, list[str]] = {}
    for name, variables in resolved.items():
        for variable in variables:
            claimed.setdefault(id(variable), []).append(name)
    frozen = {id(v) for s in schedule.frozen for v in select(s, models, problems, "frozen")}
    shared = {id(v) for s in schedule.shared for v in select(s, models, problems, "shared")}
    # A supplied model is frozen unless a beat updates it: no declaration needed.
    exempt = {id(v) for n in set(supplied) & set(models) for v in models[n].trainable_variables}
    owner = variable_owner(models)
    found = []
    for model in models.values():
        for variable in model.trainable_variables:
            key, beats = id(variable), claimed.get(id(variable), [])
            where = f"variable {variable.path!r} of model {owner[key]!r}"
            written = (writers or {}).get(key, [])
            if written:
                found += _written_problems(where, written, beats, key in frozen, key in shared)
            elif not beats and key not in frozen and key not in exempt:
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


def _written_problems(where: str, updates, beats, frozen: bool, shared: bool) -> list[str]:
    """A variable an update writes (it owns it): refused if declared frozen, or if a beat
    or another update also writes it without its being declared shared."""
    found = []
    if frozen:
        found.append(
            f"{where} is declared frozen but update(s) {updates} write it (an update owns "
            "what it writes: take it out of Schedule(frozen=...))"
        )
    if (beats or len(set(updates)) > 1) and not shared:
        others = f"beat(s) {beats} and " if beats else ""
        found.append(
            f"{where} is written by {others}update(s) {updates} but not declared shared "
            "(add it to Schedule(shared=...) if that is intended)"
        )
    return found


def _unique(variables) -> list[keras.Variable]:
    seen: dict[int, keras.Variable] = {}
    for variable in variables:
        seen.setdefault(id(variable), variable)
    return list(seen.values())


def _bind_groups(schedule, optimizers, losses, forwards, resolved, models) -> list[BoundGroup]:
    """Every entry of the step bound: a lone beat, or a group whose beats all run in the
    group's training mode (by default: every model any of its beats updates)."""
    owner = variable_owner(models)

    def updated(beat: Beat) -> tuple[str, ...]:
        return tuple(dict.fromkeys(owner[id(v)] for v in resolved[beat.name]))

    def bound(beat: Beat, training: frozenset[str], group: Group | None) -> BoundBeat:
        variables = tuple(resolved[beat.name])
        optimizer = optimizers[beat.optimizer]
        loss_fn = losses[beat.loss]
        return BoundBeat(beat, loss_fn, optimizer, variables, updated(beat), training, group)

    groups = []
    for entry in schedule.beats:
        if not isinstance(entry, Beat | Group):
            continue
        if isinstance(entry, Beat):
            mode = frozenset(updated(entry) if entry.training is None else entry.training)
            groups.append(BoundGroup.alone(bound(entry, mode, None)))
            continue
        everyone = (name for beat in entry.beats for name in updated(beat))
        mode = frozenset(everyone if entry.training is None else entry.training)
        beats = tuple(bound(beat, mode, entry) for beat in entry.beats)
        forward_fn = forwards[entry.forward]
        groups.append(
            BoundGroup(
                entry.name, beats, forward_fn, mode, entry.repeat, entry.every, entry.combine
            )
        )
    return groups


def build_optimizers(bound_beats: list[BoundBeat]) -> list[str]:
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
    groups, models, batch_spec, random, strategy=None, context="the schedule", state=None
) -> list[str]:
    """Trace each beat's loss and gradients (nothing runs) and report None gradients;
    warn of losses that draw from global random ops (they break exact resume)."""
    probe = GradientProbe(context)

    def trace(batch):
        for group in groups:
            with new_operations() as created:
                _, _, gradients = group.gradients(models, batch, random=random, state=state)
            probe.seen(group, gradients, created)
        return tf.constant(0)

    if strategy is None:
        tf.function(trace, autograph=False).get_concrete_function(dict(batch_spec))
    else:  # traced once per replica: the same problems, found twice
        distributed = lambda batch: strategy.run(trace, args=(batch,))  # noqa: E731
        tf.function(distributed, autograph=False).get_concrete_function(dict(batch_spec))
    return probe.found()
