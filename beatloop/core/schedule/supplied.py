"""Models a recipe's user supplies (a trained teacher, a pretrained feature network), and
the models a run is given: ``.keras`` paths loaded, the missing ones named in one error.

A recipe declares them in ``supplied_models`` as ``SuppliedModel`` values. One with
a ``fallback`` is built by the recipe's ``build_models`` when the user passes none; one
without is required. Either way a supplied model is frozen unless a beat updates it: the
binding rules do not ask for its variables to be declared frozen (``bind(supplied=...)``).
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs
import keras

from beatloop.core.failures.errors import ConfigError
from beatloop.core.failures.fields import one_line_frozen
from beatloop.core.schedule.beats import Schedule
from beatloop.core.schedule.phases import Phases, schedules_of


def _text(instance, attribute, value) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"SuppliedModel.{attribute.name} must be a non-empty text, got {value!r}")


@one_line_frozen
class SuppliedModel:
    """A model the user supplies: what it is, in one line, and what the recipe's
    ``build_models`` builds in its place when the user supplies none (``None``: nothing,
    so the model is required)."""

    description: str = attrs.field(validator=_text)
    fallback: str | None = attrs.field(default=None, validator=attrs.validators.optional(_text))

    @property
    def required(self) -> bool:
        return self.fallback is None

    def describe(self) -> str:
        """One line: the description, then the fallback or "required"."""
        return f"{self.description} ({self._instead()})"

    def _instead(self) -> str:
        return "required" if self.fallback is None else f"if none is given: {self.fallback}"


def model_names(
    schedule: Schedule | Phases, supplied: Mapping[str, SuppliedModel]
) -> tuple[str, ...]:
    """The model names a recipe uses: its schedule's selectors (``updates``, ``frozen``,
    ``shared``, what its updates write and read), its beats' and groups' ``training`` and
    its supplied models, in that order."""
    schedules = schedules_of(schedule)  # a recipe in phases: every phase's
    selectors = [s for each in schedules for beat in each.all_beats for s in beat.updates]
    selectors += [s for each in schedules for s in (*each.frozen, *each.shared)]
    selectors += [
        s
        for each in schedules
        for u in each.updates
        for s in (getattr(u, "source", None), *u.writes)
        if s
    ]
    names = [s.partition(":")[0] for s in selectors]
    modes = [entry for each in schedules for entry in (*each.all_beats, *each.groups)]
    names += [name for entry in modes for name in entry.training or ()]
    return tuple(dict.fromkeys([*names, *supplied]))


def how_to_pass(names: Iterable[str]) -> str:
    """How to give models: in Python, and on the command line."""
    names = list(names)
    python = ", ".join(f"{name!r}: model_or_path" for name in names)
    command = " ".join(f"--model {name}=PATH.keras" for name in names)
    return f"models={{{python}}} in Python, {command} on the command line"


def no_models_message(label: str, names: Iterable[str]) -> str:
    """What to say when a recipe that builds no models is not given the ones it needs."""
    return (
        f"{label} builds no models (it defines no build_models): pass models={{...}} with: "
        f"{', '.join(names) or '(none named by its schedule)'}"
    )


def missing_models(
    label: str,
    supplied: Mapping[str, SuppliedModel],
    given: Mapping[str, object],
    needed: Iterable[str] | None = None,
) -> None:
    """Raise one ConfigError naming every required supplied model not ``given`` and,
    for a recipe that builds no models (``needed`` given), every other model it needs."""
    wrong = {n: type(m).__name__ for n, m in supplied.items() if not isinstance(m, SuppliedModel)}
    if wrong:
        raise ConfigError(
            f"the supplied_models of {label} must map names to beatloop.SuppliedModel values; "
            f"found {wrong}"
        )
    problems = []
    absent = {n: m for n, m in supplied.items() if m.required and n not in given}
    if absent:
        lines = "".join(f"\n  - {name!r}: {model.description}" for name, model in absent.items())
        problems.append(
            f"{label} needs model(s) you supply:{lines}\npass them as {how_to_pass(absent)}"
        )
    needed = [name for name in needed or () if name not in given and name not in absent]
    if needed:
        problems.append(no_models_message(label, needed))
    if problems:
        raise ConfigError("\n".join(problems))


def loaded(models: Mapping[str, object] | None) -> dict[str, object]:
    """The given models with every path (``str`` or ``Path``) to a ``.keras`` file loaded
    (uncompiled); other values are kept for the caller to check."""
    return {
        name: _load(name, Path(value)) if isinstance(value, str | Path) else value
        for name, value in (models or {}).items()
    }


def _load(name: str, path: Path) -> keras.Model:
    """The model in the ``.keras`` file ``path``: what the path is instead (a folder,
    another suffix, a file that is not a ``.keras`` archive) is checked first, so the
    error says that rather than what Keras's loader makes of it."""
    where = f"cannot load model {name!r} from {str(path)!r}"
    problem = _not_a_keras_file(path)
    if problem:
        raise ConfigError(
            f"{where}: {problem}; a .keras file was expected (the zip archive "
            f"model.save('{name}.keras') writes)"
        )
    try:
        return keras.models.load_model(path, compile=False)
    except Exception as error:
        raise ConfigError(f"{where}: {type(error).__name__}: {error}") from error


def _not_a_keras_file(path: Path) -> str | None:
    """What ``path`` is when it is not a readable ``.keras`` archive; ``None`` when it
    is one."""
    if not path.exists():
        return "there is no such file"
    if path.is_dir():
        saved_model = (path / "saved_model.pb").is_file()
        return "it is a folder" + (
            " (a SavedModel: load it with keras.layers.TFSMLayer and pass the model)"
            if saved_model
            else ""
        )
    if path.suffix != ".keras":
        return f"it is a file with the suffix {path.suffix or '(none)'!r}"
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        return f"it is not a readable zip archive ({reason})"
    if "config.json" not in names:
        return "the zip archive holds no config.json (it was not written by model.save)"
    return None
