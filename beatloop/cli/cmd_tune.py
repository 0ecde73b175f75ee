"""``beatloop tune RECIPE --space FIELD=KIND:...``: an Optuna study over a recipe's
config, each trial a run in its own process and run dir; from flags or a TOML file."""

from __future__ import annotations

import tomllib
from pathlib import Path

from beatloop.cli.options import (
    add_data_options,
    add_set_option,
    add_steps_per_execution,
    command_parser,
)

NAME = "tune"

#: Defaults of the options a TOML file may also give (the flags win over the file).
DEFAULTS = {"trials": 20, "epochs": 3, "seed": 0, "jobs": 1, "pruner": "median",
            "objective": None, "storage": None, "study_name": None, "out": None,
            "steps_per_execution": "auto", "data": None, "validation_data": None}  # fmt: skip


def add_command(commands) -> None:
    tune = command_parser(
        commands,
        NAME,
        help="search a recipe's config with Optuna: best trials, best.toml, plots",
        description="Run an Optuna study over RECIPE's config fields: --trials runs of "
        "--epochs each, --jobs at once, each in its own process and run dir under --out, "
        "judged by the recipe's quality figure (or --objective) at its last epoch and "
        "pruned by --pruner from its per-epoch figures. The same command again continues "
        "the study (a trial that was running resumes from its checkpoint). Example: "
        "beatloop tune supervised --space learning_rate=log:1e-4:1e-1 --space "
        "hidden=int:16:256 --trials 20 --jobs 2",
    )
    tune.add_argument("recipe", nargs="?", help="a registered recipe name; may come from --config")
    tune.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="a TOML file: recipe, the options below by name, import (modules), [space] "
        '(FIELD = "log:1e-4:1e-1") and [config] (fixed fields)',
    )
    tune.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="FIELD=KIND:...",
        help="a config field to search: log:LOW:HIGH, float:LOW:HIGH, int:LOW:HIGH or "
        "choice:A,B,... (repeatable)",
    )
    add_set_option(tune, "fix a config field in every trial (repeatable)")
    _add_study_options(tune)
    add_steps_per_execution(tune)
    tune.set_defaults(steps_per_execution=None)
    add_data_options(tune)


def _add_study_options(tune) -> None:
    """The study's budget, objective, storage and what each trial runs with."""
    tune.add_argument("--trials", type=int, help="trials in the study (default 20)")
    tune.add_argument("--epochs", type=int, help="epochs per trial (default 3)")
    tune.add_argument("--seed", type=int, help="every trial's seed and the sampler's (default 0)")
    tune.add_argument("--jobs", type=int, help="trials at once, as processes (default 1)")
    tune.add_argument(
        "--objective",
        metavar="FIGURE:min|max",
        help="the logged figure to optimise, e.g. val_loss:min (default: the recipe's "
        "quality figure)",
    )
    tune.add_argument("--pruner", choices=("median", "hyperband", "none"), help="(default median)")
    tune.add_argument(
        "--storage",
        metavar="URL",
        help="an Optuna storage URL shared by several commands, e.g. "
        "postgresql://host/db (default: sqlite:///OUT/study.db)",
    )
    tune.add_argument("--study-name", help="the study's name in the storage (default: the recipe)")
    tune.add_argument("--out", type=Path, help="the study's dir (default: runs/tune-RECIPE)")
    tune.add_argument(
        "--callback",
        action="append",
        default=[],
        metavar="NAME",
        help="a registered callback each trial runs, e.g. mlflow: the study an MLflow run, "
        "each trial's run nested in it (repeatable; default: none)",
    )


def run(args) -> int:
    from beatloop.core.failures.errors import ConfigError
    from beatloop.tuning import tune
    from beatloop.tuning.report import format_trials

    values = _from_file(args.config) if args.config else {}
    recipe = args.recipe or values.pop("recipe", None)
    values.pop("recipe", None)
    if recipe is None:
        raise ConfigError("name a recipe to tune (beatloop tune RECIPE, or recipe = in --config)")
    space = [*values.pop("space", []), *args.space]
    settings = [*values.pop("set", []), *args.set]
    data_settings = [*values.pop("data_set", []), *args.data_set]
    callbacks = [*values.pop("callbacks", []), *args.callback]
    imports = [*values.pop("import", []), *args.imports]
    for name in DEFAULTS:
        given = getattr(args, name)
        values[name] = given if given is not None else values.get(name, DEFAULTS[name])
    out = values.pop("out") or Path("runs") / f"tune-{recipe}"
    result = tune(
        recipe,
        space,
        out=Path(out),
        settings=settings,
        data_settings=data_settings,
        callbacks=callbacks,
        imports=imports,
        **values,
    )
    print()
    print(format_trials(result.study, result.spec))
    print(f"\nstudy: {result.spec.storage_url} (optuna-dashboard {result.spec.storage_url})")
    if result.best_toml is not None:
        print(f"best run file: {result.best_toml} (beatloop run --config {result.best_toml})")
    for plot in result.plots:
        print(f"plot: {plot}")
    return 0


def _from_file(path: Path) -> dict:
    """A TOML tune file's values by option name: ``space`` and ``set`` as flag texts."""
    from beatloop.core.failures.errors import ConfigError, did_you_mean
    from beatloop.run_file import setting_text

    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file (a TOML tune file)")
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config {path} is not valid TOML: {error}") from None
    known = {"recipe", "space", "config", "data_set", "callbacks", "import", *DEFAULTS}
    unknown = [f"{k!r}{did_you_mean(k, known)}" for k in values if k not in known]
    if unknown:
        raise ConfigError(
            f"{path}: unknown key(s) {', '.join(unknown)}; keys: {', '.join(sorted(known))}"
        )
    tables = {}
    for key, flag in (("space", "space"), ("config", "set"), ("data_set", "data_set")):
        table = values.pop(key, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{key}] expects a table of NAME = value, got {table!r}")
        tables[flag] = [f"{name}={setting_text(v)}" for name, v in table.items()]
    named = values.get("callbacks", [])
    if not isinstance(named, list) or not all(isinstance(name, str) for name in named):
        raise ConfigError(f"{path}: 'callbacks' expects a list of callback names, got {named!r}")
    modules = values.get("import", [])
    if not isinstance(modules, list) or not all(isinstance(name, str) for name in modules):
        raise ConfigError(
            f"{path}: 'import' expects a list of module names or .py paths, got {modules!r}"
        )
    for key in ("trials", "epochs", "seed", "jobs"):
        if key in values and (not isinstance(values[key], int) or isinstance(values[key], bool)):
            raise ConfigError(f"{path}: {key!r} expects an integer, got {values[key]!r}")
    return {**values, **tables}
