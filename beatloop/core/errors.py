"""Exceptions beatloop raises for mistakes it can recognise.

Every message says what was expected, what was found and, where it helps, what to do.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class BeatloopError(Exception):
    """Base class of every error beatloop raises on purpose."""

    # Raised while a step is being traced, it reaches the user as itself, not wrapped
    # in autograph's StagingError with a generated-code traceback.
    ag_pass_through = True


class ConfigError(BeatloopError, ValueError):
    """A recipe config field that does not exist, or a value of the wrong type or range."""


class DataError(BeatloopError, ValueError):
    """A data set whose batches lack the keys or shapes a recipe needs, or that is empty."""


class ScheduleError(BeatloopError, ValueError):
    """A beat schedule that breaks the binding rules; lists every problem found at once."""

    def __init__(self, problems: Iterable[str], context: str = "the schedule"):
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{context} has {len(self.problems)} problem(s):\n{lines}")


class RecipeNotFoundError(BeatloopError, KeyError):
    """A recipe name that no plugin registered."""

    def __init__(self, name: str, known: Iterable[str], failed_plugins: Iterable[str] = ()):
        known = sorted(known)
        self.name = name
        self.known = tuple(known)
        message = f"no recipe named {name!r}; known recipes: {', '.join(known) or '(none)'}"
        message += did_you_mean(name, known)
        failed = list(failed_plugins)
        if failed:
            message += "; plugins that failed to load: " + "; ".join(failed)
        super().__init__(message)

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0])


class RegistrationError(BeatloopError, ValueError):
    """A recipe or callback class that cannot be registered (duplicate name, missing part)."""


class CallbackError(BeatloopError, TypeError):
    """A callback class whose event methods do not match beatloop's events."""


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Return ' (did you mean X?)' for the closest candidate, or '' when none is close."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class NumericsError(BeatloopError, FloatingPointError):
    """A non-finite loss or gradient norm, named by beat and step."""


class CheckpointError(BeatloopError, OSError):
    """A checkpoint that cannot be written or read, or a run dir whose checkpoints belong
    to a different recipe, config or seed."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped a run after it saved a checkpoint to resume from."""

    def __init__(self, message: str, checkpoint: str | None):
        super().__init__(message)
        self.checkpoint = checkpoint
