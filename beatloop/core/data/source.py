"""What a data source kind is: the ``DataSource`` base class and ``SourceConfig``, the
parameters every built-in kind shares, and the ``InferredSettingWarning`` a source
issues for a parameter it chose from the data.

This module imports nothing of the plugins or of the command line, so the registry
(which checks a registered class against ``DataSource``), the built-in kinds and the
loading code all import it, and none of them imports another in a circle.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from beatloop.core.failures.fields import FieldError, one_line_frozen

if TYPE_CHECKING:  # the annotation only: the warning below is importable without TensorFlow
    from beatloop.core.data.batches import DataSplit


def _fraction(instance, attribute, value) -> None:
    if not 0 <= value < 1:
        raise FieldError(
            type(instance).__name__, attribute.name, f" takes a number in [0, 1), got {value}"
        )


def _positive_or_none(instance, attribute, value) -> None:
    if value is not None and value <= 0:
        raise FieldError(
            type(instance).__name__, attribute.name, f" takes a number > 0, got {value}"
        )


class InferredSettingWarning(UserWarning):
    """A source parameter chosen from the data because it was not given (a folder's image
    size and colour mode), said each time the source is read: what the run trains on."""


@one_line_frozen
class SourceConfig:
    """Parameters every built-in source has.

    ``batch_size``: examples per batch (``None``: the recipe's ``batch_size`` field, else
    32). ``validation_fraction``: the share of examples held out for validation, chosen
    by the run's seed (0: no validation data unless ``--validation-data`` gives it, or
    the recipe's own ``validation_fraction`` is set with ``--set``).
    ``shuffle``: reshuffle the training examples every epoch (by the run's seed).
    """

    batch_size: int | None = attrs.field(default=None, validator=_positive_or_none)
    validation_fraction: float = attrs.field(default=0.0, validator=_fraction)
    shuffle: bool = True


class DataSource(abc.ABC):
    """Base class of data sources. One instance is one configured source on one path.

    Subclasses set ``name`` (an identifier: the ``KIND`` of ``--data KIND:PATH``) and
    ``Config`` (an attrs frozen class of parameters with defaults, usually a subclass of
    ``SourceConfig``), and implement ``load``; one that reads no path sets
    ``needs_path = False`` (``--data KIND``). The first line of the class
    docstring is what ``beatloop data`` shows.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = SourceConfig
    #: Whether the source reads a path (``--data KIND:PATH``). ``False``: a source that
    #: makes its data (or finds it by its parameters) is named ``--data KIND`` alone,
    #: its ``path`` then ``""`` (``KIND:PATH`` still works, the path given to it).
    needs_path: ClassVar[bool] = True

    def __init__(self, path: str, config: Any = None):
        self.path = path
        self.config = self.Config() if config is None else config

    @classmethod
    def description(cls) -> str:
        """The class docstring's first paragraph, on one line."""
        doc = (inspect.getdoc(cls) or "").strip()
        return " ".join(doc.split("\n\n")[0].split())

    @property
    def label(self) -> str:
        """``folder:PATH`` (``KIND`` for a source given no path): the source as it is
        named on the command line."""
        return f"{self.name}:{self.path}" if self.path else self.name

    @abc.abstractmethod
    def load(self, seed: int, batch_size: int) -> DataSplit:
        """The data as batched dict pipelines: training, and validation (or ``None``).
        ``seed`` is the run's: splits and shuffles drawn from it are reproducible."""

    def files(self) -> list[Path] | None:
        """The files this source reads, for ``run.json``'s record of the data's identity
        (``data_files``: a resume on changed files is refused); ``None`` (the default):
        it does not say, and nothing is recorded."""
        return None

    def facts(self) -> dict[str, str]:
        """What names the data beyond its files (a data set's name, version and split),
        recorded in ``run.json`` beside them (``data_files``): a resume on other facts is
        refused as on changed files; ``{}`` (the default): nothing more to record."""
        return {}

    def hint(self, missing: Sequence[str]) -> str:
        """What to do when the recipe needs the batch keys ``missing``; '' if nothing."""
        return ""
