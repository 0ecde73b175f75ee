"""Runs described in files: ``beatloop run --config run.toml`` or ``--config
RUN_DIR/run.json`` (a recorded run, replayed).

A run file holds what the ``run`` command's flags say, under the flags' names with
underscores (``steps_per_execution = 32``, ``data = "csv:table.csv"``), plus ``recipe``,
a ``[config]`` table of the recipe's fields, ``callbacks = ["csv"]``, a ``[models]``
table (``teacher = "teacher.keras"``), a ``[data_set]`` table of the data source's
parameters and ``import = ["my_pkg.recipes"]``, the modules to import first (as
``--import``: the command imports them before it looks the recipe up). The command's own
flags override the file, and ``--set`` overrides its ``[config]``; ``--import`` adds to
its ``import``. A recorded ``run.json`` gives its recipe, config, seed, epochs, precision,
steps per execution, checkpoint interval, ``--keep-best`` figure and the data named on
the command line: the same run again, bit for bit. It imports nothing: the module its
recipe came from (``recipe_module``) is only named when the recipe is not registered.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import attrs

from beatloop.core.failures.errors import ConfigError, did_you_mean
from beatloop.core.running.pacing import steps_per_execution

#: What a recorded run.json gives a replay, by the run command's option names.
RECORDED = ("recipe", "config", "seed", "op_determinism", "epochs", "precision",
            "steps_per_execution", "checkpoint_every", "keep_best")  # fmt: skip


@attrs.frozen
class RunFile:
    """A run file's contents: the recipe, its config fields, and the ``run`` command's
    options by their names (``epochs``, ``on_nan``, ``callback``: a list, ``model``: a
    list of ``NAME=PATH``)."""

    path: Path
    recipe: str | None
    config: dict = attrs.field(factory=dict)
    options: dict = attrs.field(factory=dict)
    #: A recorded ``run.json`` (its config is its recipe's, whole), not a TOML run file.
    recorded: bool = False
    #: The module a recorded run's recipe came from (``run.json``'s ``recipe_module``).
    recipe_module: str | None = None

    @property
    def imports(self) -> list[str]:
        """The modules the file's ``import = [...]`` names, to import before the recipe
        is looked up."""
        return list(self.options.get("imports", []))

    def refuse_other_recipe(self, name: str | None, fields: Callable[[], Collection[str]]) -> None:
        """Refuse the recipe ``name`` given on the command line where the file's config
        belongs to the file's own recipe: a recorded run's always, a TOML file's when its
        ``[config]`` has fields ``name``'s config (``fields()``) lacks."""
        if name is None or self.recipe is None or name == self.recipe:
            return
        replay = f"run it without naming a recipe (beatloop run --config {self.path})"
        if self.recorded:
            raise ConfigError(
                f"{self.path} is a run of recipe {self.recipe!r}, not {name!r}: {replay}, or "
                f"train {name!r} without this --config"
            )
        foreign = sorted(set(self.config) - set(fields()))
        if foreign:
            raise ConfigError(
                f"{self.path} is a run file of recipe {self.recipe!r}, not {name!r}: its "
                f"[config] has fields {name!r} lacks ({', '.join(foreign)}); {replay}, or "
                f"write a run file for {name!r}"
            )


