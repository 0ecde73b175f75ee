"""``beatloop.fit``: pick a recipe by name, configure it, and run it on the engine
(``beatloop.restore`` and ``beatloop.evaluate``, a run rebuilt from its run dir:
``restoring.py``)."""

from __future__ import annotations

import functools
import secrets
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import keras
import tensorflow as tf

from beatloop.callbacks.profiler import Profiler
from beatloop.callbacks.standard import (
    History,
    JsonLinesLogger,
    NothingWrittenWarning,
    ProgressBar,
)
from beatloop.core.compiled.phased import updates_by_beat
from beatloop.core.data.batches import (
    as_data_split,
)
from beatloop.core.devices.workers import worker_of, write_dir
from beatloop.core.events.callbacks import Callback, Order
from beatloop.core.failures.errors import ConfigError, RunInterrupted
from beatloop.core.failures.fields import FieldError
from beatloop.core.running.engine import Engine
from beatloop.core.running.options import DIVERGENCE_WINDOW, EngineOptions
from beatloop.core.running.pacing import AUTO
from beatloop.core.running.recipe import Recipe
from beatloop.core.running.result import FitResult
from beatloop.core.saving import op_determinism as determinism
from beatloop.core.saving.checkpoints import latest_record
from beatloop.core.saving.checkpoints import remove_leftovers as remove_checkpoint_leftovers
from beatloop.core.saving.passed import record_passed
from beatloop.core.saving.record import read_run_json, update_run_json, write_run_json
from beatloop.core.saving.run_dir import (
    RunDirBefore,
    check_run_dir,
    create_run_dir,
    never_started,
    remove_leftovers,
)
from beatloop.core.saving.run_lock import RunDirLock
from beatloop.core.schedule.config import make_config
from beatloop.ignored_settings import warn_ignored_settings, warn_precision_unused
from beatloop.named_data.recorded import (
    data_facts,
)
from beatloop.plugins.registry import check_recipe_class, get_recipe, registry
from beatloop.user_modules import (
    recipe_module,
    refuse_while_importing,
)


def make_recipe(
    recipe: str | type[Recipe] | Recipe, config: Mapping[str, Any] | None = None
) -> Recipe:
    """A configured recipe from a registered name, a Recipe class, or an instance."""
    if isinstance(recipe, Recipe):
        if config:
            raise ConfigError("pass config overrides with a recipe name or class, not an instance")
        return recipe
    cls = get_recipe(recipe) if isinstance(recipe, str) else recipe
    check_recipe_class(cls, "fit()")
    return cls(make_config(cls.Config, config, f"recipe {cls.name!r}"))


