"""The compiled loop: up to K steps per call on a data set iterator (Keras's
``multi_step_on_iterator``).

The end of the data is a count, not an exception crossing the compiled boundary: a call
says how many steps it ran and whether the last one faulted (a non-finite check, or with
a divergence guard a diverged loss), in one integer the host reads once
(``CallResult``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import tensorflow as tf

from beatloop.core.compiled.counters import Counters
from beatloop.core.compiled.numerics import COLUMNS, DivergenceGuard, all_finite, no_checks

#: K's bound: the fault flag of a call's status (``CallResult``) rides above it.
MAX_STEPS_PER_EXECUTION = 1 << 20

Step = Callable[[Mapping[str, tf.Tensor], tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


@attrs.frozen
class CallResult:
    """What one compiled call did: ``ran`` steps (fewer than asked means the data ended
    or a step faulted); for a faulted step, its ``checks`` (see
    ``beatloop.core.compiled.numerics``).

    In compiled code the call returns one integer, ``status``: the steps it ran,
    plus a fault flag above every possible count; ``read`` decodes it.
    """

    ran: int
    faulted: bool = False
    checks: Any = None

    @staticmethod
    def status(ran: tf.Tensor, ok: tf.Tensor) -> tf.Tensor:
        """The call's status as one int32 tensor (in compiled code)."""
        return ran + (1 - tf.cast(ok, tf.int32)) * MAX_STEPS_PER_EXECUTION

    @classmethod
    def read(cls, status, checks) -> CallResult:
        """Decode a call's status; read the checks only when a step faulted."""
        faulted, ran = divmod(int(status), MAX_STEPS_PER_EXECUTION)
        return cls(ran, bool(faulted), checks.numpy() if faulted else None)


class FlatCall:
    """A concrete function called on its flattened inputs: ``concrete(*args)`` without
    binding ``args`` to its signature, host work TensorFlow otherwise redoes at every
    call; the same graph runs on the same tensors. ``tf.nest`` flattens the iterator to
    its resource handle. Only for arguments of the specs it was traced for (the loop's
    own data): a mismatch would not be reported as clearly as the binding reports it."""

    def __init__(self, concrete):
        self.concrete = concrete
        self._call_flat = getattr(concrete, "_call_flat", None)

    @property
    def graph(self) -> tf.Graph:
        return self.concrete.graph

    def __call__(self, *args):
        if self._call_flat is None:  # a TensorFlow without it: the plain call
            return self.concrete(*args)
        flat = tf.nest.flatten(args, expand_composites=True)
        return self._call_flat(flat, self.concrete.captured_inputs)


