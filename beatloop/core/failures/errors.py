"""Exceptions beatloop raises for mistakes it can recognise.

Every message says what was expected, what was found and, where it helps, what to do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from beatloop.core.failures.similar import closest_name

#: The command line's exit codes, by what ended the run (``beatloop --help`` lists them).
EXIT_CODES = {
    0: "done",
    1: "an unexpected error: a bug (the traceback is printed; please report it)",
    2: "a usage or config error, or an error in a recipe's or callback's own code",
    3: "a data error",
    4: "numerics: a non-finite or diverging loss or gradient",
    5: "a run dir or checkpoint error",
    6: "another worker of a multi-worker run was lost: start every worker again to resume",
    130: "interrupted by Ctrl-C (SIGINT), after saving a checkpoint",
    143: "stopped by SIGTERM (kill, Slurm, Docker, Kubernetes), after saving a checkpoint",
}


class BeatloopError(Exception):
    """Base class of every error beatloop raises on purpose."""

    #: The command line's exit status for this error (see ``EXIT_CODES``).
    exit_code = 2

    # Raised while a step is being traced, it reaches the user as itself, not wrapped
    # in autograph's StagingError with a generated-code traceback.
    ag_pass_through = True


class ConfigError(BeatloopError, ValueError):
    """A recipe config field that does not exist, or a value of the wrong type or range."""


class DataError(BeatloopError, ValueError):
    """A data set whose batches lack the keys or shapes a recipe needs, or that is empty."""

    exit_code = 3


class InputMismatchError(DataError):
    """A model called on data that does not fit it, found before the first step (when a
    step is traced) or by Keras inside a model that declares no inputs.

    Attributes: ``model`` (its name), ``input`` (its index, or its name for a dict of
    inputs), ``expected`` and ``expected_dtype`` (the shape and dtype the model declares;
    ``None`` when it declares none), ``found`` and ``found_dtype`` (what it was called
    with), ``key`` (the batch key the tensor is, when the loss passed a batch entry as
    it is), ``data_set`` (``"training"`` or ``"validation"``), ``recipe``, ``at`` (the
    recipe's line that called the model), ``detail`` (what Keras said, for a model that
    declares no inputs) and ``original`` (Keras's exception, if any).
    """

    def __init__(
        self,
        model: str,
        input: int | str,
        found: tuple,
        found_dtype: str,
        *,
        expected: tuple | None = None,
        expected_dtype: str | None = None,
        key: str | None = None,
        data_set: str | None = None,
        recipe: str | None = None,
        at: str | None = None,
        detail: str | None = None,
        original: BaseException | None = None,
    ):
        self.model, self.input, self.found, self.found_dtype = model, input, found, found_dtype
        self.expected, self.expected_dtype, self.key = expected, expected_dtype, key
        self.data_set, self.recipe, self.at = data_set, recipe, at
        self.detail, self.original = detail, original
        super().__init__(self._message())

    def _message(self) -> str:
        head = f"{self.recipe}: " if self.recipe else ""
        which = f"input {self.input}" if isinstance(self.input, int) else f"input {self.input!r}"
        data = f"the {self.data_set} data" if self.data_set else "the data"
        source = f" (batch key {self.key!r})" if self.key else ""
        found = f"{_shape_text(self.found)} {self.found_dtype}"
        if self.expected is not None:
            expected = f"{_shape_text(self.expected)} {self.expected_dtype}"
            message = (
                f"{head}model {self.model!r} expects {which} of shape {expected}, "
                f"but {data} gives {found}{source}"
            )
        else:
            message = (
                f"{head}model {self.model!r} does not fit {which} of shape {found} that "
                f"{data} gives{source}; it declares no input shape (build it on a "
                f"keras.Input to have the data checked against it), and Keras says: "
                f"{self.detail}"
            )
        return message + (f" — called from {self.at}" if self.at else "")

    def completed(
        self,
        *,
        recipe: str | None = None,
        data_set: str | None = None,
        at: str | None = None,
        found: tuple | None = None,
    ) -> InputMismatchError:
        """This error with what it does not know yet filled in (what it knows is kept);
        ``found`` replaces the shape found (the data's spec, for a mismatch found on a
        stand-in batch)."""
        return InputMismatchError(
            self.model,
            self.input,
            self.found if found is None else found,
            self.found_dtype,
            expected=self.expected,
            expected_dtype=self.expected_dtype,
            key=self.key,
            data_set=self.data_set or data_set,
            recipe=self.recipe or recipe,
            at=self.at or at,
            detail=self.detail,
            original=self.original,
        )


class MismatchFound(Exception):
    """Carries an ``InputMismatchError`` from a model call out through the recipe's
    code to ``call_user``, which adds the recipe's line.

    Not a BeatloopError on purpose: autograph records the recipe's (converted) frames
    only on exceptions that do not pass through it."""

    def __init__(self, error: InputMismatchError):
        super().__init__(str(error))
        self.error = error


class LabelRangeError(DataError):
    """A class label outside ``[0, classes)``, found when a step runs.

    Attributes: ``label`` (the value TensorFlow reported), ``limit`` (the number of
    classes the loss had: labels must lie in ``[0, limit)``), ``keys`` (the batch keys it
    can be in: the recipe's label keys with that many classes), ``field`` and ``classes``
    (the config field giving their number of classes, and its value), ``largest`` (the
    largest label in those keys over the whole data set, when it was read: the number of
    classes the advice asks for is one more), ``data_set``, ``recipe`` and ``original``
    (TensorFlow's error).
    """

    def __init__(
        self,
        label: int,
        limit: int,
        *,
        keys: tuple[str, ...] = (),
        field: str | None = None,
        classes: object = None,
        largest: int | None = None,
        data_set: str = "training",
        recipe: str | None = None,
        original: BaseException | None = None,
    ):
        self.label, self.limit, self.keys = label, limit, keys
        self.field, self.classes, self.largest = field, classes, largest
        self.data_set, self.recipe, self.original = data_set, recipe, original
        super().__init__(self._message())

    def _message(self) -> str:
        label, limit, field, classes = self.label, self.limit, self.field, self.classes
        head = f"{self.recipe}: " if self.recipe else ""
        where = f" in {' or '.join(repr(k) for k in self.keys)}" if self.keys else ""
        message = f"{head}the {self.data_set} data has label {label}{where}, outside [0, {limit})"
        counted = isinstance(classes, int) and not isinstance(classes, bool)
        if field is not None and counted:
            message += f" — the config field {field} is {classes}"
            if classes != limit:
                message += f", but the model gives {limit} classes"
        elif field is not None:
            message += f" — its classes come from the config field {field}, which is {classes!r}"
        needed = max(label, self.largest if self.largest is not None else label) + 1
        if self.largest is not None and self.largest > label and self.largest >= limit:
            message += f"; its largest label is {self.largest}"
        if label < 0:
            message += "; class labels count from 0: fix the labels"
        elif field is not None and counted and classes == limit:
            message += f"; fix the labels or set {field} (--set {field}={needed})"
        elif field is not None and counted:
            message += "; fix the labels or the model"
        elif field is not None:
            message += f"; fix the labels or change {field}"
        else:
            message += "; fix the labels or the number of classes"
        return message


def _shape_text(shape: tuple) -> str:
    """``(None, 64)``; a shape of unknown rank reads ``(unknown rank)``."""
    return "(unknown rank)" if shape is None else str(tuple(shape))


class ScheduleError(BeatloopError, ValueError):
    """A beat schedule that breaks the binding rules; lists every problem found at once."""

    def __init__(self, problems: Iterable[str], context: str = "the schedule"):
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{context} has {len(self.problems)} problem(s):\n{lines}")


class RecipeNotFoundError(BeatloopError, KeyError):
    """A recipe name nothing registered (``message``: what to say when more is known)."""

    def __init__(self, name: str, known: Iterable[str], failed_plugins: Iterable[str] = (),
                 *, message: str | None = None):  # fmt: skip
        known = sorted(known)
        self.name, self.known = name, tuple(known)
        if message is None:
            message = f"no recipe named {name!r}; known recipes: {', '.join(known) or '(none)'}"
            message += did_you_mean(name, known)
            if failed := list(failed_plugins):
                message += "; plugins that failed to load: " + "; ".join(failed)
        super().__init__(message)

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0])


class RegistrationError(BeatloopError, ValueError):
    """A recipe or callback class that cannot be registered (duplicate name, missing part)."""


class CallbackError(BeatloopError, TypeError):
    """A callback class whose event methods do not match beatloop's events."""


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Return ' (did you mean X?)' for the closest candidate (``closest_name``), or ''."""
    return f" (did you mean {close!r}?)" if (close := closest_name(name, candidates)) else ""


class NumericsError(BeatloopError, FloatingPointError):
    """A non-finite loss or gradient norm, named by beat and step."""

    exit_code = 4


class RunDirError(BeatloopError, OSError):
    """A run dir that cannot be used or written: it is a file, it or its parent is not
    writable, the disk is full. Names the path, what was wrong and what to do."""

    exit_code = 5


class CheckpointError(RunDirError):
    """A checkpoint that cannot be written or read, or a run dir whose checkpoints belong
    to a different recipe, config or seed."""


class UserCodeError(BeatloopError):
    """An exception raised by a recipe's own code (a loss, a metric update, a forward
    function), reported in that function: the recipe, the beat, the function, the
    recipe's own line that failed, and the original ``Type: message``. The original
    exception is ``original`` and the ``__cause__`` (raise it ``from error.original``:
    TensorFlow re-raises some errors ``from None``). A ``TypeError`` or ``ValueError``
    (often a shape or dtype that does not fit) also names the batches' shapes, where known.
    """

    def __init__(
        self,
        function: str,
        original: BaseException,
        *,
        beat: str | None = None,
        at: str | None = None,
        recipe: str | None = None,
        batches: str | None = None,
    ):
        self.function, self.original, self.beat, self.at = function, original, beat, at
        self.recipe, self.batches = recipe, batches
        head = f"{recipe}: " if recipe else ""
        beat_part = f" of beat {beat!r}" if beat else ""
        shapes = f" on batches of {batches}" if batches else ""
        text = str(original)
        if isinstance(original, KeyError) and "\n" in str(
            original.args[0] if original.args else ""
        ):
            text = str(original.args[0])  # a message (Keras's), not a key: unquoted
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Keras's terminal colours
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        detail = " ".join(lines[:6])
        if len(detail) > 500:
            detail = detail[:500] + "..."
        message = f"{head}{function}{beat_part} failed{shapes}: {type(original).__name__}: {detail}"
        super().__init__(message + (f"\n  at {at}" if at else ""))
        self.__cause__ = original

    def in_recipe(self, label: str, batches: str | None = None) -> UserCodeError:
        """This error naming the recipe ``label`` (unchanged if it names one already)
        and, for a type or value error, the ``batches`` it failed on."""
        if self.recipe is not None:
            return self
        if not isinstance(self.original, TypeError | ValueError):
            batches = None
        return UserCodeError(
            self.function, self.original, beat=self.beat, at=self.at, recipe=label, batches=batches
        )


class ResumeWarning(UserWarning):
    """Something in a recipe that works but breaks exact resume (a resumed run would not
    continue as the uninterrupted one), such as drawing from TensorFlow's global random
    ops instead of ``models.random``."""


class IgnoredSettingWarning(UserWarning):
    """A setting a run is given that has no effect, or not the one asked for (an ``only_if``
    never true, mixed precision on a float32 model: docs/errors.md)."""


class RunawayLossWarning(RuntimeWarning):
    """A beat's epoch loss that ran away (not finite, or over 1e6 times its first value)
    with the divergence guard off: once per run; ``divergence=`` stops such a run."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM stopped a run, after it saved a checkpoint to resume
    from (``checkpoint``; ``None`` when a second signal stopped it at once).

    ``signal`` is the signal's number; ``exit_code`` the command line's exit status for
    it, 128 plus that number as shells report a death by signal: 130 for Ctrl-C, 143
    for SIGTERM (``EXIT_CODES``)."""

    def __init__(self, message: str, checkpoint: str | None, signal: int = 2):
        super().__init__(message)
        self.checkpoint = checkpoint
        self.signal = signal

    @property
    def exit_code(self) -> int:
        return 128 + self.signal


class ReproducibilityWarning(UserWarning):
    """A run whose bits cannot match a fresh process's run of the same seed: ``models=``
    whose Keras names sort otherwise, workers' batches unlike one device's (``sharding``)."""