def fit(
    recipe: str | type[Recipe] | Recipe,
    *,
    epochs: int = 1,
    data=None,
    config: Mapping[str, Any] | None = None,
    models: Mapping[str, keras.Layer | str | Path] | None = None,
    optimizers: Mapping[str, keras.optimizers.Optimizer] | None = None,
    callbacks: Sequence[Callback | keras.callbacks.Callback] = (),
    seed: int | None = None,
    op_determinism: bool | None = None,
    steps_per_execution: int | str = "auto",
    steps_per_epoch: int | None = None,
    debug: bool = False,
    run_dir: str | Path | None = None,
    progress: bool | None = None,
    checkpoint_every: int | None = None,
    max_to_keep: int = 3,
    on_nan: str = "raise",
    check_gradients: bool = True,
    max_rollbacks: int = 3,
    divergence: float | None = None,
    divergence_window: int = DIVERGENCE_WINDOW,
    jit_compile: bool = False,
    precision: str = "float32",
    strategy: tf.distribute.Strategy | None = None,
    accept_changed_data: bool = False,
    profile: tuple[int, int] | str | None = None,
    keep_best: str | None = None,
) -> FitResult:
    """Train ``recipe`` for ``epochs`` and return its history and trained models.

    ``data`` is a ``tf.data.Dataset``, a ``(train, validation)`` pair or a DataSplit of
    batched ``(x, y)`` tuples or dicts; ``None`` takes the recipe's built-in data; a
    function ``data(recipe, seed)`` returning one of those is called once the configured
    recipe and the run's seed are known (what ``beatloop run --data`` passes).
    ``models`` and ``optimizers`` replace the recipe's parts by name; a model may be a
    Keras model or the path of a ``.keras`` file, and every model the recipe declares
    in ``supplied_models`` without a fallback must be given.
    ``seed`` seeds Python, NumPy and TensorFlow (a random seed is drawn and recorded when
    omitted). ``op_determinism`` sets TensorFlow's op determinism for the run
    (deterministic kernels and input pipelines; its cross-entropy losses then run as
    composite ops, not one fused kernel: other last bits, and slower on a small model,
    [speed](speed.md#beside-keras-fit-and-hand-written-loops)); ``None``: as the run
    resumed had it, else on when ``seed`` is given. ``run.json`` records it, and a resume
    asked otherwise is refused. ``steps_per_execution`` runs that
    many steps per compiled call; ``"auto"`` (the default) times the calls and doubles K
    while that still saves a measurable share of the time, keeping each call under about
    0.25 s (the weights do not depend on K; the K chosen is in ``result`` and
    ``run.json``); ``steps_per_epoch`` ends epochs after that many steps
    (needed for endless data; ``None``: the recipe's ``steps_per_epoch``, if it sets
    one, as a recipe whose data its own loop makes does); ``debug`` runs eagerly and
    stops at the first non-finite loss or gradient before it is applied;
    ``jit_compile`` compiles the steps with XLA;
    ``precision="mixed_float16"`` (or ``"mixed_bfloat16"``) trains in mixed precision,
    every optimizer loss-scaled for float16. ``strategy``: any ``tf.distribute``
    strategy; models, optimizers and metrics are built in its scope, each global batch
    is split across its replicas, and the losses are averaged over the global batch.
    ``progress``: show a progress bar (``None``: only on a terminal).
    ``callbacks``: beatloop callbacks and Keras callbacks (``keras.callbacks.Callback``),
    a Keras one seeing the recipe's primary model and its optimizer, or those named with
    ``beatloop.keras_callback(callback, model=..., optimizer=...)``; its state is not
    checkpointed ([Keras callbacks](keras-callbacks.md)). ``profile=(start, stop)``
    records a TensorFlow profiler trace of training steps ``start`` to ``stop - 1``
    (counted from 0 over the run) into ``RUN_DIR/tensorboard`` (``beatloop.Profiler``:
    calls end at the range's edges, so the trace holds exactly those steps at any K).

    With ``run_dir``, the run checkpoints there at each epoch's end (and every
    ``checkpoint_every`` steps, keeping ``max_to_keep``), and a run dir that already
    holds checkpoints is *resumed*: training continues exactly where it stopped, up to
    ``epochs`` in all; ``epochs`` fewer than the run dir holds is refused (a
    ``ConfigError``, nothing rewritten), as many returns at once, more continues the run
    (``run.json`` records each start's ``epochs`` in ``epochs_asked``). A run holds a lock
    on its run dir while it lives: a second run on it is refused (``RunDirError``, naming
    the holder). Under a ``MultiWorkerMirroredStrategy`` every worker is given the same
    ``run_dir`` (a shared file system): the chief writes it, the other workers write a
    temporary dir of their own (removed at the end) and restore the chief's checkpoints;
    a worker lost raises ``WorkerLostError`` on the others ([from one machine to a
    cluster](speed.md#from-one-machine-to-a-cluster)). SIGTERM, like Ctrl-C, saves a
    checkpoint at the next call boundary and raises ``RunInterrupted`` (``exit_code``
    143; 130 for Ctrl-C). The seed is taken from the checkpoint when omitted; a
    different recipe, config or seed is refused. Data given as a source
    (``beatloop.NamedData``: what ``beatloop run --data`` passes) has its files'
    size, modification time and fingerprint recorded in ``run.json`` (``data_files``); a
    resume on files that changed since is refused (a ``DataError`` naming them) unless
    ``accept_changed_data=True``, which ``run.json`` records (``data_changes``).
    ``on_nan="rollback"`` answers a non-finite loss or gradient norm by restoring the
    last checkpoint and going on after the offending batch (at most ``max_rollbacks``
    times); ``"raise"`` stops the run. ``check_gradients=False`` checks the losses only,
    as Keras's ``TerminateOnNaN`` does (each step's gradients are not reduced: about 4% of
    a small model's step, [speed](speed.md#beside-keras-fit-and-hand-written-loops)): a
    non-finite gradient is then found at the first loss it makes non-finite, a step or
    more after the update it spoilt.

    ``divergence=F`` (a number > 1; off by default) also treats a loss that runs away
    while staying finite as a fault, answered as ``on_nan`` says: a step where a beat's
    ``|loss|`` is above F times the median of its ``|loss|`` over its last
    ``divergence_window`` steps (fewer at the start: from its second step on; a median
    of zero never fires). The window is checkpointed with the run.

    ``keep_best="val_loss:min"`` (``"FIGURE:max"``; ``"FIGURE"`` alone is ``min``;
    ``"quality"``: the recipe's ``quality_figure``) keeps the epoch-end checkpoint of the
    best epoch by that figure beside the newest ``max_to_keep`` (not counted among them),
    until a better epoch's replaces it; ``run.json`` names it (``"best"``: figure, mode,
    epoch, value, checkpoint; ``result.best``) and ``restore(run_dir, best=True)``
    restores it. A figure the run does not log is refused before training, naming those
    it does. Off by default; on a resume, omitted, the run's own goes on (another is
    refused).

    Bits: a run ends with the weights of any other run of the same recipe, config, seed
    and data on the same machine, in a fresh process or after other work in this one,
    the recipe given by name or as an instance, resumed or not: its models, optimizers
    and metrics are built and traced under Keras name counters of the run's own, so the
    graph's node names (Grappler orders sums by them) are a fresh process's. Models in
    ``models=`` keep the names they were built with (a ``ReproducibilityWarning`` when
    those sort otherwise than a fresh process's would); a seeded shuffle in ``data``
    takes TensorFlow's global seed when it is built (pass ``data`` as a function to
    build it after the seed). The step is traced once for the data's element spec, whose
    batch dimension is unknown after ``batch(n)`` (fixed by ``drop_remainder=True``): a
    hand-written loop compared with a run bit for bit must be traced the same way, with
    an ``input_signature`` of batch dimension ``None`` ([when the bits are the
    same](checkpoints.md#when-the-bits-are-the-same); [simultaneous
    beats](schedules.md#simultaneous-beats-one-forward-several-updates)).
    """
    refuse_while_importing("beatloop.fit")  # a module --import names trains when imported
    _check_counts(epochs, seed, op_determinism)
    if profile is not None:
        callbacks = [*callbacks, Profiler(profile)]
        if run_dir is None:
            raise ConfigError(
                "profile needs a run_dir: its trace goes to RUN_DIR/tensorboard (or pass "
                "beatloop.Profiler(steps, log_dir=...) as a callback)"
            )
    options = engine_options(
        steps_per_execution=steps_per_execution, debug=debug, steps_per_epoch=steps_per_epoch,
        checkpoint_every=checkpoint_every, max_to_keep=max_to_keep, on_nan=on_nan,
        check_gradients=check_gradients, max_rollbacks=max_rollbacks, jit_compile=jit_compile,
        precision=precision, divergence=divergence, divergence_window=divergence_window,
        keep_best=keep_best,
    )  # fmt: skip
    if keep_best is not None and run_dir is None:
        raise ConfigError("keep_best keeps a checkpoint, so it needs a run_dir")
    run_path = None if run_dir is None else Path(run_dir)
    worker = worker_of(strategy)
    if run_path is not None and worker.is_chief:
        check_run_dir(run_path)  # before anything is built or written
    label = registry().describe_origin(recipe) if isinstance(recipe, str) else None
    recipe = make_recipe(recipe, config)
    warn_ignored_settings(recipe, config, data=data, models=models)
    warn_precision_unused(models, precision)
    build = functools.partial(
        _build_engine, recipe, data, (seed, op_determinism), models=models, optimizers=optimizers,
        options=options, callbacks=callbacks, progress=progress, label=label,
        strategy=strategy, accept_changed_data=accept_changed_data,
    )  # fmt: skip
    if run_path is None:
        engine, history, _, _ = build(None)
        engine.fit(epochs)
        return result_of(engine, history)
    if not worker.is_chief:  # writes a dir of its own, reads the chief's checkpoints
        with write_dir(run_path, worker) as scratch:
            build = functools.partial(build, read_dir=run_path)
            result = _fit_in_run_dir(build, scratch, epochs, RunDirBefore(scratch, created=True))
        return _as_in_run_dir(result, scratch, run_path)
    with RunDirLock.acquire(run_path) as lock:  # one run per run dir, until it ends
        before = RunDirBefore(run_path, created=lock.created_dir)
        return _fit_in_run_dir(build, run_path, epochs, before)


