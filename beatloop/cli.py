"""The ``beatloop`` command: ``list``, ``show``, ``run``, ``compare``, ``export``,
``evaluate``, ``data``.

TensorFlow is imported only after the log level is set, with its start-up lines filtered
out (``--verbose`` shows them). Every failure ends in one ``beatloop: error: ...`` line
and a documented exit code (``EXIT_CODES``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path

from beatloop.core.errors import EXIT_CODES
from beatloop.core.pacing import steps_per_execution

REPORT = "https://github.com/beatloop/beatloop/issues"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Help that shows every option's default and keeps the exit code table's lines. An
    option whose default is nothing (``None``: its help says what that means; an off
    flag; an empty list) shows no ``(default: ...)``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, []) or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action)


def _exit_codes() -> str:
    lines = [f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items()]
    return "exit codes:\n" + "\n".join(lines)


class _DataHelp(argparse.Action):
    """``beatloop data --help``: the command's help, then every data source kind and its
    parameters (read from the registry only when asked: plugins load, TensorFlow too)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from beatloop.terminal import import_tensorflow_quietly

        import_tensorflow_quietly()
        print(parser.format_help())
        print("data source kinds (--data KIND:PATH --data-set NAME=VALUE):")
        for lines in _source_descriptions(None):
            print("\n".join(f"  {line}" for line in lines))
        parser.exit()


def _add_data_options(parser: argparse.ArgumentParser) -> None:
    """``--data``, ``--validation-data`` and ``--data-set``: data named on the command line
    (see ``beatloop data``) in place of the recipe's built-in data."""
    parser.add_argument(
        "--data",
        default=None,
        metavar="KIND:PATH",
        help="the training data, e.g. folder:images/, csv:table.csv, npz:arrays.npz (see "
        "`beatloop data`; default: the recipe's built-in data)",
    )
    parser.add_argument(
        "--validation-data",
        default=None,
        metavar="KIND:PATH",
        help="validate on this data, read with the same --data-set parameters (default: "
        "what --data holds out with validation_fraction, none by default)",
    )
    parser.add_argument(
        "--data-set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a parameter of the --data source (repeatable), e.g. image_size=28,28 or "
        "label=target; see `beatloop data KIND`",
    )


def _data_option(args):
    """The ``data=`` that ``--data`` asks for: ``None`` (the recipe's built-in data), or
    a function ``(recipe, seed) -> DataSplit`` for ``fit`` to call."""
    from beatloop.core.errors import ConfigError

    if args.data is None:
        if args.validation_data is not None or args.data_set:
            given = "--validation-data" if args.validation_data is not None else "--data-set"
            raise ConfigError(f"{given} needs --data KIND:PATH")
        return None
    from beatloop.sources import NamedData

    return NamedData(args.data, tuple(args.data_set), args.validation_data)


