"""The engine: builds a recipe's parts, binds its schedule, and runs epochs.

Shaped like Orbit's controller: the epoch loop and every event run eagerly in Python
around one compiled inner loop (:class:`~beatloop.core.step.CompiledLoop`) of K steps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import keras
import tensorflow as tf

from beatloop.core.batches import DataSplit, check_batch_spec
from beatloop.core.binding import BoundSchedule, bind
from beatloop.core.callbacks import Callback, CallbackList, LazyLogs, Run
from beatloop.core.errors import BeatloopError, ConfigError, DataError, did_you_mean
from beatloop.core.forward import forward
from beatloop.core.recipe import Recipe
from beatloop.core.state import EngineState, StepMetrics
from beatloop.core.step import CompiledLoop, make_train_step, make_validation_step


@attrs.frozen
class EngineOptions:
    """How the engine runs steps, independent of what the recipe computes."""

    steps_per_execution: int = attrs.field(
        default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)]
    )
    debug: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    steps_per_epoch: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(
            [attrs.validators.instance_of(int), attrs.validators.ge(1)]
        ),
    )


class Engine:
    """Runs one recipe on one data split: ``Engine(recipe, data).fit(epochs)``.

    ``models`` and ``optimizers`` replace the recipe's parts of the same names (the names
    ``beatloop show`` prints).
    """

    def __init__(
        self,
        recipe: Recipe,
        data: DataSplit,
        *,
        models: Mapping[str, keras.Layer] | None = None,
        optimizers: Mapping[str, keras.optimizers.Optimizer] | None = None,
        callbacks: Sequence[Callback] = (),
        options: EngineOptions = EngineOptions(),
        run_dir: Path | None = None,
        seed: int = 0,
        label: str | None = None,
    ):
        self.recipe = recipe
        self.label = label or f"recipe {recipe.name!r}"
        self.data = data
        self.options = options
        self.state = EngineState()
        spec = data.train.element_spec
        _check_data(recipe, data, self.label)
        built_models = _replace(recipe.build_models(spec), models, "model", self.label)
        _build_unbuilt(recipe, built_models, spec, self.label)
        built_optimizers = _replace(recipe.build_optimizers(), optimizers, "optimizer", self.label)
        self.bound: BoundSchedule = _bind(recipe, built_models, built_optimizers, spec, self.label)
        beat_names = [b.beat.name for b in self.bound.beats]
        self.train_metrics = StepMetrics(beat_names, recipe.build_metrics())
        self.validation_metrics = StepMetrics(beat_names, recipe.build_metrics(), prefix="val_")
        compiled = not options.debug
        self.train_loop = CompiledLoop(
            make_train_step(
                self.bound,
                self.state,
                self.train_metrics,
                recipe.update_metrics,
                check_numerics=options.debug,
            ),
            options.steps_per_execution,
            spec,
            compiled=compiled,
        )
        self.validation_loop = None
        if data.validation is not None:
            self.validation_loop = CompiledLoop(
                make_validation_step(self.bound, self.validation_metrics, recipe.update_metrics),
                options.steps_per_execution,
                data.validation.element_spec,
                compiled=compiled,
            )
        steps_per_epoch = _steps_per_epoch(data, options)
        self.callbacks = CallbackList(callbacks)
        self._iterator = None
        self.run = Run(
            recipe=recipe,
            bound=self.bound,
            state=self.state,
            run_dir=run_dir,
            epochs=0,
            steps_per_execution=options.steps_per_execution,
            steps_per_epoch=steps_per_epoch,
            seed=seed,
        )

    def fit(self, epochs: int) -> dict[str, float]:
        """Run epochs until ``epochs`` have completed; return the last epoch's logs."""
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ConfigError(f"epochs must be an integer >= 1, got {epochs!r}")
        run = self.run
        run.epochs = epochs
        logs: dict[str, float] = {}
        self.callbacks.fire("fit_start", run)
        try:
            for epoch in range(int(self.state.epoch), epochs):
                logs = self._run_epoch(run, epoch)
                if run.stop_training:
                    break
        except BaseException as error:
            self.callbacks.fire("exception", run, error)
            raise
        self.callbacks.fire("fit_end", run, logs)
        return logs

    def _run_epoch(self, run: Run, epoch: int) -> dict[str, float]:
        self.train_metrics.reset()
        self.callbacks.fire("epoch_start", run, epoch)
        # With steps_per_epoch set, one iterator spans epochs (as with Keras); otherwise
        # each epoch is one pass over the data.
        if self._iterator is None or self.options.steps_per_epoch is None:
            self._iterator = iter(self.data.train)
        target, steps = run.steps_per_epoch, 0
        while True:
            limit = self.options.steps_per_execution
            if target is not None:
                limit = min(limit, target - steps)
            self.callbacks.fire("execution_start", run)
            ran = _run_compiled(self.train_loop, self._iterator, limit, "training")
            steps += ran
            self.callbacks.fire("execution_end", run, ran, LazyLogs(self.train_metrics.named()))
            if ran < limit:  # the data ran out; start afresh next epoch
                self._iterator = None
                break
            if steps == target:
                break
        if steps == 0:
            raise DataError(f"the training data set gave no batches in epoch {epoch}")
        logs = self.train_metrics.results()
        if self.validation_loop is not None:
            logs.update(self.validate(run))
        logs.update(self.recipe.epoch_figures(run))
        self.state.epoch.assign(epoch + 1)
        self.callbacks.fire("epoch_end", run, epoch, logs)
        return logs

    def validate(self, run: Run) -> dict[str, float]:
        """Every beat's loss and the metrics on the validation data, all models in
        inference mode; touches no trainable variable."""
        self.validation_metrics.reset()
        self.callbacks.fire("validation_start", run)
        iterator = iter(self.data.validation)
        limit = self.options.steps_per_execution
        while _run_compiled(self.validation_loop, iterator, limit, "validation") == limit:
            pass
        logs = self.validation_metrics.results()
        self.callbacks.fire("validation_end", run, logs)
        return logs


