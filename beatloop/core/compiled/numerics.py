"""The NaN/Inf guard's words and its eager check, and the opt-in divergence guard.

Every training step hands back its *checks*: a float32 ``[beats, 2]`` tensor holding, per
beat, its loss and the sum of squares of its gradients (summed over the beat's repeats
and over replicas; zero for a beat that did not run). All finite means all is well: the
compiled loop tests that with one reduction per step and stops at the first step that
fails, and ``describe_checks`` names the beat and the value, instead of the step
branching around every update.

With a ``DivergenceGuard`` (``divergence=`` factor) the checks gain a third column:
per beat, the running median its loss was found too far above (zero for every beat that
did not diverge), and a step faults when its checks are not all finite *or* that column
is not all zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tensorflow as tf

from beatloop.core.failures.errors import NumericsError

#: The checks' columns: loss and gradient squares (the divergence guard adds one).
COLUMNS = 2


def gradient_squares(grads) -> list[tf.Tensor]:
    """Half the sum of squares of each gradient: one ``L2Loss`` op per gradient (the
    cheapest reduction TensorFlow has for it), which ``beat_checks`` doubles once."""
    return [half_squares(g) for g in grads]


def half_squares(grad) -> tf.Tensor:
    """Half the sum of squares of ``grad``. An embedding's sparse gradient
    (``IndexedSlices``) comes with its rows already summed per index (the step's
    ``sparse_rows.summed_rows``, which the optimizer reads too): its rows' squares are
    the dense gradient's, non-finite exactly when those are, and no table-sized tensor
    is made."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.nn.l2_loss(grad.values)
    return tf.nn.l2_loss(grad)


def beat_checks(losses: Sequence[tf.Tensor], squares: Sequence[tf.Tensor]) -> tf.Tensor:
    """One beat's row of the checks: its summed loss and summed gradient squares
    (``squares`` from ``gradient_squares``: halves, doubled here exactly)."""
    return tf.stack([tf.add_n(list(losses)), tf.add_n(list(squares)) * 2.0 if squares else 0.0])


def no_checks(beats: int, columns: int = COLUMNS) -> tf.Tensor:
    """The checks of a step that checked nothing (all finite, nothing diverged)."""
    return tf.zeros([beats, columns])


def all_finite(checks: tf.Tensor) -> tf.Tensor:
    """Whether a step's checks are all finite: the NaN guard's test."""
    return tf.reduce_all(tf.math.is_finite(checks))


def describe_checks(beats: Sequence, checks, factor: float | None = None) -> str:
    """Words for the first fault in a step's checks: a non-finite loss, else a non-finite
    gradient norm, else (with the divergence guard's column) a diverged loss; ``beats``
    are the bound beats, in schedule order, ``factor`` the divergence guard's."""
    rows = list(zip(beats, checks, strict=True))
    for beat, row in rows:
        if not math.isfinite(float(row[0])):
            return f"beat {beat.name!r} produced a non-finite loss ({float(row[0])}){_summed(beat)}"
    for beat, row in rows:
        if not math.isfinite(float(row[1])):
            norm = math.sqrt(float(row[1])) if float(row[1]) >= 0 else float("nan")
            return f"beat {beat.name!r} produced a non-finite gradient global norm ({norm})"
    for beat, row in rows:
        if len(row) > COLUMNS and float(row[2]) != 0.0:
            return diverged_words(beat, float(row[0]), float(row[2]), factor)
    return "no non-finite or diverged value"


def diverged_words(beat, loss: float, median: float, factor: float | None) -> str:
    """``beat 'loss' diverged: loss 6.7e+08 is above 10 times its running median 2.31``."""
    return (
        f"beat {beat.name!r} diverged: loss {loss:.4g}{_summed(beat)} is above "
        f"{factor:g} times its running median {median:.4g}"
    )


def _summed(beat) -> str:
    return f" (summed over its {beat.repeat} repeats)" if beat.repeat > 1 else ""


def check_finite(beat_name: str, loss, grads, step, loss_scaled: bool) -> None:
    """Eager-only check (debug mode): stop at the first non-finite loss or gradient norm,
    before the update is applied (under loss scaling the gradients may overflow: the
    optimizer skips those updates, so only the loss is checked)."""
    value = float(loss)
    number = int(step) + 1  # steps are numbered from 1 in every message, as compiled ones
    if not math.isfinite(value):
        raise NumericsError(
            f"beat {beat_name!r} produced a non-finite loss ({value}) at step {number}, "
            "before its update was applied"
        )
    if loss_scaled:
        return
    norm = float(tf.linalg.global_norm(grads))
    if not math.isfinite(norm):
        raise NumericsError(
            f"beat {beat_name!r} produced a non-finite gradient global norm ({norm}) at step "
            f"{number} (loss {value}), before its update was applied"
        )


