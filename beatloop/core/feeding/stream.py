"""The data stream: the training data as passes, the validation data, and letting go of
their iterators.

A *pass* is one iterator over the training data, from its first batch to its end (or
to the end of an epoch, with ``steps_per_epoch``). The position in the data is kept in
the run's counters (passes opened, batches taken from the current pass), so a resumed
run rebuilds its iterator at the same batch: it opens, and drops, as many iterators as
the interrupted run had opened (a shuffle that reshuffles each pass is then at the same
pass), and skips the batches already taken.

A new ``tf.data`` iterator each pass costs the passes after it (its autotuning starts
over), and destroying one joins its autotuning thread, waiting while that thread is busy
(``benchmarks/epoch_boundary.py`` measures both). So when a pass's length is known, the
passes are the repetitions of one iterator over the data repeated endlessly, each call
asking for no more than the pass has left: the repetitions give the same batches in
the same order as one iterator a pass. Other iterators the stream is done with go to
``IteratorReleaser``, which destroys them on a thread of its own; so does the kept one
when the stream is freed, and a call that raises leaves no iterator in its error's
traceback (``beatloop.core.feeding.letting_go``).
"""

from __future__ import annotations

import weakref

import tensorflow as tf

from beatloop.core.compiled.counters import Counters
from beatloop.core.compiled.loop import CallResult, CompiledLoop
from beatloop.core.data.batches import DataSplit
from beatloop.core.data.data_origin import refuse_endless_loop_data
from beatloop.core.devices.replicas import splits_batches
from beatloop.core.failures.errors import DataError
from beatloop.core.feeding import grappler_lines
from beatloop.core.feeding.letting_go import (
    APART,
    IteratorReleaser,
    forget_library_locals,
    release_apart,
)
from beatloop.core.feeding.sharding import as_one_device, warn_if_not_one_device


class DataStream:
    """A run's training passes and validation passes over one ``DataSplit``.

    With a ``strategy`` of several replicas both data sets are distributed: each global
    batch is cut into one part per replica (across workers, each takes its parts of the
    global batches one device would take: ``beatloop.core.feeding.sharding``; where the training
    data cannot, one ``ReproducibilityWarning`` says why, naming the run by ``label``). A
    one-replica strategy's data are read as without a strategy
    (``replicas.splits_batches``).
    """

    def __init__(
        self,
        split: DataSplit,
        counters: Counters,
        strategy: tf.distribute.Strategy | None = None,
        label: str | None = None,
    ):
        self.counters = counters
        self._strategy = strategy
        if strategy is not None:
            warn_if_not_one_device(strategy, as_one_device(strategy, split.train), label)
        self._length = _pass_length(split.train, strategy)
        self._passes = _distributed(strategy, split.train)  # one iterator, one pass
        # Passes of a known length are the repetitions of one endless iterator.
        self._train = split.train.repeat() if self._length else self._passes
        self._validation = _distributed(strategy, split.validation)
        self._current: list = []  # the training iterator, while it is kept
        APART.start()  # here, not in the collection that may free the stream
        weakref.finalize(self, release_apart, self._current).atexit = False
        self._open = False  # a pass is open
        self._taken = 0  # batches taken from the open pass
        self._releaser = IteratorReleaser()
        self._called: set[CompiledLoop] = set()

    @property
    def has_validation(self) -> bool:
        return self._validation is not None

    def train(self, loop: CompiledLoop, limit: int, epoch_start: bool = False) -> CallResult:
        """One compiled call on the open pass (a pass opens if none is). A call never
        crosses the end of a pass: at most the pass's remaining batches are asked for.
        At an epoch's start (``epoch_start``) a pass that ended exactly where the last
        epoch did (``steps_per_epoch`` a divisor of its length) is closed and the next
        one read: the epoch is not an empty one."""
        if not self._open:
            if not self._current:
                self._current.append(iter(self._train))
            self.counters.open_pass()
            self._open, self._taken = True, 0
        taken = self._taken
        result = self._on_open_pass(loop, limit)
        if epoch_start and result.ran == 0 and not result.faulted and taken > 0:
            self.end_pass()
            return self.train(loop, limit)
        return result

    def _on_open_pass(self, loop: CompiledLoop, limit: int) -> CallResult:
        if self._length:
            limit = min(limit, self._length - self._taken)
            if limit == 0:
                return CallResult(0)
        try:
            result = self._call(loop, self._current[0], limit)
        except BaseException as error:
            forget_library_locals(error)
            raise
        self._taken += result.ran
        return result

    def end_pass(self) -> None:
        """Close the open pass. The iterator of a whole pass of known length is kept (its
        next repetition is the next pass); any other is let go of without waiting."""
        if not (self._length and self._taken == self._length):
            self._let_go()
        self._open = False
        self.counters.close_pass()

    def validate(
        self, loop: CompiledLoop, limit: int, dataset: tf.data.Dataset | None = None
    ) -> None:
        """One whole pass over the validation data (or over ``dataset``, distributed like
        it: an evaluation), ``limit`` steps per call."""
        data = self._validation if dataset is None else _distributed(self._strategy, dataset)
        current = [iter(data)]
        try:
            while self._call(loop, current[0], limit).ran == limit:
                pass
        except BaseException as error:
            forget_library_locals(error)
            raise
        finally:
            self._releaser.release(current)

    def wait(self) -> None:
        """Until every iterator let go of is destroyed."""
        self._releaser.wait()

    def reposition(self) -> None:
        """Rebuild the training iterator at the position the counters hold (after a
        checkpoint is restored)."""
        self._let_go()
        passes, taken = int(self.counters.passes), int(self.counters.pass_batches)
        self._open = taken >= 0 and passes > 0
        for _ in range(passes - 1 if self._open else passes):
            iter(self._passes)  # never read from: dropping it costs nothing
        if self._open:
            self._current.append(iter(self._train))
            within = taken if self._length is None else min(taken, self._length)
            skipped = self._taken = int(_skip(self._current[0], tf.constant(within, tf.int64)))
            if skipped != taken:
                raise DataError(
                    f"cannot resume: the checkpoint is {taken} batches into the training "
                    f"data, but the data set now gives only {skipped}"
                )

    def _call(self, loop: CompiledLoop, iterator, limit: int) -> CallResult:
        """``loop(iterator, limit)``; its first call (where Grappler optimises the one
        graph a loop runs) with Grappler's give-up lines kept off stderr."""
        if loop in self._called:
            return loop(iterator, limit)
        self._called.add(loop)
        with grappler_lines.hidden():
            return loop(iterator, limit)

    def _let_go(self) -> None:
        if self._current:
            self._releaser.release([self._current.pop()])


