"""Assembling a run's parts: models under the precision policy and the strategy's scope,
optimizers, the bound schedule, metrics, the compiled loops, the recipe's callbacks and
the run record, from a recipe and its data (``assemble``)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import attrs
import keras
import tensorflow as tf

from beatloop.core.compiled.binding import BoundSchedule
from beatloop.core.compiled.building import build_unbuilt
from beatloop.core.compiled.counters import Counters
from beatloop.core.compiled.gating import condition_methods, counted_beats
from beatloop.core.compiled.gradient_probe import raise_found, run_probes
from beatloop.core.compiled.loop import CompiledLoop
from beatloop.core.compiled.metrics import StepMetrics
from beatloop.core.compiled.numerics import DivergenceGuard
from beatloop.core.compiled.op_errors import data_errors, schedule_errors
from beatloop.core.compiled.phased import PhasedRun, bind_schedule, in_phase, phase_parts
from beatloop.core.compiled.step import TrainStep, ValidationStep
from beatloop.core.compiled.user_code import as_written, in_recipe, recipe_functions
from beatloop.core.data.batches import DataSplit, check_split
from beatloop.core.devices.collectives import Gathering
from beatloop.core.devices.replicas import splits_batches
from beatloop.core.devices.strategy_scope import check_every, check_made_in_scope
from beatloop.core.events.callbacks import Callback
from beatloop.core.events.update_watch import run_watches
from beatloop.core.failures.errors import (
    ConfigError,
    did_you_mean,
)
from beatloop.core.running.naming import RunNames, warn_history_named
from beatloop.core.running.options import EngineOptions
from beatloop.core.running.recipe import Recipe, defines, recipe_callbacks
from beatloop.core.saving.record import RunRecord
from beatloop.core.schedule.recipe_state import built_state
from beatloop.core.schedule.supplied import loaded, missing_models


@attrs.frozen
class RunParts:
    """Everything one run is made of, built and checked, ready for the engine's loop."""

    recipe: Recipe
    label: str
    bound: BoundSchedule
    counters: Counters
    train_metrics: StepMetrics
    validation_metrics: StepMetrics
    train_loop: CompiledLoop
    validation_loop: CompiledLoop | None
    #: The recipe's own callbacks: its epoch figures, pictures, loss weights.
    callbacks: tuple[Callback, ...]
    record: RunRecord
    #: The divergence guard (``divergence=``), or ``None`` when it is off.
    divergence: DivergenceGuard | None = None
    #: What validation draws noise from: its own generator, reset to the run's seed at
    #: the start of every validation pass (``beatloop.core.running.evaluation``), so the same
    #: weights on the same data give the same figures, and validating draws nothing
    #: from the run's generator (training is the same with or without it).
    validation_random: tf.random.Generator | None = None
    #: The run's Keras name counters: its parts were built and traced in their scope,
    #: and so is any loop traced later (``beatloop.core.running.naming``).
    names: RunNames = attrs.field(factory=RunNames)
    #: A recipe in phases: each phase's parts (the fields above hold the first's until
    #: the engine enters another: ``beatloop.core.compiled.phased``); ``None`` without phases.
    phased: PhasedRun | None = None

    def guards(self) -> list[DivergenceGuard]:
        """The divergence guards of every phase (checkpointed); none with the guard off."""
        if self.phased is not None:
            return self.phased.guards()
        return [] if self.divergence is None else [self.divergence]


def assemble(
    recipe: Recipe,
    data: DataSplit,
    options: EngineOptions,
    *,
    models: Mapping[str, keras.Layer | str | Path] | None = None,
    optimizers: Mapping[str, keras.optimizers.Optimizer] | None = None,
    seed: int = 0,
    label: str | None = None,
    strategy: tf.distribute.Strategy | None = None,
    trains: bool = True,
) -> RunParts:
    """Build and check every part of a run of ``recipe`` on ``data``; ``models`` (or
    ``.keras`` paths) and ``optimizers`` replace the recipe's parts of the same names.
    Everything is built and traced under the run's own Keras name counters, so the
    graphs do not depend on what the process built before. ``trains=False`` (a run
    rebuilt to evaluate or restore): the training loop is traced on its first call,
    if any, and its gradients checked then."""
    label = label or f"recipe {recipe.name!r}"
    warn_history_named(models or {}, label)
    names = RunNames()
    with names.scope():
        parts = _assemble(recipe, data, options, models, optimizers, seed, label, strategy, trains)
    return in_phase(attrs.evolve(parts, names=names), 0)  # in phases: the first's parts