class DivergenceGuard:
    """Stops a run whose loss runs away while staying finite.

    The rule: a beat's loss (its checks' loss: summed over its repeats and, under a
    strategy, the global batch's) *diverges* when ``|loss| > factor * median``, the
    median of ``|loss|`` over the beat's last ``window`` finite steps, as soon as that
    window holds one value and the median is above zero. Absolute values, so losses that
    are negative (a WGAN critic's) compare by size; a median of zero never fires. The
    window fills from a beat's first step: a learning rate that blows the loss up at the
    second step (2.3 → 1e20) is caught there, where a window that waited for more
    values would already hold the blown-up ones. Only the steps a beat ran (``every``)
    and that faulted nowhere add to its window.

    The window is a ring buffer per beat (``values``, ``counts``: values pushed so far),
    made outside any strategy's scope and updated on the checks already summed over the
    replicas, in cross-replica context; it is checkpointed with the run.
    """

    #: The guarded checks' columns: loss, gradient squares, the median where it diverged.
    columns = COLUMNS + 1

    def __init__(self, beats: Sequence, factor: float, window: int):
        self.beats = tuple(beats)
        self.factor = float(factor)
        self.window = int(window)
        self._index = {beat.name: index for index, beat in enumerate(self.beats)}
        self.values = tf.Variable(
            tf.zeros([len(self.beats), self.window]), trainable=False, name="divergence_window"
        )
        self.counts = tf.Variable(
            tf.zeros([len(self.beats)], tf.int64), trainable=False, name="divergence_counts"
        )

    def variables(self) -> list[tf.Variable]:
        """The window's state, for checkpoints."""
        return [self.values, self.counts]

    def medians(self) -> tf.Tensor:
        """Each beat's running median of ``|loss|``; zero while its window is empty."""
        filled = tf.minimum(self.counts, self.window)
        # The ring buffer fills positions 0, 1, ...: the first ``filled`` are taken.
        taken = tf.range(self.window, dtype=tf.int64)[None, :] < filled[:, None]
        ordered = tf.sort(tf.where(taken, self.values, math.inf), axis=1)
        low = tf.gather(ordered, tf.maximum(filled - 1, 0) // 2, batch_dims=1)
        high = tf.gather(ordered, filled // 2, batch_dims=1)
        return tf.where(filled > 0, low * 0.5 + high * 0.5, 0.0)

    def diverged(self, losses: tf.Tensor, medians: tf.Tensor) -> tf.Tensor:
        """Per beat, whether ``losses`` are above the factor times ``medians``."""
        return tf.logical_and(medians > 0.0, tf.abs(losses) > self.factor * medians)

    def watch(self, checks: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
        """A step's checks with the divergence column added (the median where a beat
        diverged, else zero); a step that faulted nowhere pushes each beat that ran into
        its window. ``step`` is the step's number (from zero), as the step takes it."""
        losses = checks[:, 0]
        medians = self.medians()
        diverged = self.diverged(losses, medians)
        ok = tf.logical_and(all_finite(checks), tf.logical_not(tf.reduce_any(diverged)))
        every = tf.constant([beat.every for beat in self.beats], tf.int64)
        pushed = tf.logical_and(tf.equal(step % every, 0), ok)
        at = tf.range(self.window, dtype=tf.int64)[None, :] == (self.counts % self.window)[:, None]
        self.values.assign(
            tf.where(tf.logical_and(at, pushed[:, None]), tf.abs(losses)[:, None], self.values)
        )
        self.counts.assign_add(tf.cast(pushed, tf.int64))
        column = tf.where(diverged, medians, 0.0)
        return tf.concat([checks, column[:, None]], axis=1)

    @staticmethod
    def ok(checks: tf.Tensor) -> tf.Tensor:
        """Whether a step's guarded checks are all finite and nothing diverged."""
        return tf.logical_and(all_finite(checks), tf.reduce_all(tf.equal(checks[:, 2], 0.0)))

    def check_eager(self, beat, loss, step) -> None:
        """Eager-only check (debug mode), before the beat's (last repeat's) update is
        applied: raise if its step's ``loss`` diverged. ``step`` numbers from zero."""
        index = self._index[beat.name]
        median = self.medians()[index : index + 1]
        if bool(self.diverged(tf.reshape(loss, [1]), median)[0]):  # the compiled test's ops
            words = diverged_words(beat, float(loss), float(median[0]), self.factor)
            raise NumericsError(f"{words} at step {int(step) + 1}")


#: How many times its first value a beat's epoch loss may grow before the run is warned
#: that it ran away (with the divergence guard off); a first value below 1 counts as 1.
RUNAWAY_FACTOR = 1e6


def runaway_words(beat: str, epoch: int, loss: float, first: float | None) -> str | None:
    """The one-line warning for beat ``beat``'s ``loss`` logged at the end of epoch
    ``epoch`` (from 0) when it ran away: not finite, or ``|loss|`` above
    ``RUNAWAY_FACTOR`` times ``max(|first|, 1)`` (``first``: its first value in this
    run); ``None`` when it did not."""
    if math.isfinite(loss):
        if first is None or not math.isfinite(first):
            return None
        if abs(loss) <= RUNAWAY_FACTOR * max(abs(first), 1.0):
            return None
        how = f"{loss:.4g}, over {RUNAWAY_FACTOR:g} times its first value {first:.4g}"
    else:
        how = f"{loss}, not finite"
    return (
        f"the loss of beat {beat!r} ran away in epoch {epoch + 1}: {how}; the run went on "
        "because the divergence guard is off: pass divergence=10 (--divergence 10) to stop "
        "a run whose loss runs away (a learning rate too high, say)"
    )
