"""The engine: builds a recipe's parts, binds its schedule, and runs epochs.

Shaped like Orbit's controller: the epoch loop and every event run eagerly in Python
around one compiled inner loop (:class:`~beatloop.core.step.CompiledLoop`) of K steps.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import keras
import tensorflow as tf

from beatloop.core.batches import DataSplit, check_batch_spec
from beatloop.core.binding import BoundSchedule, bind
from beatloop.core.callbacks import Callback, CallbackList, LazyLogs, Run
from beatloop.core.checkpoints import RunCheckpoints
from beatloop.core.errors import (
    BeatloopError,
    ConfigError,
    DataError,
    NumericsError,
    RunInterrupted,
    did_you_mean,
)
from beatloop.core.forward import forward
from beatloop.core.recipe import Recipe
from beatloop.core.state import EngineState, StepMetrics
from beatloop.core.step import (
    CompiledLoop,
    LoopResult,
    describe_checks,
    make_train_step,
    make_validation_step,
)

ON_NAN = ("raise", "rollback")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
_int = attrs.validators.instance_of(int)


@attrs.frozen
class EngineOptions:
    """How the engine runs steps, independent of what the recipe computes.

    ``checkpoint_every``: also checkpoint mid-epoch, at the first call boundary at or
    after every N steps (a run with a run dir always checkpoints at each epoch's end).
    ``max_to_keep``: checkpoints kept on disk. ``on_nan``: what a non-finite loss or
    gradient norm does: ``"raise"`` stops the run, ``"rollback"`` restores the last
    checkpoint and goes on after the offending batch, at most ``max_rollbacks`` times.
    ``jit_compile``: compile the training and validation steps with XLA. ``precision``:
    ``"mixed_float16"`` or ``"mixed_bfloat16"`` builds the recipe's models under that
    Keras policy (float32 variables, half-precision compute; outputs reach the losses
    as float32), and for float16 wraps every optimizer in loss scaling.
    """

    steps_per_execution: int = attrs.field(
        default=1, validator=[_int, attrs.validators.ge(1), attrs.validators.lt(1 << 20)]
    )
    debug: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    steps_per_epoch: int | None = attrs.field(
        default=None, validator=attrs.validators.optional([_int, attrs.validators.ge(1)])
    )
    checkpoint_every: int | None = attrs.field(
        default=None, validator=attrs.validators.optional([_int, attrs.validators.ge(1)])
    )
    max_to_keep: int = attrs.field(default=3, validator=[_int, attrs.validators.ge(1)])
    on_nan: str = attrs.field(default="raise", validator=attrs.validators.in_(ON_NAN))
    max_rollbacks: int = attrs.field(default=3, validator=[_int, attrs.validators.ge(0)])
    jit_compile: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    precision: str = attrs.field(default="float32", validator=attrs.validators.in_(PRECISIONS))


class Engine:
    """Runs one recipe on one data split: ``Engine(recipe, data).fit(epochs)``.

    ``models`` and ``optimizers`` replace the recipe's parts of the same names (the names
    ``beatloop show`` prints). With a ``run_dir`` the engine checkpoints into
    ``run_dir/checkpoints`` and ``fit`` continues from the latest checkpoint there.
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
        strategy: tf.distribute.Strategy | None = None,
    ):
        self.recipe = recipe
        self.label = label or f"recipe {recipe.name!r}"
        self.data = data
        self.options = options
        self.seed = seed
        self.strategy = strategy
        _check_strategy(strategy, options)
        self.state = EngineState()  # host counters, advanced outside the replicas
        spec = data.train.element_spec
        _check_data(recipe, data, self.label)
        with _scope(strategy):
            self.random = tf.random.Generator.from_seed(seed)
            with dtype_policy(options.precision):
                built_models = _replace(recipe.build_models(spec), models, "model", self.label)
                _build_unbuilt(recipe, built_models, spec, self.random, self.label)
            built_optimizers = _replace(
                recipe.build_optimizers(), optimizers, "optimizer", self.label
            )
            if options.precision == "mixed_float16":
                built_optimizers = {name: loss_scaled(o) for name, o in built_optimizers.items()}
            self.bound: BoundSchedule = _bind(
                recipe, built_models, built_optimizers, spec, self.random, self.label, strategy
            )
            beat_names = [b.beat.name for b in self.bound.beats]
            self.train_metrics = StepMetrics(beat_names, recipe.build_metrics())
            self.validation_metrics = StepMetrics(beat_names, recipe.build_metrics(), prefix="val_")
        self._train_data = _distributed(strategy, data.train)
        self._validation_data = _distributed(strategy, data.validation)
        compiled = not options.debug
        self.train_loop = CompiledLoop(
            make_train_step(
                self.bound,
                self.state,
                self.train_metrics,
                recipe.update_metrics,
                check_numerics=options.debug,
                strategy=strategy,
            ),
            options.steps_per_execution,
            spec,
            checks=len(self.bound.beats),
            counters=(self.state.stream_batches, self.state.epoch_batches),
            compiled=compiled,
            jit_compile=options.jit_compile,
            distributed=strategy is not None,
        )
        self.validation_loop = None
        if data.validation is not None:
            self.validation_loop = CompiledLoop(
                make_validation_step(
                    self.bound,
                    self.validation_metrics,
                    recipe.update_metrics,
                    strategy=strategy,
                ),
                options.steps_per_execution,
                data.validation.element_spec,
                compiled=compiled,
                jit_compile=options.jit_compile,
                distributed=strategy is not None,
            )
        steps_per_epoch = _steps_per_epoch(data, options)
        self.callbacks = CallbackList(callbacks)
        self.checkpoints = None
        if run_dir is not None:
            self.checkpoints = RunCheckpoints(
                Path(run_dir) / "checkpoints",
                models=self.bound.models,
                optimizers=self.bound.optimizers,
                state=self.state,
                random=self.random,
                metric_variables=self.train_metrics.variables(),
                max_to_keep=options.max_to_keep,
            )
        elif options.on_nan == "rollback":
            raise ConfigError("on_nan='rollback' restores checkpoints, so it needs a run_dir")
        self._iterator = None
        self._resume_checked = False
        self._rollbacks = 0
        self._saved_step = -1
        self._interrupt = InterruptFlag()
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

    def record(self) -> dict:
        """What a checkpoint of this run must match to be resumed from: recipe, config,
        schedule, every model's variables and the data's batch spec."""
        record = run_record(self.recipe, self.bound, self.data, self.seed)
        return {**record, "precision": self.options.precision}

    def fit(self, epochs: int) -> dict[str, float]:
        """Run epochs until ``epochs`` have completed (counting those of a resumed run);
        return the last epoch's logs."""
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ConfigError(f"epochs must be an integer >= 1, got {epochs!r}")
        run = self.run
        run.epochs = epochs
        self.resume()
        logs: dict[str, float] = {}
        self.callbacks.fire("fit_start", run)
        try:
            with self._interrupt.catching(enabled=self.checkpoints is not None):
                if self.checkpoints is not None and run.resumed_from is None:
                    self._save()  # a step-0 checkpoint: something to roll back to
                while int(self.state.epoch) < epochs and not run.stop_training:
                    logs = self._run_epoch(run, int(self.state.epoch))
        except BaseException as error:
            self.callbacks.fire("exception", run, error)
            raise
        self.callbacks.fire("fit_end", run, logs)
        return logs

    def _run_epoch(self, run: Run, epoch: int) -> dict[str, float]:
        state = self.state
        if int(state.epoch_batches) == 0:  # a fresh epoch, not one resumed mid-way
            self.train_metrics.reset()
        if self._iterator is None:
            self._open_stream()
        self.callbacks.fire("epoch_start", run, epoch)
        target, done = run.steps_per_epoch, int(state.epoch_batches)
        while target is None or done < target:
            self._stop_if_interrupted()
            limit = self.options.steps_per_execution
            if target is not None:
                limit = min(limit, target - done)
            self.callbacks.fire("execution_start", run)
            result = _run_compiled(self.train_loop, self._iterator, limit, "training")
            if result.faulted:
                self._on_fault(result)
                done = int(state.epoch_batches)
                continue
            done += result.ran
            self.callbacks.fire(
                "execution_end", run, result.ran, LazyLogs(self.train_metrics.named())
            )
            if result.ran < limit:  # the data ran out: the next epoch opens a new stream
                self._close_stream()
                break
            if target is None or done < target:
                self._save_if_due()
        if done == 0:
            raise DataError(f"the training data set gave no batches in epoch {epoch}")
        logs = self.train_metrics.results()
        if self.validation_loop is not None:
            logs.update(self.validate(run))
        logs.update(self.recipe.epoch_figures(run))
        if self.options.steps_per_epoch is None:
            self._close_stream()  # each epoch is one pass over the data
        state.epoch.assign(epoch + 1)
        state.epoch_batches.assign(0)
        self.callbacks.fire("epoch_end", run, epoch, logs)
        if self.checkpoints is not None:
            self._save()
        self._stop_if_interrupted()
        return logs

    def validate(self, run: Run) -> dict[str, float]:
        """Every beat's loss and the metrics on the validation data, all models in
        inference mode; touches no trainable variable."""
        self.validation_metrics.reset()
        self.callbacks.fire("validation_start", run)
        iterator = iter(self._validation_data)
        limit = self.options.steps_per_execution
        while _run_compiled(self.validation_loop, iterator, limit, "validation").ran == limit:
            pass
        logs = self.validation_metrics.results()
        self.callbacks.fire("validation_end", run, logs)
        return logs

    # --- the data stream -----------------------------------------------------------------

    def _open_stream(self) -> None:
        self._iterator = iter(self._train_data)
        self.state.streams.assign_add(1)
        self.state.stream_batches.assign(0)

    def _close_stream(self) -> None:
        if self._iterator is not None:
            # Reach the end before letting go: dropping an iterator that has not seen
            # its end waits for its prefetch threads (up to 0.3 s measured).
            self._iterator.get_next_as_optional()
        self._iterator = None
        self.state.stream_batches.assign(-1)

    def _reposition(self) -> None:
        """Rebuild the training iterator at the restored position: open (and drop) as
        many iterators as the interrupted run had opened, so a shuffle that reshuffles
        each pass is at the same pass, then skip the batches already taken."""
        streams, taken = int(self.state.streams), int(self.state.stream_batches)
        open_stream = taken >= 0 and streams > 0
        for _ in range(streams - 1 if open_stream else streams):
            iter(self._train_data)
        self._iterator = None
        if open_stream:
            self._iterator = iter(self._train_data)
            skipped = int(_skip(self._iterator, tf.constant(taken, tf.int64)))
            if skipped != taken:
                raise DataError(
                    f"cannot resume: the checkpoint is {taken} batches into the training "
                    f"data, but the data set now gives only {skipped}"
                )

    # --- checkpoints, resume, faults, interrupts -------------------------------------------

    def resume(self) -> str | None:
        """Restore the latest readable checkpoint in the run dir, if there is one, and
        return its path (``fit`` calls this first; calling it again does nothing)."""
        if self.checkpoints is None or self._resume_checked:
            return self.run.resumed_from
        self._resume_checked = True
        restored = self.checkpoints.restore_latest(self.record())
        if restored is None:
            return
        path, host = restored
        self.callbacks.restore_state(host.get("callbacks", {}))
        self._reposition()
        self._saved_step = int(self.state.step)
        self.run.resumed_from = path
        return path

    def _host_state(self) -> dict:
        return {"position": self.state.position(), "callbacks": self.callbacks.checkpoint_state()}

    def _save(self) -> None:
        step = int(self.state.step)
        path = self.checkpoints.save(self._host_state(), self.record())
        self._saved_step = step
        self.run.checkpoints.append(path)

    def _save_if_due(self) -> None:
        every = self.options.checkpoint_every
        if self.checkpoints is None or every is None:
            return
        step = int(self.state.step)
        if step // every > self._saved_step // every:
            self._save()

    def _on_fault(self, result: LoopResult) -> None:
        """A step reported a non-finite loss or gradient norm: stop, or roll back."""
        state = self.state
        where = f"at step {int(state.step)} (epoch {int(state.epoch) + 1})"
        problem = f"{describe_checks(self.bound, result.checks)} {where}"
        can_roll_back = self.options.on_nan == "rollback" and self.checkpoints is not None
        if can_roll_back and self._rollbacks < self.options.max_rollbacks:
            self._rollbacks += 1
            self._roll_back(problem)
            return
        latest = self.checkpoints.latest if self.checkpoints is not None else None
        advice = (
            f"; the last good checkpoint is {latest}"
            if latest
            else "; run with debug=True to stop before the bad update is applied"
        )
        if self.options.on_nan == "rollback":
            advice += f" (already rolled back {self._rollbacks} time(s), the most allowed)"
        raise NumericsError(problem + advice)

    def _roll_back(self, problem: str) -> None:
        """Restore the last checkpoint but keep the data where it is: training goes on
        with the batch after the offending one (the batches since the checkpoint are
        skipped with it)."""
        position = self.state.position()
        path, host = self.checkpoints.restore_latest(self.record())
        self.callbacks.restore_state(host.get("callbacks", {}))
        if int(self.state.epoch_batches) == 0:
            self.train_metrics.reset()
        skipped = position["epoch_batches"] - int(self.state.epoch_batches)
        for name in ("streams", "stream_batches", "epoch_batches"):
            getattr(self.state, name).assign(position[name])
        warnings.warn(
            f"{problem}; restored {path} (step {int(self.state.step)}) and skipped {skipped} "
            f"batch(es) ending with the offending one (rollback {self._rollbacks} of at "
            f"most {self.options.max_rollbacks})",
            RuntimeWarning,
            stacklevel=2,
        )

    def _stop_if_interrupted(self) -> None:
        """After Ctrl-C: save a checkpoint at this call boundary and stop the run."""
        if not self._interrupt.requested:
            return
        path = None
        if self.checkpoints is not None:
            if int(self.state.step) != self._saved_step or not self.run.checkpoints:
                self._save()
            path = self.checkpoints.latest
        raise RunInterrupted(
            f"interrupted at step {int(self.state.step)} (epoch {int(self.state.epoch) + 1}); "
            f"checkpoint saved: {path}",
            path,
        )


