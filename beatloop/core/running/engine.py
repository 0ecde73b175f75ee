"""The engine: epochs of compiled calls, and the events around them.

Shaped like Orbit's ``Controller``: a short loop over parts handed to it. What a run is
made of comes from ``assemble`` (a recipe in phases: the phase's, ``enter_phase``); the data
from a ``DataStream``; checkpoints, rollback and Ctrl-C from ``Recovery``. The engine runs
epochs of compiled calls of up to K steps (``CompiledLoop``) and fires the events, eagerly,
between them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import keras
import tensorflow as tf

from beatloop.core.compiled.metrics import LazyLogs, epoch_figures
from beatloop.core.compiled.op_errors import data_errors
from beatloop.core.compiled.phased import check_epochs, enter_phase
from beatloop.core.compiled.user_code import in_recipe
from beatloop.core.data.batches import DataSplit
from beatloop.core.data.data_origin import recipe_options, warn_if_python_fed
from beatloop.core.devices.workers import Cluster, slowest_of
from beatloop.core.events.callbacks import Callback, CallbackList
from beatloop.core.events.keras_callbacks import adapt_callbacks, warn_if_resumed
from beatloop.core.events.run import Run
from beatloop.core.failures.errors import ConfigError, DataError
from beatloop.core.feeding.stream import DataStream, epoch_length
from beatloop.core.running.assembly import assemble
from beatloop.core.running.best import best_keeper
from beatloop.core.running.evaluation import Evaluation
from beatloop.core.running.options import EngineOptions
from beatloop.core.running.pacing import AUTO, EVALUATION_STEPS, pace_for
from beatloop.core.running.recipe import Recipe, label_settings
from beatloop.core.running.recovery import Recovery
from beatloop.core.saving.checkpoints import run_checkpoints

__all__ = ["Engine", "EngineOptions"]


class Engine:
    """Runs one recipe on one data split: ``Engine(recipe, data).fit(epochs)``.

    ``models`` and ``optimizers`` replace the recipe's parts of the same names (the names
    ``beatloop show`` prints). With a ``run_dir`` the engine checkpoints into
    ``run_dir/checkpoints`` and ``fit`` continues from the latest checkpoint there (or in
    ``read_dir``: ``workers.py``). ``callbacks`` may hold Keras callbacks. ``trains``:
    ``assemble``'s (``False``: the training loop traced on its first call, not now)."""

    def __init__(
        self,
        recipe: Recipe,
        data: DataSplit,
        *,
        models: Mapping[str, keras.Layer | str | Path] | None = None,
        optimizers: Mapping[str, keras.optimizers.Optimizer] | None = None,
        callbacks: Sequence[Callback | keras.callbacks.Callback] = (),
        options: EngineOptions | None = None,
        run_dir: Path | None = None,
        seed: int = 0,
        label: str | None = None,
        strategy: tf.distribute.Strategy | None = None,
        read_dir: Path | None = None,
        trains: bool = True,
    ):
        options = recipe_options(options or EngineOptions(), recipe)
        parts = assemble(
            recipe, data, options, models=models, optimizers=optimizers, seed=seed,
            label=label, strategy=strategy, trains=trains,
        )  # fmt: skip
        if run_dir is None and options.on_nan == "rollback":
            raise ConfigError("on_nan='rollback' restores checkpoints, so it needs a run_dir")
        self.parts = parts
        self.options = options
        self._labels = label_settings(recipe)  # read only when a label is out of range
        self.stream = DataStream(data, parts.counters, strategy, parts.label)
        auto = options.steps_per_execution == AUTO
        given = adapt_callbacks(callbacks, recipe, parts.bound, auto)  # Keras ones wrapped
        self.callbacks = CallbackList([*given, *parts.callbacks])
        steps_per_epoch = epoch_length(data, options.steps_per_epoch)
        self.pace = pace_for(
            options.steps_per_execution, debug=options.debug, agree=slowest_of(strategy),
            callbacks=self.callbacks.callbacks, epoch_steps=steps_per_epoch,
            checkpoint_every=options.checkpoint_every if run_dir is not None else None,
        )  # fmt: skip
        self.recovery = Recovery(
            run_checkpoints(parts, run_dir, options, read_dir), parts.record, options=options,
            cluster=Cluster(strategy, read_dir or run_dir), callbacks=self.callbacks,
            counters=parts.counters, metrics=parts.train_metrics, best=best_keeper(self),
        )  # fmt: skip
        self.run = Run(
            recipe=recipe, bound=parts.bound, counters=parts.counters, run_dir=run_dir,
            epochs=0, pace=self.pace, steps_per_epoch=steps_per_epoch, seed=seed,
            checkpoints=self.recovery.saved, worker=self.recovery.cluster.worker,
        )  # fmt: skip
        self._fitting = False
        self.evaluation = Evaluation(
            parts, self.stream, options, data, labels=self._labels, seed=seed, strategy=strategy
        )

    @property
    def recipe(self) -> Recipe:
        return self.parts.recipe

    @property
    def bound(self):
        """The bound schedule: models, optimizers, beats."""
        return self.parts.bound

    @property
    def counters(self):
        return self.parts.counters

    @property
    def state(self):
        """The counters, under the name earlier versions gave them."""
        return self.parts.counters

    @property
    def train_loop(self):
        return self.parts.train_loop

    @property
    def validation_loop(self):
        return self.parts.validation_loop

    @property
    def checkpoints(self):
        """The run dir's checkpoints (``None`` without a run dir)."""
        return self.recovery.checkpoints

    def resume(self, checkpoint: str | None = None) -> str | None:
        """Restore the latest readable checkpoint in the run dir (``checkpoint``: that
        one), if there is one, and return its path (``fit`` calls this first; again: no-op)."""
        if self.run.resumed_from is None:
            self.run.resumed_from = self.recovery.resume(checkpoint)
            if self.run.resumed_from is not None:
                self.stream.reposition()
                enter_phase(self, int(self.parts.counters.epoch))
        return self.run.resumed_from

    def fit(self, epochs: int) -> dict[str, float]:
        """Run epochs until ``epochs`` have completed (counting those of a resumed run);
        return the last epoch's logs."""
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ConfigError(f"epochs must be an integer >= 1, got {epochs!r}")
        check_epochs(self.parts, epochs)  # a recipe in phases of fixed length
        run = self.run
        run.epochs = epochs
        self.resume()
        warn_if_resumed(self.callbacks.callbacks, run)
        warn_if_python_fed(self.evaluation.data.train, self.parts.label, run.run_dir)
        logs: dict[str, float] = {}
        self.callbacks.fire("fit_start", run)
        self._fitting = True
        try:
            with self.recovery.catching_interrupts():
                self.recovery.save_first()
                while run.epoch < epochs and not run.stop_training:
                    logs = self._run_epoch(run.epoch)
        except BaseException as error:
            self.callbacks.fire("exception", run, error)
            raise
        finally:
            self._fitting = False
            self.stream.wait()
        self.callbacks.fire("fit_end", run, logs)
        return logs

    def _run_epoch(self, epoch: int) -> dict[str, float]:
        """One epoch: its training calls, validation, then the epoch's end."""
        enter_phase(self, epoch)
        run, counters = self.run, self.parts.counters
        done = int(counters.epoch_batches)  # read once: callbacks do not move the data
        if done == 0:  # a fresh epoch, not one resumed mid-way
            self.parts.train_metrics.reset()
        self.callbacks.fire("epoch_start", run, epoch)
        if self._train_epoch(done) == 0:
            raise DataError(f"the training data set gave no batches in epoch {epoch}")
        self.parts.train_loop.flush()  # an accumulation's last, partial update
        logs = epoch_figures(self.parts.train_metrics, run, epoch)
        if self.stream.has_validation:
            logs.update(self.validate(run))
        if self.options.steps_per_epoch is None:
            self.stream.end_pass()  # each epoch is one pass over the data
        counters.end_epoch()
        self.callbacks.fire("epoch_end", run, epoch, logs)  # figures, then writers
        self.recovery.save(logs)
        self.recovery.stop_if_interrupted()
        return logs

    def _train_epoch(self, done: int) -> int:
        """The epoch's compiled calls from its ``done``-th batch, until its steps are done
        or the data ends; returns the batches the epoch took (those a rollback skipped
        included)."""
        run, counters = self.run, self.parts.counters
        target = run.steps_per_epoch
        while target is None or done < target:
            self.recovery.stop_if_interrupted()
            limit = self.pace.steps
            if target is not None:
                limit = min(limit, target - done)
            if self.pace.auto:  # checkpoints at exact multiples, whatever K is being tried
                limit = min(limit, self.recovery.steps_before_due() or limit)
            boundary = self.callbacks.next_boundary(run)  # e.g. a profiled range's edge
            if boundary is not None:
                limit = min(limit, boundary - run.step)
            started = time.perf_counter()
            self.callbacks.fire("execution_start", run)
            with (
                data_errors("training", self.parts.label, self._labels, self.evaluation.data.train),
                in_recipe(self.parts.label),
            ):
                result = self.stream.train(self.parts.train_loop, limit, epoch_start=done == 0)
            if result.faulted:
                self.recovery.recover(result, self.parts.bound.beats)
                done = int(counters.epoch_batches)
                continue
            done += result.ran
            logs = LazyLogs(self.parts.train_metrics.named(last=True))
            self.callbacks.fire("execution_end", run, result.ran, logs)
            if result.ran < limit:  # the data ran out: the next epoch opens a new pass
                self.stream.end_pass()
                self.pace.pass_ended(done)
            elif target is None or done < target:
                self.recovery.save_if_due()
            self.pace.observe(result.ran, limit, time.perf_counter() - started)
            if result.ran < limit:
                break
        return done

    def validate(self, run: Run | None = None) -> dict[str, float]:
        """Every beat's loss and the metrics on the validation data, all models in
        inference mode; touches no trainable variable."""
        run = run or self.run
        self.callbacks.fire("validation_start", run)
        loop, wait = self.parts.validation_loop, not self._fitting
        logs = self.evaluation.run(loop, self.pace.steps, wait=wait)
        self.callbacks.fire("validation_end", run, logs)
        return logs

    def evaluate(self, data=None, *, steps_per_execution: int | None = None) -> dict[str, float]:
        """The validation figures, without their ``val_`` prefix, for the models as they
        are, over ``data`` (``None``: the validation data); fires no event. Under ``"auto"``
        it runs the K training chose, or ``EVALUATION_STEPS`` before one is chosen."""
        if steps_per_execution in (None, AUTO):
            steps_per_execution = self.pace.steps if self.pace.settled else EVALUATION_STEPS
        return self.evaluation.evaluate(data, steps_per_execution=steps_per_execution)
