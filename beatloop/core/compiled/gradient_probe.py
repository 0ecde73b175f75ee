"""What a trace of a schedule's gradients shows before anything runs: claimed variables
a loss gives no gradient to (a ``ScheduleError``) and losses that draw from TensorFlow's
global random ops (a ``ResumeWarning``: no checkpoint holds their state).

``bind`` traces every group once to find them; a compiled training loop without a
strategy finds them in its own trace instead (``TrainStep(probe=...)``), so a run
traces its losses and gradients once, not twice: when the loop is built, or, for a run
rebuilt only to evaluate, on its first call, if any (``checked_at``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import tensorflow as tf

from beatloop.core.compiled.bound import BoundBeat, BoundGroup
from beatloop.core.compiled.randomness import global_random_ops, warn_global_random
from beatloop.core.failures.errors import ScheduleError
from beatloop.core.schedule.phases import Phases


@attrs.define
class GradientProbe:
    """Collects, over the traces of groups' gradients, the beats' missing gradients
    (``problems``) and the global random op types each group drew from
    (``global_random``, by what drew them), for the schedule named by ``context`` (of
    ``phase``, in a recipe in phases). ``at_trace_end``: the trace that ends raises
    what it found (``traced``), for a loop traced on its first call."""

    context: str = "the schedule"
    phase: str | None = None
    at_trace_end: bool = False
    problems: list[str] = attrs.field(factory=list)
    global_random: dict[str, list[str]] = attrs.field(factory=dict)

    def seen(self, group: BoundGroup, gradients, created: Sequence[tf.Operation]) -> list:
        """Record a group's traced ``gradients`` (``created``: the operations its trace
        created); returns them with zeros in place of the missing ones, so that the
        trace goes on and every problem is found in one pass."""
        where = _where(group)
        found = set(self.global_random.get(where, [])) | set(global_random_ops(created))
        self.global_random[where] = sorted(found)
        pairs = zip(group.beats, gradients, strict=True)
        return [self._filled(beat, grads) for beat, grads in pairs]

    def _filled(self, beat: BoundBeat, grads) -> list:
        filled = []
        for variable, grad in zip(beat.variables, grads, strict=True):
            if grad is None:
                self.problems.append(_no_gradient(beat, variable))
                grad = tf.zeros(variable.shape, variable.dtype)
            filled.append(grad)
        return filled

    def traced(self) -> None:
        """A trace of the step ended: a probe ``at_trace_end`` raises what it found."""
        if self.at_trace_end:
            raise_found([self])

    def found(self) -> list[str]:
        """The problems found, each once and naming the phase, after warning of global
        random ops (naming the context and phase)."""
        if self.phase is None:
            warn_global_random(self.global_random, self.context)
            return list(dict.fromkeys(self.problems))
        warn_global_random(self.global_random, f"{self.context}, phase {self.phase!r}")
        return [f"phase {self.phase!r}: {problem}" for problem in dict.fromkeys(self.problems)]


def raise_found(probes: Sequence[GradientProbe]) -> None:
    """Warn and raise what the ``probes`` of a run's training loops found (one, or one
    per phase): their problems together, each naming its phase, as ``bind`` names them."""
    problems = [problem for probe in probes for problem in probe.found()]
    if problems:
        raise ScheduleError(problems, probes[0].context)


def run_probes(schedule, label: str, trains: bool) -> list[GradientProbe]:
    """A probe per phase of ``schedule`` (one without phases), the schedule of the
    recipe ``label``: for a run that ``trains``, raised together once all its loops are
    traced (``raise_found``), else each as its loop is traced on its first call."""
    context = f"the schedule of {label}"
    if not isinstance(schedule, Phases):
        return [GradientProbe(context, at_trace_end=not trains)]
    phases = [phase.name for phase in schedule.phases]
    return [GradientProbe(context, name, at_trace_end=not trains) for name in phases]


def _where(group: BoundGroup) -> str:
    """What draws a group's random numbers, in words."""
    if group.forward_fn is None:
        return f"the loss of beat {group.name!r}"
    return f"group {group.name!r} (its forward or its beats' losses)"


def _no_gradient(beat: BoundBeat, variable) -> str:
    where = "its" if beat.group is None else f"the forward of its group {beat.group.name!r} and"
    return (
        f"beat {beat.name!r} claims variable {variable.path!r}, but {where} loss "
        f"{beat.loss_name!r} gives it no gradient (is the model called "
        f"{'inside the loss' if beat.group is None else 'in the forward'}, on a path "
        "connected to the result?)"
    )