def _check_data(recipe: Recipe, data: DataSplit, label: str) -> None:
    problems = []
    for role, dataset in (("training", data.train), ("validation", data.validation)):
        if dataset is None:
            continue
        spec = dataset.element_spec
        problems += check_batch_spec(spec, recipe.batch_keys, label, role)
        if not problems:
            problems += [f"{role} data: {p}" for p in recipe.check_batch_spec(spec)]
    if data.validation is not None and not problems:
        train, validation = data.train.element_spec, data.validation.element_spec
        for key in sorted(set(train) & set(validation)):
            if train[key].dtype != validation[key].dtype or not train[key].shape[
                1:
            ].is_compatible_with(validation[key].shape[1:]):
                problems.append(
                    f"validation batch {key!r} is {validation[key]} but training batch "
                    f"{key!r} is {train[key]}"
                )
    if problems:
        raise DataError("; ".join(problems))


def _run_compiled(loop: CompiledLoop, iterator, limit: int, role: str) -> int:
    """Run a compiled loop; a TensorFlow error raised by the data in a step (a label out
    of range, a bad cast) becomes one readable DataError."""
    try:
        return loop(iterator, limit)
    except tf.errors.InvalidArgumentError as error:
        raise DataError(f"a {role} step failed on its batch: {_op_error_summary(error)}") from None


def _op_error_summary(error: tf.errors.OpError) -> str:
    """The cause of a graph error without its traceback: its last paragraph and the op."""
    message = (error.message or str(error)).strip()
    cause = " ".join(message.split("\n\n")[-1].split())
    if len(cause) > 300:
        cause = cause[:300] + "..."
    node = re.search(r"Detected at node (\S+)", message)
    return f"{cause} (in op {node.group(1)})" if node else cause


def _steps_per_epoch(data: DataSplit, options: EngineOptions) -> int | None:
    """Steps in one epoch: the option if given, else the data set's length if known."""
    for role, dataset in (("training", data.train), ("validation", data.validation)):
        if dataset is None or dataset.cardinality() != tf.data.INFINITE_CARDINALITY:
            continue
        if role == "validation" or options.steps_per_epoch is None:
            raise DataError(
                f"the {role} data set repeats forever (.repeat() without a count); "
                + ("give it an end" if role == "validation" else "pass steps_per_epoch=N")
            )
    if options.steps_per_epoch is not None:
        return options.steps_per_epoch
    cardinality = int(data.train.cardinality())
    return cardinality if cardinality >= 0 else None


def _replace(built: Mapping, replacements: Mapping | None, kind: str, label: str) -> dict:
    """The recipe's parts with the user's replacements, refusing names it does not have."""
    parts = dict(built)
    for name, part in (replacements or {}).items():
        if name not in parts:
            raise ConfigError(
                f"{label} has no {kind} named {name!r}"
                f"{did_you_mean(name, parts)}; its {kind}s: {', '.join(parts)}"
            )
        expected = keras.Layer if kind == "model" else keras.optimizers.Optimizer
        if not isinstance(part, expected):
            raise ConfigError(
                f"{kind} {name!r} must be a {expected.__module__}.{expected.__name__}, "
                f"got {type(part).__name__}"
            )
        parts[name] = part
    return parts


def _build_unbuilt(recipe: Recipe, models: Mapping[str, keras.Layer], spec, label: str) -> None:
    """Create the variables of models built lazily (e.g. ``Sequential`` without ``Input``)
    by running every loss once in inference mode on a zero batch of the data's spec."""
    if all(model.built for model in models.values()):
        return
    batch = {
        key: tf.zeros([1 if d is None else d for d in s.shape.as_list()], s.dtype)
        for key, s in spec.items()
    }
    for name, loss_fn in recipe.losses().items():
        try:
            forward(loss_fn, name, models, frozenset(), (), batch)
        except BeatloopError:
            raise
        except Exception as error:  # a user's model meeting the data: say which, briefly
            raise DataError(_failure(label, name, spec, error)) from None


def _bind(recipe, models, optimizers, spec, label: str) -> BoundSchedule:
    try:
        return bind(
            recipe.schedule(),
            models,
            optimizers,
            recipe.losses(),
            spec,
            context=f"{label}'s schedule",
        )
    except BeatloopError:
        raise
    except (ValueError, TypeError, tf.errors.OpError) as error:
        raise DataError(_failure(label, "schedule", spec, error)) from None


def _failure(label: str, what: str, spec, error: Exception) -> str:
    shapes = ", ".join(f"{k}: {tuple(s.shape)} {s.dtype.name}" for k, s in spec.items())
    message = str(error).strip().splitlines()
    detail = " ".join(line.strip() for line in message[:6])
    return (
        f"{label}: running its {what} on batches of {{{shapes}}} failed: "
        f"{type(error).__name__}: {detail}"
    )