class InterruptFlag:
    """Turns Ctrl-C (SIGINT) into a request the engine acts on between compiled calls,
    so the state it checkpoints is whole; a second Ctrl-C interrupts at once."""

    def __init__(self):
        self.requested = False

    @contextlib.contextmanager
    def catching(self, enabled: bool = True):
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGINT)

        def request(signum, frame):
            if self.requested:
                signal.signal(signal.SIGINT, previous)
                raise KeyboardInterrupt
            self.requested = True

        self.requested = False
        signal.signal(signal.SIGINT, request)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


@tf.function(reduce_retracing=True)
def _skip(iterator, count: tf.Tensor) -> tf.Tensor:
    """Take ``count`` batches from ``iterator`` and drop them; return how many there were."""
    taken = tf.constant(0, tf.int64)
    for _ in tf.range(count):
        if not iterator.get_next_as_optional().has_value():
            break
        taken += 1
    return taken


def run_record(recipe: Recipe, bound: BoundSchedule, data: DataSplit, seed: int) -> dict:
    """The parts of a run a checkpoint must agree with to be resumed from."""
    return {
        **identity_record(recipe, seed),
        "schedule": bound.schedule.describe(),
        # Shapes in order, not paths: Keras numbers layer names per process ("dense_2").
        "variables": {
            name: [list(v.shape) for v in model.variables] for name, model in bound.models.items()
        },
        "data": {key: str(spec) for key, spec in data.train.element_spec.items()},
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


def _distributed(strategy, dataset):
    """A data set split across the strategy's replicas: each global batch is cut into
    one part per replica."""
    if strategy is None or dataset is None:
        return dataset
    return strategy.experimental_distribute_dataset(dataset)


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


def identity_record(recipe: Recipe, seed: int) -> dict:
    """Recipe name, config (as JSON values) and seed: what ``fit`` checks before it
    builds anything, to refuse a resume early."""
    config = json.loads(json.dumps(attrs.asdict(recipe.config), default=str))
    return {"recipe": recipe.name, "config": config, "seed": seed}


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


def _run_compiled(loop: CompiledLoop, iterator, limit: int, role: str) -> LoopResult:
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


def _build_unbuilt(
    recipe: Recipe, models: Mapping[str, keras.Layer], spec, random, label: str
) -> None:
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
            forward(loss_fn, name, models, frozenset(), (), batch, random)
        except BeatloopError:
            raise
        except Exception as error:  # a user's model meeting the data: say which, briefly
            raise DataError(_failure(label, name, spec, error)) from None


def _bind(recipe, models, optimizers, spec, random, label: str, strategy=None) -> BoundSchedule:
    try:
        return bind(
            recipe.schedule(),
            models,
            optimizers,
            recipe.losses(),
            spec,
            context=f"{label}'s schedule",
            random=random,
            strategy=strategy,
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