def _source_descriptions(kind: str | None) -> list[list[str]]:
    from beatloop.plugins.registry import registry
    from beatloop.sources import describe_source

    reg = registry()
    names = reg.source_names() if kind is None else [reg.source(kind).name]
    described = []
    for name in names:
        entry = reg.sources[name]
        lines = describe_source(entry.cls)
        lines[0] += "" if entry.origin == "built-in" else f"  [{entry.origin}]"
        described.append(lines)
    return described


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="beatloop",
        description="Run TensorFlow training recipes by name.",
        epilog=_exit_codes(),
        formatter_class=_HelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also TensorFlow's own log lines, and the traceback of an error",
    )

    def command(name: str, **kwargs) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, parents=[common], formatter_class=_HelpFormatter, epilog=_exit_codes(), **kwargs
        )

    command(
        "list",
        help="registered recipes and where they come from (-v: modules, plugins, callbacks, "
        "data sources, failures); read from a cache while nothing installed has changed",
    ).add_argument(
        "--refresh",
        action="store_true",
        help="load every plugin and rewrite the cache, even if nothing seems to have changed",
    )

    show = command("show", help="a recipe's config fields and beat schedule")
    show.add_argument("recipe", help="a registered recipe name (see `beatloop list`)")
    show.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="override a config field"
    )

    run = command("run", help="train a recipe")
    run.add_argument(
        "recipe",
        nargs="?",
        default=None,
        help="a registered recipe name (see `beatloop list`); may come from --config",
    )
    run.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="a TOML run file (recipe, epochs, seed, [config], callbacks, options), or a "
        "run dir's run.json to run that run again; flags given here override it "
        "(default: flags only)",
    )
    run.add_argument("--epochs", type=int, default=1, help="epochs in all (a resume included)")
    run.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed Python, NumPy and TensorFlow (default: a random seed, or the checkpoint's)",
    )
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field (repeatable); see `beatloop show RECIPE`",
    )
    run.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where logs and checkpoints go (default: runs/RECIPE-TIME); a run dir that "
        "holds checkpoints is resumed",
    )
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="N",
        help="also checkpoint every N steps (default: at each epoch's end only)",
    )
    run.add_argument("--max-to-keep", type=int, default=3, metavar="N", help="checkpoints kept")
    run.add_argument(
        "--on-nan",
        choices=("raise", "rollback"),
        default="raise",
        help="on a non-finite (or diverging) loss or gradient: stop, or restore the last "
        "checkpoint and skip the batch",
    )
    run.add_argument(
        "--max-rollbacks", type=int, default=3, metavar="N", help="rollbacks before stopping"
    )
    run.add_argument(
        "--divergence",
        type=float,
        default=None,
        metavar="FACTOR",
        help="also treat a beat's loss above FACTOR times its running median as a fault "
        "(default: off)",
    )
    run.add_argument(
        "--divergence-window",
        type=int,
        default=100,
        metavar="N",
        help="steps in the running median --divergence compares with",
    )
    run.add_argument(
        "--steps-per-execution",
        type=steps_per_execution,
        default="auto",
        metavar="K",
        help="steps per compiled call, or auto: timed and grown while it saves time",
    )
    run.add_argument(
        "--callback",
        action="append",
        default=[],
        metavar="NAME",
        help="a registered callback (repeatable)",
    )
    run.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a model from a .keras file in place of the recipe's NAME (repeatable); "
        "required for the supplied models `beatloop show RECIPE` lists as required",
    )
    run.add_argument("--debug", action="store_true", help="run eagerly and check numerics")
    run.add_argument("--jit-compile", action="store_true", help="compile the steps with XLA")
    run.add_argument(
        "--precision",
        choices=("float32", "mixed_float16", "mixed_bfloat16"),
        default="float32",
        help="the models' compute precision",
    )
    run.add_argument(
        "--strategy",
        choices=("none", "mirrored", "multi_worker"),
        default="none",
        help="mirrored: every local device; multi_worker: the cluster in TF_CONFIG",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar and no per-epoch lines")
    _add_data_options(run)

    compare = command(
        "compare",
        help="recipes (or configs of one) side by side: speed, memory, losses, quality",
        description="Run each recipe on its default data (or on --data) for the same number "
        "of epochs, "
        "each in its own process, and print one table; write OUT/compare.json and "
        "OUT/loss_curves.png. Example: beatloop compare gan --set n_critic=1 gan --set "
        "n_critic=5 supervised --epochs 3",
    )
    compare.add_argument(
        "entries",
        nargs=argparse.REMAINDER,
        metavar="NAME [--set FIELD=VALUE]...",
        help="recipes; each --set applies to the name before it",
    )
    compare.add_argument("--epochs", type=int, default=2, help="epochs per run")
    compare.add_argument(
        "--out", type=Path, default=None, help="where the table goes (default: runs/compare-TIME)"
    )
    compare.add_argument("--seed", type=int, default=0, help="the seed of every run")
    compare.add_argument("--repeats", type=int, default=1, help="runs per entry (medians)")
    compare.add_argument(
        "--steps-per-execution",
        type=steps_per_execution,
        default="auto",
        metavar="K",
        help="steps per compiled call, or auto: timed and grown while it saves time",
    )

    _add_data_options(compare)

    sources = command(
        "data",
        add_help=False,
        help="the data source kinds --data can name, and their parameters",
        description="List the data source kinds (--data KIND:PATH) and each one's "
        "parameters (--data-set NAME=VALUE), with type and default. Example: beatloop run "
        "gan --data folder:images/ --data-set image_size=28,28 --data-set color_mode=grayscale",
    )
    sources.add_argument("-h", "--help", action=_DataHelp, help="show this help and every kind")
    sources.add_argument("kind", nargs="?", default=None, help="one kind (default: every kind)")

    export = command(
        "export", help="write a run's inference models (from its latest checkpoint) as SavedModels"
    )
    export.add_argument("run_dir", type=Path, help="the run dir to export")
    export.add_argument("out", type=Path, help="the folder the SavedModels go to")

    evaluate = command(
        "evaluate",
        help="a run's validation figures at its latest checkpoint (its recipe's validation "
        "step: every beat's loss and every metric)",
    )
    evaluate.add_argument("run_dir", type=Path, help="the run dir to evaluate")
    evaluate.add_argument(
        "--data",
        default=None,
        metavar="KIND:PATH",
        help="evaluate on every example of this source, e.g. csv:new.csv (see `beatloop "
        "data`; default: the recipe's validation data)",
    )
    evaluate.add_argument(
        "--data-set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a parameter of the --data source (repeatable)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``beatloop`` command and return its exit code (see ``EXIT_CODES``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    from beatloop.terminal import import_tensorflow_quietly, one_line_warnings

    commands = {
        "list": _list,
        "show": _show,
        "run": _run,
        "export": _export,
        "compare": _compare,
        "data": _data,
        "evaluate": _evaluate,
    }
    try:
        if args.verbose:
            from beatloop.core import grappler_lines

            with grappler_lines.shown():
                return commands[args.command](args)
        if args.command == "list":  # list imports TensorFlow on a cache miss only
            return commands[args.command](args)
        import_tensorflow_quietly()
        with one_line_warnings():
            return commands[args.command](args)
    except BaseException as error:  # every way out gets its line and its exit code
        return _failure(error, args.verbose)


def _failure(error: BaseException, verbose: bool) -> int:
    """Report what ended the command on standard error; return its exit code."""
    from beatloop.core.errors import BeatloopError, RunInterrupted

    if isinstance(error, SystemExit):
        raise error
    if isinstance(error, BrokenPipeError):  # the reader went away (`beatloop list | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if verbose:
        traceback.print_exception(error, file=sys.stderr)
    if isinstance(error, RunInterrupted):
        print(f"beatloop: {error}", file=sys.stderr)
        if error.checkpoint:
            print(
                "beatloop: resume with the same command and --run-dir "
                f"{Path(error.checkpoint).parent.parent}",
                file=sys.stderr,
            )
        return 130
    if isinstance(error, KeyboardInterrupt):
        print("beatloop: interrupted", file=sys.stderr)
        return 130
    if isinstance(error, BeatloopError):
        print(f"beatloop: error: {error}", file=sys.stderr)
        return error.exit_code
    if not verbose:
        traceback.print_exception(error, file=sys.stderr)
    print(
        f"beatloop: internal error: {type(error).__name__}: {error}\n"
        "beatloop: this is a bug in beatloop (or a library it uses), not in your input; "
        f"please report it with the command and the traceback above: {REPORT}",
        file=sys.stderr,
    )
    return 1


def _list(args) -> int:
    """Print the registered recipes (``-v``: and more) from the cache when its key still
    holds; otherwise load the plugins (TensorFlow too) and rewrite the cache. A registry
    this process has already filled is listed as it is (it may hold registrations of
    its own), and neither read from nor written to the cache."""
    import contextlib

    from beatloop import listing
    from beatloop.terminal import import_tensorflow_quietly, one_line_warnings, warning_line

    module = sys.modules.get("beatloop.plugins.registry")
    loaded = module.loaded_registry() if module is not None else None
    if loaded is not None:
        found = listing.Listing.of(loaded)
    else:
        key = listing.cache_key()
        found = None if args.refresh or key is None else listing.read_cache(key)
        if found is None:
            if not args.verbose:
                import_tensorflow_quietly()
            with contextlib.nullcontext() if args.verbose else one_line_warnings():
                from beatloop.plugins.registry import registry

                found = listing.Listing.of(registry())
            problem = "its key could not be read"
            if key is not None:
                problem = listing.write_cache(key, found)
            if problem is not None and args.verbose:
                print(f"beatloop: note: the list cache was not written: {problem}", file=sys.stderr)
        else:  # the warnings loading the plugins gave, as they gave them
            for failure in found.failures:
                if args.verbose:
                    warnings.warn(failure.message, RuntimeWarning, stacklevel=1)
                else:
                    print(warning_line(failure.message), file=sys.stderr)
    for line in found.lines(args.verbose):
        print(line)
    return 0


def _show(args) -> int:
    import attrs

    from beatloop.core.config import config_fields, parse_settings, type_name
    from beatloop.fitting import make_recipe
    from beatloop.plugins.registry import get_recipe

    cls = get_recipe(args.recipe)
    recipe = make_recipe(cls, parse_settings(args.set, cls.Config, f"recipe {cls.name!r}"))
    print(f"{cls.name}: {cls.description()}")
    print("\nconfig:")
    for field in config_fields(cls.Config):
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        value = getattr(recipe.config, field.name)
        print(f"  {field.name}: {type_name(field.type)} = {value!r}  (default {default!r})")
    schedule = recipe.schedule()
    print("\nschedule (one step):")
    for line in schedule.describe().splitlines():
        print(f"  {line}")
    if cls.supplied_models:
        print("\nsupplied models (models={NAME: model or .keras path}, --model NAME=PATH.keras):")
        for name, supplied in cls.supplied_models.items():
            print(f"  {name}: {supplied.describe()}")
    _show_data(recipe)
    _show_variables(recipe, schedule)
    return 0


def _show_data(recipe) -> None:
    """The batches the recipe takes, and the data source parameters it sets."""
    from beatloop.core.recipe import defines

    keys = ", ".join(
        f"{key} (at least {rank} dimension(s), batch first)"
        for key, rank in dict(recipe.batch_keys).items()
    )
    print("\ndata (--data KIND:PATH, see `beatloop data`):")
    print(f"  batch keys: {keys or '(any)'}")
    if recipe.source_defaults:
        settings = ", ".join(f"{k}={v}" for k, v in recipe.source_defaults.items())
        print(f"  source parameters it sets (unless --data-set sets them): {settings}")
    if defines(recipe, "default_data"):
        print("  without --data: its built-in data")
    else:
        print("  without --data: none (it has no built-in data)")


def _data(args) -> int:
    for index, lines in enumerate(_source_descriptions(args.kind)):
        print(("\n" if index else "") + "\n".join(lines))
    return 0


def _show_variables(recipe, schedule) -> None:
    """The variables each beat updates in the recipe's default models, or why they
    cannot be shown (no built-in data, no models built, a required model not built)."""
    from beatloop.core.binding import bind
    from beatloop.core.recipe import defines

    title = "\nvariables each beat updates (default models):"
    lacking = []
    if not defines(recipe, "default_data"):
        lacking.append("it has no built-in data (no default_data): a run passes data=...")
    if not defines(recipe, "build_models"):
        names = ", ".join(recipe.model_names())
        lacking.append(f"it builds no models (no build_models): a run passes models= with {names}")
    if not lacking:
        spec = recipe.default_data(0).train.element_spec
        models = recipe.build_models(spec)
        absent = [name for name in recipe.supplied_models if name not in models]
        if absent:
            them = "them" if len(absent) > 1 else "it"
            lacking.append(
                f"it builds no {', '.join(absent)}: a run supplies {them} (models= or --model)"
            )
    if lacking:
        print(f"{title} not shown:")
        for line in lacking:
            print(f"  {line}")
        return
    supplied = frozenset(recipe.supplied_models)
    optimizers, losses = recipe.build_optimizers(), recipe.losses()
    bound = bind(
        schedule, models, optimizers, losses, supplied=supplied, forwards=recipe.forwards()
    )
    print(title)
    for line in bound.describe_variables().splitlines():
        print(f"  {line}")


def _run(args) -> int:
    from beatloop.core.config import make_config, parse_settings
    from beatloop.fitting import fit
    from beatloop.plugins.registry import get_recipe, registry

    args, file_config = _with_run_file(args)
    cls = get_recipe(args.recipe)
    owner = f"recipe {cls.name!r}"
    overrides = {**file_config, **parse_settings(args.set, cls.Config, owner)}
    make_config(cls.Config, overrides, owner)  # a bad field fails here, before anything runs
    callbacks = [registry().callback(name).cls() for name in args.callback]
    callbacks.append(_resume_notice())
    strategy = _strategy(args.strategy)
    models = _model_paths(args.model)
    run_dir = args.run_dir or Path("runs") / f"{cls.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = fit(
        cls,
        config=overrides,
        models=models or None,
        epochs=args.epochs,
        seed=args.seed,
        steps_per_execution=args.steps_per_execution,
        callbacks=callbacks,
        debug=args.debug,
        run_dir=run_dir,
        progress=not args.quiet,
        checkpoint_every=args.checkpoint_every,
        max_to_keep=args.max_to_keep,
        on_nan=args.on_nan,
        max_rollbacks=args.max_rollbacks,
        divergence=args.divergence,
        divergence_window=args.divergence_window,
        jit_compile=args.jit_compile,
        precision=args.precision,
        strategy=strategy,
        data=_data_option(args),
    )
    final = {name: values[-1] for name, values in result.history.items()}
    print(
        f"{cls.name}: {result.epochs} epoch(s), {result.steps} steps, seed {result.seed}; "
        + "  ".join(f"{k} {v:.4g}" for k, v in final.items())
    )
    if args.steps_per_execution == "auto":
        how = "chosen by" if result.engine.pace.settled else "still being timed by"
        print(f"steps per call: {result.steps_per_execution} ({how} --steps-per-execution auto)")
    print(f"run dir: {run_dir}")
    if result.checkpoint:
        print(f"checkpoint: {result.checkpoint}")
    for name, path in result.artifacts.items():
        print(f"{name}: {path}")
    return 0


def _with_run_file(args) -> tuple[argparse.Namespace, dict]:
    """The run's options: the flags given, over the run file's values (``--config``),
    over the flags' defaults; and the run file's config fields (``--set`` overrides
    them). Without ``--config``: the flags, and no fields."""
    from beatloop.core.errors import ConfigError
    from beatloop.run_file import read_run_file

    merged, fields = vars(args).copy(), {}
    if args.config is not None:
        run = _subcommand(_parser(), "run")
        run_file = read_run_file(args.config, {a.dest: a for a in run._actions})
        given = _given_options(args.argv)
        merged.update({k: v for k, v in run_file.options.items() if k not in given})
        merged["recipe"] = args.recipe or run_file.recipe
        fields = run_file.config
    if merged["recipe"] is None:
        raise ConfigError(
            "run needs a recipe: name it (beatloop run RECIPE) or give `recipe = ...` in "
            "--config FILE"
        )
    return argparse.Namespace(**merged), fields


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[name]


def _given_options(argv: Sequence[str]) -> set[str]:
    """The option names given on the command line (not taken from their defaults)."""
    parser = _parser()
    for sub in [parser, _subcommand(parser, "run")]:
        for action in sub._actions:
            action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv))) - {"command"}