def _assemble(
    recipe, data, options, models, optimizers, seed, label, strategy, trains
) -> RunParts:  # fmt: skip
    _check_strategy(strategy, options)
    counters = Counters()  # host counters, advanced outside the replicas
    spec = data.train.element_spec
    check_split(data, recipe.batch_keys, recipe.check_batch_spec, label, recipe.nested_keys)
    with _scope(strategy):
        random, validation_random = (tf.random.Generator.from_seed(seed) for _ in "tv")
        with dtype_policy(options.precision):
            recipe.read_training_data(data.train)  # its vocabularies, before its models
            built_models = _models(recipe, spec, models, label)
            check_made_in_scope(strategy, built_models, models, optimizers, label)
            state = built_state(recipe, label)
            with data_errors("training", label):  # models meet the training data here
                build_unbuilt(recipe, built_models, spec, random, label, state)  # traced
        built_optimizers = _replaced(recipe.build_optimizers(), optimizers, "optimizer", label)
        if options.precision == "mixed_float16":
            built_optimizers = {name: loss_scaled(o) for name, o in built_optimizers.items()}
        schedule = recipe.schedule()
        # A compiled loop finds the gradients' problems in its own trace (one trace).
        probed = strategy is None and not options.debug
        with data_errors("training", label):
            bounds = _bind(recipe, schedule, built_models, built_optimizers, spec, random,
                           label, strategy, state, probe=not probed)  # fmt: skip
        check_every(strategy, bounds, label)
        beats = [beat for bound in bounds for beat in bound.beats]  # a phase's after another's
        beat_names = list(dict.fromkeys(beat.name for beat in beats))
        logged = {"last_logged": [b.name for b in beats if b.log == "last"], "last": True}
        train_metrics = StepMetrics(
            beat_names, recipe.build_metrics(), counted=counted_beats(bounds), **logged
        )
        validation_metrics = StepMetrics(beat_names, recipe.build_metrics(), prefix="val_")
    # Like the counters, outside the replicas: updated on the checks summed over them.
    guards = [_guard(bound, options) for bound in bounds]
    # The loops are traced here: a recipe's mistakes, and data that does not fit, show now.
    probes = run_probes(schedule, label, trains) if probed else [None] * len(bounds)
    loops = [
        _loops(recipe, data, bound, counters, train_metrics, validation_metrics, options,
               strategy, label, guard, validation_random, probe, trace_now=trains)
        for bound, guard, probe in zip(bounds, guards, probes, strict=True)
    ]  # fmt: skip
    if probed and trains:
        raise_found(probes)
    phased = phase_parts(schedule, bounds, loops, guards, train_metrics, validation_metrics)
    return RunParts(
        recipe=recipe,
        label=label,
        bound=bounds[0],
        counters=counters,
        train_metrics=train_metrics,
        validation_metrics=validation_metrics,
        train_loop=loops[0][0],
        validation_loop=loops[0][1],
        callbacks=(*recipe_callbacks(recipe), *run_watches(beats, bounds, options.divergence)),
        record=RunRecord.of(recipe, bounds[0], spec, seed, options.precision, schedule),
        divergence=guards[0],
        validation_random=validation_random,
        phased=phased,
    )


def _guard(bound: BoundSchedule, options: EngineOptions) -> DivergenceGuard | None:
    if options.divergence is None:
        return None
    return DivergenceGuard(bound.beats, options.divergence, options.divergence_window)


def _loops(
    recipe, data, bound, counters, train_metrics, validation_metrics, options, strategy, label,
    divergence=None, validation_random=None, probe=None, trace_now=True,
):  # fmt: skip
    """The compiled training loop and, with validation data, the validation loop, each
    traced on its own data set's spec (errors name the recipe ``label`` and the data;
    the training loop on its first call instead when not ``trace_now``); the training
    step records what its gradients lack in ``probe``, if given."""
    common = _compile_options(options, strategy)
    steps = options.largest_steps_per_execution
    train_step = TrainStep(
        bound, train_metrics, as_written(recipe, recipe.update_metrics), debug=options.debug,
        strategy=strategy, divergence=divergence, check_gradients=options.check_gradients,
        gathering=Gathering.of(data.train, strategy, steps, "training"), probe=probe,
    )  # fmt: skip
    spec = data.train.element_spec  # errors of its losses read as in bind's own trace
    with schedule_errors(label, spec), data_errors("training", label), in_recipe(label, spec):
        train_loop = CompiledLoop(
            train_step,
            options.largest_steps_per_execution,
            spec,
            checks=len(bound.beats),
            divergence=divergence,
            counters=counters,
            fetch_ahead=options.on_nan != "rollback",  # a rollback goes on at the next batch
            trace_now=trace_now,
            **common,
        )
    if data.validation is None:
        return train_loop, None
    validation = validation_loop(
        recipe, bound, validation_metrics, data.validation.element_spec, options,
        steps_per_execution=steps, strategy=strategy, label=label, random=validation_random,
        gathering=Gathering.of(data.validation, strategy, steps, "validation"),
    )  # fmt: skip
    return train_loop, validation


