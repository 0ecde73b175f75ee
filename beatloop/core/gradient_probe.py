"""What a trace of a schedule's gradients shows before anything runs: claimed variables
a loss gives no gradient to (a ``ScheduleError``) and losses that draw from TensorFlow's
global random ops (a ``ResumeWarning``: no checkpoint holds their state).

``bind`` traces every group once to find them; a training loop traced when it is built
(compiled, no strategy) finds them in that trace instead (``TrainStep(probe=...)``), so
a run traces its losses and gradients once, not twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import tensorflow as tf

from beatloop.core.bound import BoundBeat, BoundGroup
from beatloop.core.errors import ScheduleError
from beatloop.core.randomness import global_random_ops, warn_global_random


@attrs.define
class GradientProbe:
    """Collects, over the traces of groups' gradients, the beats' missing gradients
    (``problems``) and the global random op types each group drew from
    (``global_random``, by what drew them)."""

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

    def found(self, context: str) -> list[str]:
        """The problems found, each once, after warning of global random ops (the
        warnings and the problems name ``context``)."""
        warn_global_random(self.global_random, context)
        return list(dict.fromkeys(self.problems))


def raise_found(probes: Sequence[GradientProbe], context: str, phases: Sequence[str] = ()) -> None:
    """Warn and raise what the ``probes`` of a run's training loops found: one probe, or
    one per phase (named by ``phases``), whose problems are raised together, each naming
    its phase, as ``bind`` reports phases."""
    if not phases:
        problems = [problem for probe in probes for problem in probe.found(context)]
    else:
        problems = [
            f"phase {name!r}: {problem}"
            for name, probe in zip(phases, probes, strict=True)
            for problem in probe.found(f"{context}, phase {name!r}")
        ]
    if problems:
        raise ScheduleError(problems, context)


def _where(group: BoundGroup) -> str:
    """What draws a group's random numbers, in words."""
    if group.forward_fn is None:
        return f"the loss of beat {group.name!r}"
    return f"group {group.name!r} (its forward or its beats' losses)"


def _no_gradient(beat: BoundBeat, variable) -> str:
    where = "its" if beat.group is None else f"its group {beat.group.name!r}'s forward and"
    return (
        f"beat {beat.name!r} claims variable {variable.path!r}, but {where} loss "
        f"{beat.loss_name!r} gives it no gradient (is the model called "
        f"{'inside the loss' if beat.group is None else 'in the forward'}, on a path "
        "connected to the result?)"
    )