def _model_paths(values: Sequence[str]) -> dict[str, str]:
    """``--model NAME=PATH`` options as ``{NAME: PATH}`` (each name once)."""
    from beatloop.core.errors import ConfigError

    paths: dict[str, str] = {}
    for value in values:
        name, equals, path = value.partition("=")
        name, path = name.strip(), path.strip()
        if not (equals and name.isidentifier() and path):
            raise ConfigError(
                f"--model expects NAME=PATH.keras (e.g. --model teacher=teacher.keras), "
                f"got {value!r}"
            )
        if name in paths:
            raise ConfigError(f"--model {name}=... is given twice")
        paths[name] = path
    return paths


def _resume_notice():
    """A callback that says, before training, which checkpoint a run resumes from."""
    from beatloop.core.callbacks import Callback

    class ResumeNotice(Callback):
        def on_fit_start(self, run) -> None:
            if run.resumed_from:
                print(
                    f"resumed from {Path(run.resumed_from).name} (epoch {run.epoch}, "
                    f"step {run.step}): {run.resumed_from}",
                    flush=True,
                )

    return ResumeNotice()


def _strategy(name: str):
    """The tf.distribute strategy named on the command line (``None`` for one device);
    ``multi_worker`` needs a cluster in ``TF_CONFIG``."""
    if name == "none":
        return None
    import tensorflow as tf

    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    _check_tf_config(os.environ.get("TF_CONFIG"))
    return tf.distribute.MultiWorkerMirroredStrategy()