def _build_engine(
    recipe, data, asked, run_path, *, options, callbacks, progress, read_dir=None,
    accept_changed_data=False, **parts,
):  # fmt: skip
    """The run's engine (seed and op determinism set from ``asked``, data made) with its
    ``History``, what ``run.json`` records of data named as a source (``{}`` for
    other data; on a resume its files compared with the record,
    ``sources.recorded.data_facts``) and the models and optimizers passed (the run's
    objects, for ``record_passed``); ``read_dir``: the run dir it resumes from when it
    writes another (a multi-worker run's other workers)."""
    seed = _seed_everything(*asked, read_dir or run_path)
    named = data
    if callable(data):  # made once the recipe and the seed are known (--data)
        data = data(recipe, seed)
    recorded_in = read_dir or run_path  # every worker compares with the chief's record
    resumed = recorded_in is not None and latest_record(recorded_in) is not None
    facts = data_facts(recorded_in, named, recipe, resumed, accept_changed_data)
    split = as_data_split(recipe.default_data(seed) if data is None else data)
    history = History()
    steps = options.steps_per_execution
    engine = Engine(
        recipe, split, options=options, seed=seed, run_dir=run_path,
        callbacks=[history, *_run_callbacks(callbacks, run_path, progress, steps)],
        read_dir=read_dir, **parts,
    )  # fmt: skip
    passed = (
        {name: engine.parts.bound.models[name] for name in parts.get("models") or {}},
        dict(parts.get("optimizers") or {}),
    )
    return engine, history, facts, passed