class CompiledLoop:
    """Runs up to ``steps_per_execution`` steps per call on a data set iterator.

    Compiled for the data set's element spec (the batch dimension unknown unless the data
    set fixes it, e.g. with ``drop_remainder=True``), so a short last batch reuses the
    same trace (docs/schedules.md: what that means for comparisons): on construction
    the one function its calls run, the one-step call when K is 1, else the K-step
    loop, which then runs every call, those of fewer steps included (one graph:
    Grappler may optimise a conditional and a loop body apart, and a recipe with
    second-order gradients can then differ in the last bit, so results would depend on
    where calls end); ``trace_count`` counts traces; ``graph`` is the traced graph. A step returns
    ``(checks, examples)`` with ``checks`` of ``checks`` rows; the loop stops early at the
    end of the data or at a step whose checks are not all finite. With a ``divergence``
    guard each step's checks pass through it (a column added, the guard's window
    updated, outside the XLA-compiled step) and a diverged loss stops the loop too;
    without one no op of it is traced. With ``counters`` it numbers the steps from the
    run's step count and advances the counters once per call.
    With ``fetch_ahead`` (the default) a step's next batch is asked for before the step
    runs, so the iterator works while the step computes; a step that faults then leaves
    that batch pulled and unused (the call's ``ran`` and the counters do not count it),
    which only a run that goes on after a fault (rolling back) must not do: it passes
    ``fetch_ahead=False``, asking for the next batch once the step turned out good.
    ``compiled=False`` runs the same code eagerly (debugging); ``jit_compile=True``
    compiles the step with XLA; ``distributed=True`` takes iterators of a distributed
    data set. ``trace_now=False`` leaves a compiled loop's trace to its first call (a
    run rebuilt only to evaluate never calls its training loop).
    """

    def __init__(
        self,
        step: Step,
        steps_per_execution: int,
        element_spec: Mapping[str, tf.TensorSpec],
        *,
        checks: int = 0,
        divergence: DivergenceGuard | None = None,
        counters: Counters | None = None,
        fetch_ahead: bool = True,
        compiled: bool = True,
        jit_compile: bool = False,
        distributed: bool = False,
        trace_now: bool = True,
    ):
        #: What applies the sums of accumulating entries at an epoch's end (``flush``).
        self._flush = None
        if getattr(step, "accumulates", False):
            self._flush = _traced_once(step.flush) if compiled else step.flush
        if jit_compile and compiled:
            # XLA compiles the step; the loop around it pulls from the iterator, which
            # XLA cannot compile. A new batch shape (a short last batch) compiles anew.
            step = tf.function(step, jit_compile=True, autograph=False)
        self.step = step
        self.steps_per_execution = steps_per_execution
        self.checks = checks
        self.divergence = divergence
        self.columns = COLUMNS if divergence is None else divergence.columns
        self.counters = counters
        self.fetch_ahead = fetch_ahead
        self.trace_count = 0
        self._limits: dict[int, tf.Tensor] = {}
        self._traced: dict[str, Callable] = {}
        self._functions = self._compile(element_spec, compiled, distributed)
        if compiled and not distributed and trace_now:
            # Trace now what the first full call runs: a recipe's mistakes, and data
            # that does not fit, show when the loop is built.
            _ = self._one if steps_per_execution == 1 else self._multi

    def _compile(self, element_spec, compiled: bool, distributed: bool):
        """The K-step and the one-step functions with their input specs (no one-step
        function: the K-step one serves both), each traced on its first use.

        Traced for the data set's spec and called as concrete functions on their
        flattened inputs (``FlatCall``), which skips tf.function's per-call argument
        matching and the concrete function's binding of them, and cannot retrace; a distributed
        iterator's spec is known only once it exists, so that case is traced by
        tf.function on the first call. A loop of K=1 needs no while loop: a
        conditional on the next batch is cheaper. AutoGraph is off: the control flow
        here is explicit, and a recipe's own code is converted where it is called
        (``call_user``).
        """
        if not compiled:
            return {"multi": (self.multi_step_on_iterator, None)}
        if distributed:
            return {"multi": (tf.function(self.multi_step_on_iterator, autograph=False), None)}
        iterator_spec = tf.data.IteratorSpec(dict(element_spec))
        limit_spec = tf.TensorSpec([], tf.int32, name="limit")
        multi = tf.function(self.multi_step_on_iterator, autograph=False)
        one = tf.function(self.one_step_on_iterator, autograph=False)
        return {"multi": (multi, (iterator_spec, limit_spec)), "one": (one, (iterator_spec,))}

    def _function(self, name: str) -> Callable | None:
        """The function ``name`` (``"multi"``, ``"one"``), traced on first use; ``None``
        when the loop has no such function."""
        if name not in self._traced:
            if name not in self._functions:
                return None
            function, specs = self._functions[name]
            if specs is not None:
                function = FlatCall(function.get_concrete_function(*specs))
            self._traced[name] = function
        return self._traced[name]

    @property
    def _multi(self) -> Callable:
        """The K-step function (traced on first use)."""
        return self._function("multi")

    @property
    def _one(self) -> Callable | None:
        """The one-step function (traced on first use; only a loop of K=1 runs it),
        ``None`` when the K-step function serves both."""
        return self._function("one")

    @property
    def graph(self) -> tf.Graph | None:
        """The traced graph of the function this loop's calls run (its node names are
        what Grappler orders sums by); ``None`` when the loop runs eagerly or is
        distributed (traced by ``tf.function`` on its first call)."""
        if not self._functions["multi"][1]:
            return None
        return (self._one if self.steps_per_execution == 1 else self._multi).graph

    def first_step_number(self) -> tf.Tensor:
        """The number of the call's first step: steps run before it."""
        if self.counters is None:
            return tf.constant(0, tf.int64)
        return self.counters.step.read_value()

    def checked_step(self, batch, number: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``(checks, examples, ok)`` of one step; ``ok``: nothing faulted."""
        checks, size = self.step(batch, number)
        if self.divergence is None:
            return checks, size, all_finite(checks)
        checks = self.divergence.watch(checks, number)
        return checks, size, self.divergence.ok(checks)

    def advance(self, ran: tf.Tensor, examples: tf.Tensor) -> None:
        if self.counters is not None:
            self.counters.advance(ran, examples)

    def multi_step_on_iterator(self, iterator, limit: tf.Tensor):
        """Up to ``limit`` steps; returns the call's status and the last step's checks."""
        self.trace_count += 1
        first = self.first_step_number()

        def more(count, examples, next_batch, ok, checks):
            return tf.logical_and(tf.logical_and(count < limit, next_batch.has_value()), ok)

        def fetch(another, current):
            return tf.cond(another, iterator.get_next_as_optional, lambda: current)

        def body(count, examples, next_batch, ok, checks):
            number = first + tf.cast(count, tf.int64)
            if self.fetch_ahead:  # the next batch is read while the step computes
                following = fetch(count + 1 < limit, next_batch)
            checks, size, ok = self.checked_step(next_batch.get_value(), number)
            if not self.fetch_ahead:  # only once the step is good: no batch pulled and lost
                following = fetch(tf.logical_and(count + 1 < limit, ok), next_batch)
            return count + 1, examples + size, following, ok, checks

        start = (
            tf.constant(0),
            tf.constant(0, tf.int64),
            iterator.get_next_as_optional(),
            tf.constant(True),
            no_checks(self.checks, self.columns),
        )
        count, examples, _, ok, checks = tf.while_loop(more, body, start)
        self.advance(count, examples)
        return CallResult.status(count, ok), checks

    def one_step_on_iterator(self, iterator):
        """At most one step: a conditional on the next batch."""
        self.trace_count += 1
        next_batch = iterator.get_next_as_optional()

        def run():
            checks, size, ok = self.checked_step(next_batch.get_value(), self.first_step_number())
            return CallResult.status(1, ok), checks, size

        def nothing():
            return tf.constant(0), no_checks(self.checks, self.columns), tf.constant(0, tf.int64)

        status, checks, size = tf.cond(next_batch.has_value(), run, nothing)
        self.advance(tf.cast(next_batch.has_value(), tf.int64), size)
        return status, checks

    def flush(self) -> None:
        """Apply the gradient sums the step's accumulating entries hold (at an epoch's
        end: ``beatloop.core.compiled.accumulation``); nothing for a step without."""
        if self._flush is not None:
            self._flush()

    def __call__(self, iterator, limit: int | None = None) -> CallResult:
        """Run up to ``limit`` (at most K) steps and say how many ran and why it stopped."""
        limit = self.steps_per_execution if limit is None else min(limit, self.steps_per_execution)
        if self.steps_per_execution == 1 and self._one is not None:
            status, checks = self._one(iterator)
        else:
            if limit not in self._limits:
                self._limits[limit] = tf.constant(limit, tf.int32)
            status, checks = self._multi(iterator, self._limits[limit])
        return CallResult.read(status, checks)


def _traced_once(fn: Callable) -> Callable:
    """``fn`` traced on its first call, then called as that concrete function: calls of a
    ``tf.function`` count toward TensorFlow's retracing warning by the method's code,
    which every loop of the process shares (a fifth fit's flush would warn)."""
    function, concrete = tf.function(fn, autograph=False), []

    def call():
        if not concrete:
            concrete.append(function.get_concrete_function())
        return concrete[0]()

    return call
