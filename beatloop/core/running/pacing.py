"""How many steps each compiled call runs: a fixed K, or ``"auto"``.

``"auto"`` times the engine's calls, each from its ``execution_start`` event to the end
of its ``execution_end`` work (so the host's share between calls counts), the fastest
of a few calls per K (noise only ever adds time). K doubles from 1; once three K above
1 are timed, a call's time is fitted as ``per_call + K * per_step`` and K jumps to the
smallest power of two at which a call lasts at least 25 ms and ``per_call`` is under 2%
of the time (of a call; of an epoch when its length is known, its last, shorter call
counted), and settles there.
It stops before a call would last longer than about 0.25 s (progress, Ctrl-C and
callbacks stay responsive), at the largest K a callback allows, and at the first power
of two covering a whole pass. Results do not depend on K (the compiled loop takes K as
an argument: no K traces anew), so the choice only moves speed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable

import attrs

from beatloop.core.failures.errors import ConfigError

#: The value of ``steps_per_execution`` that lets the engine choose.
AUTO = "auto"
#: The largest K ``"auto"`` tries.
AUTO_CEILING = 1024
#: Steps per call of an evaluation under ``"auto"`` before training has chosen a K.
EVALUATION_STEPS = 32

_log = logging.getLogger("beatloop")


@attrs.frozen
class AutoTargets:
    """What ``"auto"`` aims for: per-call overhead under ``overhead`` of a call, calls no
    shorter than ``shortest_call`` seconds (a floor that holds when noise hides a small
    overhead from the fit) and no longer than ``longest_call``, each K judged by the
    fastest of ``samples`` calls (the fastest, because noise only ever adds time)."""

    overhead: float = 0.02
    shortest_call: float = 0.025
    longest_call: float = 0.25
    samples: int = 3


class FixedPace:
    """The K the user gave: every call runs up to K steps."""

    auto = False
    settled = True

    def __init__(self, steps: int):
        self.steps = steps

    @property
    def chosen(self) -> int:
        return self.steps

    def observe(self, ran: int, limit: int, seconds: float) -> None:
        """Nothing to learn: K is fixed."""

    def pass_ended(self, steps: int) -> None:
        """Nothing to learn: K is fixed."""


class AutoPace:
    """K chosen by timing calls (see the module's docstring): starts at 1, doubles, and
    once three K above 1 are timed jumps to the K the fitted overhead asks for; then
    keeps that K (``settled``) for the rest of the run. ``timings`` maps each K timed to
    its fastest call's seconds."""

    auto = True

    def __init__(
        self,
        ceiling: int = AUTO_CEILING,
        targets: AutoTargets | None = None,
        span: int | None = None,
        agree: Callable[[float], float] | None = None,
    ):
        self.targets = targets or AutoTargets()
        self._agree = agree  # several workers: every worker's timing made one
        self.ceiling = max(1, ceiling)
        self.span = span  # the most steps a call can run (an epoch, checkpoint_every)
        self.steps = 1
        self.settled = self.ceiling == 1
        self.timings: dict[int, float] = {}
        self._warm: set[bool] = set()  # the compiled functions called once (K=1, K>1)
        self._samples: list[float] = []  # seconds of the calls at this K

    @property
    def chosen(self) -> int | None:
        """The K settled on, ``None`` while still choosing."""
        return self.steps if self.settled else None

    def observe(self, ran: int, limit: int, seconds: float) -> None:
        """One call of ``limit`` steps ran ``ran`` of them in ``seconds`` (host work
        around it included)."""
        if self.settled or ran == 0 or ran != limit or limit != self.steps:
            return  # a call cut short (the data's or the epoch's end) is not this K's
        function = limit > 1  # the one-step and the K-step functions
        if function not in self._warm:  # a function's first call optimises its graph
            self._warm.add(function)
            return
        self._samples.append(seconds)
        if len(self._samples) >= self.targets.samples:
            fastest = min(self._samples)
            self.timings[self.steps] = fastest if self._agree is None else self._agree(fastest)
            self._samples = []
            self._choose()

    def pass_ended(self, steps: int) -> None:
        """A pass ended after ``steps`` steps: a K beyond it cannot help."""
        self.span = steps if self.span is None else min(self.span, steps)
        self.ceiling = min(self.ceiling, _power_of_two_at_least(steps))
        if self.steps >= self.ceiling and not self.settled:
            self._settle(self.ceiling)

    def overhead(self) -> tuple[float, float] | None:
        """``(per_call, per_step)`` seconds, fitted by least squares to the calls of
        K >= 2 timed (a call taking ``per_call + K * per_step``); ``None`` before three
        such K are timed."""
        points = [(k, seconds) for k, seconds in self.timings.items() if k >= 2]
        if len(points) < 3:
            return None
        mean_k = sum(k for k, _ in points) / len(points)
        mean_s = sum(s for _, s in points) / len(points)
        spread_k = sum((k - mean_k) ** 2 for k, _ in points)
        per_step = sum((k - mean_k) * (s - mean_s) for k, s in points) / spread_k
        return mean_s - per_step * mean_k, per_step

    def _choose(self) -> None:
        """Settle, or move to the next K to time, once this K's calls are timed."""
        steps, call = self.steps, self.timings[self.steps]
        if call > self.targets.longest_call and steps > 1:
            return self._settle(steps // 2)  # this K's calls already run too long
        following = self._wanted()
        if following is None:
            following = 2 * steps
        elif following <= steps:
            return self._settle(steps)
        following = min(following, self._longest(call / steps))
        if following <= steps:
            return self._settle(steps)
        if self.span is not None and following >= self.span:
            return self._settle(following)  # its calls are cut at the span: nothing to time
        self.steps = following

    def _wanted(self) -> int | None:
        """The smallest power of two K whose calls last the shortest call at least and
        whose fitted per-call overhead is under the target share (``None``: not fitted
        yet; twice this K when the fit sees no cost per step, which only noise or a
        dominating overhead give)."""
        fitted = self.overhead()
        if fitted is None:
            return None
        per_call, per_step = fitted
        if per_step <= 0:
            return 2 * self.steps
        steps = _power_of_two_at_least(self.targets.shortest_call / per_step)
        while (
            steps < self.ceiling and self._share(steps, per_call, per_step) > self.targets.overhead
        ):
            steps *= 2
        return steps

    def _share(self, steps: int, per_call: float, per_step: float) -> float:
        """The per-call overhead's share of the time at K = ``steps``: of one call, or,
        when the span is known, of the span, counting its last, shorter call (a K just
        short of the span pays for two calls where the next power of two pays for one)."""
        per_call = max(per_call, 0.0)  # a fit through noise may find it below zero
        calls = 1 if self.span is None else -(-self.span // steps)
        work = (steps if self.span is None else self.span) * per_step
        return calls * per_call / (calls * per_call + work)

    def _longest(self, per_step: float) -> int:
        """The largest power of two K up to the ceiling whose calls, at ``per_step``
        seconds a step (overhead included: an over-estimate), last at most the longest
        call allowed."""
        steps = 1
        while steps * 2 <= self.ceiling and steps * 2 * per_step <= self.targets.longest_call:
            steps *= 2
        return steps

    def _settle(self, steps: int) -> None:
        self.steps, self.settled = max(1, steps), True
        fitted = self.overhead()
        found = ""
        if fitted is not None:
            found = f" (a call: {1000 * fitted[0]:.3g} ms + K x {1000 * fitted[1]:.3g} ms)"
        _log.info("steps_per_execution='auto' chose %d steps per call%s", self.steps, found)


def steps_per_execution(value: int | str) -> int | str:
    """``"auto"`` or an integer >= 1, from command-line text or a run file's value (the
    name is what argparse shows for a bad value)."""
    if value == AUTO:
        return AUTO
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(f"expected 'auto' or an integer >= 1, got {value!r}")


def pace_for(
    steps_per_execution: int | str,
    *,
    debug: bool = False,
    callbacks: Iterable = (),
    epoch_steps: int | None = None,
    checkpoint_every: int | None = None,
    agree: Callable[[float], float] | None = None,
) -> FixedPace | AutoPace:
    """The pace of a run: fixed K, or ``"auto"`` up to the smallest
    ``max_steps_per_execution`` of the ``callbacks`` and the first power of two covering
    an epoch of ``epoch_steps`` or ``checkpoint_every`` steps (the engine ends calls at
    both under ``"auto"``), its timings made one by ``agree`` when several workers must
    choose alike (``workers.slowest_of``). A fixed K above a callback's limit is refused.
    Debug mode runs eagerly, one step at a time."""
    limits = {
        type(c).__name__: c.max_steps_per_execution
        for c in callbacks
        if getattr(c, "max_steps_per_execution", None) is not None
    }
    if steps_per_execution != AUTO:
        for name, limit in limits.items():
            if steps_per_execution > limit:
                raise ConfigError(
                    f"callback {name} works with at most {limit} step(s) per compiled call, "
                    f"but steps_per_execution is {steps_per_execution}: pass "
                    f"steps_per_execution={limit} or 'auto'"
                )
        return FixedPace(int(steps_per_execution))
    if debug:
        return FixedPace(1)
    ceiling = min([AUTO_CEILING, *limits.values()])
    spans = [steps for steps in (epoch_steps, checkpoint_every) if steps is not None]
    span = min(spans) if spans else None
    if span is not None:
        ceiling = min(ceiling, _power_of_two_at_least(span))
    return AutoPace(ceiling, span=span, agree=agree)


def _power_of_two_at_least(count: float) -> int:
    return 1 << max(0, math.ceil(count) - 1).bit_length()