def _as_in_run_dir(result: FitResult, scratch: Path, run_path: Path) -> FitResult:
    """A non-chief worker's result naming the run dir and the chief's files, not the
    temporary dir it wrote (gone by now)."""

    def moved(path):
        return run_path / Path(path).relative_to(scratch)

    artifacts = {name: moved(path) for name, path in result.artifacts.items()}
    return attrs.evolve(result, run_dir=run_path, artifacts=artifacts)


def _fit_in_run_dir(build, run_path: Path, epochs: int, before: RunDirBefore) -> FitResult:
    """Build, resume and train with the run dir's lock held. Nothing is written until a
    resume is accepted and there are epochs to train (but for what a kill after a best's
    save left: ``Recovery.tidy``); a run that fails before its first step puts the run
    dir back as it was."""
    engine = start = None
    try:
        engine, history, facts, passed = build(run_path)
        engine.resume()
        if not engine.recovery.trains_more(epochs):
            tidied = engine.recovery.tidy()
            written = (
                f"put right only what a kill after its last save left ({'; '.join(tidied)})"
                if tidied
                else "nothing written"
            )
            message = (
                f"the run dir {run_path} holds {epochs} finished epoch(s) already, as many "
                f"as epochs={epochs} asks for: nothing to train, {written} (a higher "
                "--epochs trains it further)"
            )
            _fit_events_only(engine, history, epochs, message)
            return result_of(engine, history)
        create_run_dir(run_path)  # the run starts: only now is anything written
        remove_leftovers(run_path)
        remove_checkpoint_leftovers(run_path / "checkpoints")
        earlier = read_run_json(run_path / "run.json") if engine.run.resumed_from else {}
        facts = {**facts, **record_passed(run_path, *passed, earlier)}  # a rebuild's parts
        _write_run_json(run_path, engine, epochs, facts)
        start = engine.run.step
        engine.fit(epochs)
    except BaseException as error:
        started = start is not None and engine.run.step != start
        saved = isinstance(error, RunInterrupted) and error.checkpoint is not None
        if not started and not saved:  # not one step done, no checkpoint to resume from
            before.put_back()
            unstarted = never_started(error)  # a full disk: run again, not "resume"
            if unstarted is not error:
                raise unstarted from error.__cause__
        raise
    return result_of(engine, history)