def _check_tf_config(text: str | None) -> None:
    """Refuse ``--strategy multi_worker`` without a usable ``TF_CONFIG``: it would train
    one worker alone, silently."""
    import json

    from beatloop.core.errors import ConfigError

    example = (
        'e.g. TF_CONFIG=\'{"cluster": {"worker": ["hostA:12345", "hostB:12345"]}, '
        '"task": {"type": "worker", "index": 0}}\''
    )
    if not text:
        raise ConfigError(
            "--strategy multi_worker needs the environment variable TF_CONFIG naming the "
            f"cluster's workers and this one's index ({example}); it is not set"
        )
    try:
        config = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({error}); {example}") from None
    workers = config.get("cluster", {}).get("worker") if isinstance(config, dict) else None
    task = config.get("task", {}) if isinstance(config, dict) else {}
    if not workers or "index" not in task:
        raise ConfigError(
            "TF_CONFIG must name the cluster's workers (cluster.worker) and this worker's "
            f"task.index; found {text!r}; {example}"
        )


def _compare(args) -> int:
    from beatloop.compare import compare, format_table, parse_entries
    from beatloop.core.errors import ConfigError

    # Options may also come after the recipe names (argparse leaves them in the list).
    tokens, options = list(args.entries), {}
    flags = (("--epochs", int), ("--out", Path), ("--seed", int), ("--repeats", int))
    flags += (("--data", str), ("--validation-data", str))
    for flag, kind in flags:
        while flag in tokens:
            at = tokens.index(flag)
            if at + 1 >= len(tokens):
                raise ConfigError(f"{flag} needs a value")
            options[flag[2:]] = kind(tokens[at + 1])
            del tokens[at : at + 2]
    while "--data-set" in tokens:
        at = tokens.index("--data-set")
        if at + 1 >= len(tokens):
            raise ConfigError("--data-set needs NAME=VALUE")
        args.data_set.append(tokens[at + 1])
        del tokens[at : at + 2]
    args.data = options.get("data", args.data)
    args.validation_data = options.get("validation-data", args.validation_data)
    _data_option(args)  # --validation-data or --data-set without --data fails here
    try:
        entries = parse_entries(tokens)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    from beatloop.plugins.registry import get_recipe

    for entry in entries:
        get_recipe(entry.recipe)  # an unknown name fails before anything runs
    epochs = options.get("epochs", args.epochs)
    if epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {epochs}")
    out = options.get("out", args.out) or Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    rows = compare(
        entries,
        epochs=epochs,
        out=out,
        seed=options.get("seed", args.seed),
        repeats=options.get("repeats", args.repeats),
        steps_per_execution=args.steps_per_execution,
        data=args.data,
        data_settings=tuple(args.data_set),
        validation_data=args.validation_data,
    )
    print()
    print(format_table(rows))
    print(f"\nfigures: {out / 'compare.json'}\nloss curves: {out / 'loss_curves.png'}")
    return 0