def validation_loop(
    recipe: Recipe,
    bound: BoundSchedule,
    metrics: StepMetrics,
    spec,
    options: EngineOptions,
    *,
    steps_per_execution: int,
    strategy: tf.distribute.Strategy | None,
    label: str,
    random: tf.random.Generator | None = None,
    role: str = "validation",
    gathering: Gathering | None = None,
) -> CompiledLoop:
    """The compiled loop of validation steps (every beat's loss and the metrics, models in
    inference mode) traced for batches of ``spec``: the run's validation loop, and the one
    an evaluation on other data (``role``) runs; ``gathering``: how its gathers pad."""
    update = as_written(recipe, recipe.update_metrics)
    step = ValidationStep(
        bound, metrics, update, strategy=strategy, random=random, gathering=gathering
    )
    with data_errors(role, label), in_recipe(label, spec):
        return CompiledLoop(step, steps_per_execution, spec, **_compile_options(options, strategy))


def _compile_options(options: EngineOptions, strategy) -> dict:
    return {
        "compiled": not options.debug,
        "jit_compile": options.jit_compile,
        "distributed": splits_batches(strategy),  # one replica: plain iterators
    }


def _check_strategy(strategy, options: EngineOptions) -> None:
    if strategy is None:
        return
    if not isinstance(strategy, tf.distribute.Strategy):
        raise ConfigError(
            f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}"
        )
    if options.jit_compile or options.debug:
        raise ConfigError(
            "a distribution strategy runs compiled steps without XLA: drop "
            + ("jit_compile" if options.jit_compile else "debug")
        )


def _scope(strategy):
    """The strategy's scope (variables made in it are mirrored), or no scope at all."""
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


@contextlib.contextmanager
def dtype_policy(name: str):
    """Keras's global dtype policy set to ``name`` while models are built, then put back:
    layers keep the policy they were built with, and nothing leaks to later code."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def loss_scaled(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """``optimizer`` wrapped in dynamic loss scaling (float16 gradients would underflow
    without it); an optimizer that already scales is kept as it is."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    return keras.optimizers.LossScaleOptimizer(optimizer)


def _models(recipe: Recipe, spec, given: Mapping | None, label: str) -> dict:
    """The recipe's models (none when it defines no ``build_models``) with the user's in
    their places (``.keras`` paths loaded), then those it derives from them (copies);
    every required model the user did not give is named in one error."""
    given = dict(given or {})
    builds = defines(recipe, "build_models")
    built = recipe.build_models(spec) if builds else {}
    names = recipe.model_names()
    known = list(dict.fromkeys([*built, *names]))  # names: the schedule's, then supplied
    _refuse_unknown(given, known, "model", label)  # a misspelt name before a missing one
    models = _replaced(built, loaded(given), "model", label, known)
    models.update({n: m for n, m in recipe.derived_models(models).items() if n not in given})
    missing_models(label, recipe.supplied_models, models, None if builds else names)
    return models


def _refuse_unknown(given: Mapping, known, kind: str, label: str) -> None:
    for name in given:
        if name not in known:
            raise ConfigError(
                f"{label} has no {kind} named {name!r}"
                f"{did_you_mean(name, known)}; its {kind}s: {', '.join(known) or '(none)'}"
            )


def _replaced(
    built: Mapping, replacements: Mapping | None, kind: str, label: str, known=None
) -> dict:
    """The recipe's parts with the user's replacements, refusing names it does not have
    (``known``: the names accepted, by default those of ``built``)."""
    parts, replacements = dict(built), dict(replacements or {})
    _refuse_unknown(replacements, list(parts) if known is None else known, kind, label)
    expected = keras.Layer if kind == "model" else keras.optimizers.Optimizer
    for name, part in replacements.items():
        if not isinstance(part, expected):
            also = " or the path of a .keras file" if kind == "model" else ""
            raise ConfigError(
                f"{kind} {name!r} must be a {expected.__module__}.{expected.__name__}{also}, "
                f"got {type(part).__name__}"
            )
        parts[name] = part
    return parts


def _bind(
    recipe, schedule, models, optimizers, spec, random, label: str, strategy=None, state=None,
    probe=True,
):  # fmt: skip
    """The schedule bound (every phase's, for a recipe in phases), as a tuple; ``probe``:
    whether its gradients are traced to check them (``binding.bind``)."""
    with schedule_errors(label, spec):
        return bind_schedule(
            schedule,
            models,
            optimizers,
            recipe_functions(recipe, recipe.losses()),
            spec,
            context=f"the schedule of {label}",
            random=random,
            strategy=strategy,
            forwards=recipe_functions(recipe, recipe.forwards()),
            supplied=frozenset(recipe.supplied_models),
            state=state,
            probe=probe,
            methods=condition_methods(recipe, schedule),
        )
