"""Validation passes: the run's validation at each epoch's end, and evaluations of the
models as they are on any data set, through the same compiled validation loop.

A pass draws its noise from validation's own generator
(``validation_random``), reset to the run's seed
first: the same weights on the same data give the same figures, and validating moves
nothing training uses.
"""

from __future__ import annotations

import attrs
import tensorflow as tf

from beatloop.core.compiled.averaged import averaged_weights, evaluated_pairs, raw_figures
from beatloop.core.compiled.loop import CompiledLoop
from beatloop.core.compiled.op_errors import data_errors
from beatloop.core.compiled.user_code import in_recipe
from beatloop.core.data.batches import DataSplit, as_evaluation_data, check_evaluation_data
from beatloop.core.data.data_origin import LOOP_DATA_ADVICE, is_loop_data
from beatloop.core.data.paths import spec_record
from beatloop.core.devices.collectives import Gathering
from beatloop.core.failures.errors import ConfigError, DataError
from beatloop.core.feeding.stream import DataStream
from beatloop.core.running.assembly import RunParts, validation_loop
from beatloop.core.running.options import EngineOptions


class Evaluation:
    """Validation passes over a run's validation data or another data set."""

    def __init__(
        self,
        parts: RunParts,
        stream: DataStream,
        options: EngineOptions,
        data: DataSplit,
        *,
        labels,
        seed: int,
        strategy: tf.distribute.Strategy | None = None,
    ):
        self.parts = parts
        self.seed = seed
        self.strategy = strategy
        self.stream = stream
        self.options = options
        self.data = data
        self._labels = labels
        self._loops: dict[tuple, CompiledLoop] = {}

    def _advice(self) -> str:
        """What to pass instead of the validation data the run lacks."""
        if is_loop_data(self.data.train):
            return LOOP_DATA_ADVICE
        return "pass data= (a batched tf.data.Dataset like its training data)"

    def run(
        self, loop: CompiledLoop, limit: int, role: str = "validation", dataset=None, wait=True
    ) -> dict[str, float]:
        """One pass of ``loop`` over the validation data (or ``dataset``), ``limit`` steps
        per call; the ``val_`` figures. ``wait``: until its iterator is destroyed. With an
        evaluated average (``EMA(evaluated=True)``) they are the average's, and the
        source's own follow as ``val_raw_`` figures."""
        pairs = evaluated_pairs(self.parts.bound.updates)
        if not pairs:
            return self._pass(loop, limit, role, dataset, wait)
        with averaged_weights(pairs):
            logs = self._pass(loop, limit, role, dataset, wait=False)
        own = self._pass(loop, limit, role, dataset, wait)
        return logs | raw_figures(own, self.parts.validation_metrics.prefix)

    def _pass(self, loop: CompiledLoop, limit: int, role: str, dataset, wait: bool) -> dict:
        """One pass of ``loop`` for the models' variables as they are."""
        self.parts.validation_metrics.reset()
        if self.parts.validation_random is not None:
            self.parts.validation_random.reset_from_seed(self.seed)
        data = self.data.validation if dataset is None else dataset
        with data_errors(role, self.parts.label, self._labels, data), in_recipe(self.parts.label):
            self.stream.validate(loop, limit, dataset)
        if wait:
            self.stream.wait()
        return self.parts.validation_metrics.results()

    def evaluate(self, data=None, *, steps_per_execution: int) -> dict[str, float]:
        """Every beat's loss and the metrics, models in inference mode, over ``data`` (a
        batched ``tf.data.Dataset`` of ``(x, y)`` tuples or dicts, checked like
        validation data; ``None``: the run's validation data), ``steps_per_execution``
        steps per call (the engine resolves ``"auto"``); by name without the ``val_``
        prefix."""
        limit = self._steps(steps_per_execution)
        label = self.parts.label
        if data is None:
            if self.data.validation is None:
                raise DataError(f"{label} has no validation data to evaluate on: {self._advice()}")
            dataset, role, spec = None, "validation", self.data.validation.element_spec
        else:
            dataset, role = as_evaluation_data(data), "evaluation"
            spec = dataset.element_spec
            recipe = self.parts.recipe
            check_evaluation_data(
                dataset, self.data.train.element_spec, recipe.batch_keys,
                recipe.check_batch_spec, label, recipe.nested_keys,
            )  # fmt: skip
        logs = self.run(self._loop(spec, limit, role, dataset), limit, role, dataset)
        prefix = self.parts.validation_metrics.prefix
        return {name.removeprefix(prefix): value for name, value in logs.items()}

    def _steps(self, steps_per_execution: int) -> int:
        """``steps_per_execution``, checked as the engine's option is."""
        try:
            attrs.evolve(self.options, steps_per_execution=steps_per_execution)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"invalid steps_per_execution: {error}") from None
        return steps_per_execution

    def _loop(self, spec, limit: int, role: str, dataset=None) -> CompiledLoop:
        """The run's validation loop when it fits ``spec`` and ``limit`` and gathers
        right on ``dataset`` (``None``: the validation data); else one traced for them
        (kept for the next evaluation)."""
        validation, loop = self.data.validation, self.parts.validation_loop
        data = validation if dataset is None else dataset
        gathering = Gathering.of(data, self.strategy, limit, role)
        if (
            loop is not None
            and limit <= loop.steps_per_execution
            and validation.element_spec == spec
            and _gathers_right(loop, gathering)
        ):
            return loop
        # The bound schedule too: a recipe in phases evaluates its current phase's.
        specs = tuple(sorted(spec_record(spec).items()))
        key = (limit, specs, id(self.parts.bound), gathering)
        if key not in self._loops:
            parts = self.parts
            with parts.names.scope():  # named as if traced with the run's other loops
                self._loops[key] = validation_loop(
                    parts.recipe, parts.bound, parts.validation_metrics, spec, self.options,
                    steps_per_execution=limit, strategy=self.strategy, label=parts.label,
                    random=parts.validation_random, role=role, gathering=gathering,
                )  # fmt: skip
        return self._loops[key]


def _gathers_right(loop: CompiledLoop, gathering: Gathering | None) -> bool:
    """Whether ``loop``'s gathers pad enough for data of ``gathering``."""
    traced = getattr(loop.step, "gathering", None)  # no strategy (or XLA): none
    return traced is None or traced.covers(gathering)