def _export(args) -> int:
    from beatloop.fitting import restore

    result = restore(args.run_dir)
    print(f"{result.recipe.name}: restored {result.checkpoint} (step {result.steps})")
    for name, path in result.export(args.out).items():
        print(f"{name}: {path}")
    return 0


def _evaluate(args) -> int:
    """Print one line per figure, ``NAME  VALUE`` (the value as Python writes the float:
    exact), on the ``--data`` source's every example or the recipe's validation data."""
    from beatloop.fitting import evaluate

    figures = evaluate(args.run_dir, _evaluation_data(args))
    width = max(map(len, figures), default=0)
    for name, value in figures.items():
        print(f"{name:<{width}}  {value!r}")
    return 0


def _evaluation_data(args):
    """The data set ``evaluate --data`` names, read for the run's recipe and seed (its
    batch size, its source defaults); ``None`` without ``--data``."""
    from beatloop.core.checkpoints import latest_record
    from beatloop.core.errors import CheckpointError, ConfigError
    from beatloop.fitting import config_overrides, make_recipe
    from beatloop.plugins.registry import get_recipe
    from beatloop.sources import load_whole

    if args.data is None:
        if args.data_set:
            raise ConfigError("--data-set needs --data KIND:PATH")
        return None
    record = latest_record(args.run_dir)
    if record is None:
        raise CheckpointError(f"{args.run_dir} holds no readable checkpoint to evaluate")
    cls = get_recipe(record.recipe)
    recipe = make_recipe(cls, config_overrides(cls, record.config))
    return load_whole(args.data, args.data_set, recipe=recipe, seed=record.seed, role="evaluation")


if __name__ == "__main__":
    sys.exit(main())