@tf.function(reduce_retracing=True)
def _skip(iterator, count: tf.Tensor) -> tf.Tensor:
    """Take ``count`` batches from ``iterator`` and drop them; return how many there were."""
    taken = tf.constant(0, tf.int64)
    for _ in tf.range(count):
        if not iterator.get_next_as_optional().has_value():
            break
        taken += 1
    return taken


def _pass_length(dataset: tf.data.Dataset, strategy) -> int | None:
    """Batches in one pass over ``dataset`` when known and finite (unless a strategy
    splits its batches; ``None`` otherwise)."""
    if splits_batches(strategy):
        return None
    cardinality = int(dataset.cardinality())
    return cardinality if cardinality > 0 else None


def _distributed(strategy, dataset):
    """A data set split across the strategy's replicas: each global batch is cut into
    one part per replica (as it is for one replica: nothing to cut); across workers,
    sharded by data unless it chose otherwise (``beatloop.core.feeding.sharding.as_one_device``)."""
    if not splits_batches(strategy) or dataset is None:
        return dataset
    return strategy.experimental_distribute_dataset(as_one_device(strategy, dataset))


def epoch_length(split: DataSplit, steps_per_epoch: int | None) -> int | None:
    """Steps in one epoch: ``steps_per_epoch`` if given, else the training data set's
    length if known. Endless data needs ``steps_per_epoch``; endless validation data is
    refused."""
    for role, dataset in (("training", split.train), ("validation", split.validation)):
        if dataset is None or dataset.cardinality() != tf.data.INFINITE_CARDINALITY:
            continue
        if role == "training" and steps_per_epoch is None:
            refuse_endless_loop_data(dataset)
        if role == "validation" or steps_per_epoch is None:
            raise DataError(
                f"the {role} data set repeats forever (.repeat() without a count); "
                + ("give it an end" if role == "validation" else "pass steps_per_epoch=N")
            )
    if steps_per_epoch is not None:
        return steps_per_epoch
    cardinality = int(split.train.cardinality())
    return cardinality if cardinality >= 0 else None