def read_run_file(path: str | Path, options: Mapping[str, Any]) -> RunFile:
    """Read a TOML run file or a recorded ``run.json``; ``options`` are the ``run``
    command's argparse actions by name, which the file's values are checked against."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file (a .toml run file or a run.json)")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return _recorded(path, text, options)
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config {path} is not valid TOML: {error}") from None
    return _run_file(path, values, options)


def _recorded(path: Path, text: str, options: Mapping[str, Any]) -> RunFile:
    """A run.json as a run file: what makes the same run again."""
    try:
        record = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"--config {path} is not valid JSON: {error}") from None
    if not isinstance(record, dict) or "recipe" not in record or "config" not in record:
        raise ConfigError(
            f"--config {path} is not a beatloop run.json (it has no recipe and config)"
        )
    values = {key: record[key] for key in RECORDED if key in record}
    source = record.get("data_source")  # the data named on the command line, if any
    if isinstance(source, dict):
        values.update({k: v for k, v in source.items() if v not in (None, [])})
    module = record.get("recipe_module")
    module = module if isinstance(module, str) else None
    return attrs.evolve(_run_file(path, values, options), recorded=True, recipe_module=module)


def _run_file(path: Path, values: Mapping[str, Any], options: Mapping[str, Any]) -> RunFile:
    values = dict(values)
    recipe = values.pop("recipe", None)
    if recipe is not None and not isinstance(recipe, str):
        raise ConfigError(f"{path}: 'recipe' expects a recipe name, got {recipe!r}")
    config = values.pop("config", {})
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: [config] expects a table of config fields, got {config!r}")
    checked, problems = {}, []
    for key, value in values.items():
        name = {"callbacks": "callback", "models": "model", "import": "imports"}.get(key, key)
        action = options.get(name)
        if action is None or name in ("config", "set", "recipe", "verbose") or key == "imports":
            keys = {*options, "callbacks", "models", "import"}
            known = sorted(keys - {"callback", "model", "set", "imports"})
            problems.append(f"unknown key {key!r}{did_you_mean(key, known)}")
            continue
        try:
            checked[name] = _checked(key, value, action)
        except ConfigError as error:
            problems.append(str(error))
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return RunFile(path, recipe, _tupled(config), checked)


def _checked(key: str, value: Any, action) -> Any:
    """``value`` as the option's flag would have given it, or a ConfigError."""
    if key == "callbacks":
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"'callbacks' expects a list of callback names, got {value!r}")
        return value
    if key == "import":
        if not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
            raise ConfigError(
                "'import' expects a list of module names or .py paths (import = "
                f'["my_pkg.recipes"]), got {value!r}'
            )
        return value
    if key == "data_set":  # a table of the data source's parameters, or NAME=VALUE texts
        if isinstance(value, dict):
            return [f"{name}={setting_text(v)}" for name, v in value.items()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise ConfigError(f"[data_set] expects NAME = value entries, got {value!r}")
    if key == "models":
        if not (isinstance(value, dict) and all(isinstance(v, str) for v in value.values())):
            raise ConfigError(f'[models] expects NAME = "PATH.keras" entries, got {value!r}')
        return [f"{name}={model}" for name, model in value.items()]
    if action.nargs == 0:  # a flag
        if not isinstance(value, bool):
            raise ConfigError(f"{key!r} expects true or false, got {value!r}")
        return value
    kind = action.type
    if value is None:
        return None
    if kind is steps_per_execution:
        try:
            return steps_per_execution(value)
        except ValueError as error:
            raise ConfigError(f"{key!r} {error}") from None
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise ConfigError(f"{key!r} expects an integer, got {value!r}")
    if kind is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"{key!r} expects a number, got {value!r}")
        value = float(value)
    if kind is Path:
        if not isinstance(value, str):
            raise ConfigError(f"{key!r} expects a path, got {value!r}")
        value = Path(value)
    if kind is None and not isinstance(value, str):
        raise ConfigError(f"{key!r} expects text, got {value!r}")
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(repr, action.choices))
        raise ConfigError(f"{key!r} expects one of {choices}, got {value!r}")
    return value


def setting_text(value: Any) -> str:
    """A TOML value as ``--data-set NAME=VALUE`` writes it (``28,28``, ``true``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(setting_text(v) for v in value)
    return str(value)


def _tupled(value: Any) -> Any:
    """TOML and JSON arrays as the tuples attrs configs hold."""
    if isinstance(value, list):
        return tuple(_tupled(v) for v in value)
    if isinstance(value, dict):
        return {k: _tupled(v) for k, v in value.items()}
    return value