def _fit_events_only(engine: Engine, history: History, epochs: int, message: str) -> None:
    """``on_fit_start`` then ``on_fit_end`` for a run dir that holds the epochs asked for
    already: callbacks see the run as its checkpoint restored it, and ``on_fit_end`` the
    last epoch's figures as its history holds them (an ``EarlyStopping`` puts its best
    weights back, as when the run ended). One warning, ``message``, says so, with what
    the log files found and left as they are (not a warning of their own each)."""
    engine.run.epochs = epochs
    done = max((len(values) for values in history.history.values()), default=0)
    logs = {name: values[-1] for name, values in history.history.items() if len(values) == done}
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.callbacks.fire("fit_start", engine.run)
    finally:  # said even when a callback fails
        folded = [w.message for w in caught if isinstance(w.message, NothingWrittenWarning)]
        found = "".join(f"; {w.found}{w.advice}" for w in folded)
        warnings.warn(message + found, UserWarning, stacklevel=4)
        for other in caught:  # the callbacks' other warnings, as they were raised
            if not isinstance(other.message, NothingWrittenWarning):
                warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    engine.callbacks.fire("fit_end", engine.run, logs)


def _check_counts(epochs, seed, op_determinism=None) -> None:
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ConfigError(f"epochs must be an integer >= 1, got {epochs!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    if op_determinism is not None and not isinstance(op_determinism, bool):
        raise ConfigError(f"op_determinism must be True, False or None, got {op_determinism!r}")


def engine_options(**values) -> EngineOptions:
    """``EngineOptions(**values)``; a value refused names ``fit``'s argument."""
    try:
        return EngineOptions(**values)
    except FieldError as error:
        raise error.owned_by("fit") from None


def _seed_everything(seed: int | None, asked: bool | None, run_dir: Path | None) -> int:
    """The run's seed, set for Python, NumPy and TensorFlow: the one given, else the one
    recorded in the run dir's checkpoints (a resume), else a random one; and its op
    determinism, set for the process: as ``asked``, else as recorded, else on with a
    given seed (``core/saving/op_determinism.py``)."""
    stored = latest_record(run_dir) if run_dir is not None else None
    recorded = None if stored is None else stored.op_determinism
    determinism.set_for_run(determinism.decided(asked, recorded, seeded=seed is not None))
    if seed is None and stored is not None:
        seed = stored.seed
    if seed is None:
        seed = secrets.randbelow(2**31)
    keras.utils.set_random_seed(seed)
    return seed


def _run_callbacks(
    callbacks: Sequence[Callback], run_dir: Path | None, progress, steps_per_execution
) -> list:
    """The user's callbacks, with a progress bar (on a terminal, or when asked), the run
    dir's log file unless the user gave their own, and under ``"auto"`` the recording of
    the K chosen in ``run.json``."""
    given = {type(c) for c in callbacks}
    added: list[Callback] = []
    wants_progress = progress or (progress is None and sys.stdout.isatty())
    if wants_progress and not any(issubclass(t, ProgressBar) for t in given):
        added.append(ProgressBar())
    if run_dir is not None and not any(issubclass(t, JsonLinesLogger) for t in given):
        added.append(JsonLinesLogger(run_dir / "history.jsonl"))
    if run_dir is not None and steps_per_execution == AUTO:
        added.append(ChosenStepsRecorder(run_dir / "run.json"))
    return [*added, *callbacks]


class ChosenStepsRecorder(Callback):
    """Writes the steps per call ``"auto"`` chose into ``run.json``
    (``chosen_steps_per_execution``), once it has chosen."""

    order = Order.WRITER

    def __init__(self, path: Path):
        self.path = path
        self._written: int | None = None

    def on_epoch_end(self, run, epoch, logs) -> None:
        self._record(run)

    def on_fit_end(self, run, logs) -> None:
        self._record(run)

    def _record(self, run) -> None:
        chosen = run.chosen_steps_per_execution
        if chosen is not None and chosen != self._written and self.path.exists():
            update_run_json(self.path, chosen_steps_per_execution=chosen)
            self._written = chosen


def _write_run_json(run_dir: Path, engine: Engine, epochs: int, facts=None) -> None:
    """``run.json``: the run record, and how this run was asked to go (with the data
    source named on the command line and its files' identity, if one was: ``facts``);
    ``epochs_asked``: the epochs each start of the run asked for, in order (a resume, or
    a finished run continued, adds one)."""
    facts = facts or {}
    earlier = read_run_json(run_dir / "run.json") if engine.run.resumed_from else {}
    asked = earlier.get("epochs_asked") or ([earlier["epochs"]] if "epochs" in earlier else [])
    write_run_json(
        run_dir / "run.json",
        engine.parts.record,
        epochs=epochs,
        epochs_asked=[*asked, epochs],
        steps_per_execution=engine.options.steps_per_execution,
        chosen_steps_per_execution=engine.run.chosen_steps_per_execution,
        checkpoint_every=engine.options.checkpoint_every,
        resumed_from=engine.run.resumed_from,
        updates=updates_by_beat(engine.parts.phased or (engine.bound,)),
        recipe_module=recipe_module(type(engine.recipe)),  # named when it is not registered
        **facts,
        **_best_facts(engine),
    )


def _best_facts(engine: Engine) -> dict:
    """What ``run.json`` says of ``keep_best``: the figure and mode (what a replay
    passes again) and the best epoch so far; nothing for a run without it."""
    keeper = engine.recovery.best
    if not keeper.on:
        return {}
    facts = {"keep_best": ":".join(keeper.asked)}
    return facts if keeper.best is None else {**facts, "best": dict(keeper.best)}


def result_of(engine: Engine, history: History) -> FitResult:
    return FitResult(
        recipe=engine.recipe,
        config=engine.recipe.config,
        history=history.history,
        last_epoch=dict(history.last),
        bound=engine.bound,
        seed=engine.run.seed,
        steps=engine.run.step,
        epochs=engine.run.epoch,
        run_dir=engine.run.run_dir,
        artifacts=dict(engine.run.artifacts),
        resumed_from=engine.run.resumed_from,
        checkpoint=engine.recovery.latest,
        steps_per_execution=engine.pace.steps,
        best=engine.recovery.best.result(),
        engine=engine,
    )
