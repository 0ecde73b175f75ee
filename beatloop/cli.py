"""The ``beatloop`` command: ``list``, ``show``, ``run``, ``compare``, ``export``,
``evaluate``.

TensorFlow is imported only after the log level is set, with its start-up lines filtered
out (``--verbose`` shows them). Every failure ends in one ``beatloop: error: ...`` line
and a documented exit code (:data:`~beatloop.core.errors.EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from beatloop.core.errors import EXIT_CODES

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
        "list", help="registered recipes and where they come from (-v: modules, plugins, failures)"
    )

    show = command("show", help="a recipe's config fields and beat schedule")
    show.add_argument("recipe", help="a registered recipe name (see `beatloop list`)")
    show.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="override a config field"
    )

    run = command("run", help="train a recipe")
    run.add_argument("recipe", help="a registered recipe name (see `beatloop list`)")
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
        "--steps-per-execution", type=int, default=1, metavar="K", help="steps per compiled call"
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

    compare = command(
        "compare",
        help="recipes (or configs of one) side by side: speed, memory, losses, quality",
        description="Run each recipe on its default data for the same number of epochs, "
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
        "--steps-per-execution", type=int, default=1, metavar="K", help="steps per compiled call"
    )

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``beatloop`` command and return its exit code (see ``EXIT_CODES``)."""
    args = _parser().parse_args(argv)
    from beatloop.terminal import import_tensorflow_quietly, one_line_warnings

    commands = {"list": _list, "show": _show, "run": _run, "export": _export, "compare": _compare}
    commands["evaluate"] = _evaluate
    try:
        if args.verbose:
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
    from beatloop.plugins.registry import registry

    reg = registry()
    entries = [reg.recipes[name] for name in reg.recipe_names()]
    width = max((len(e.name) for e in entries), default=4)
    for entry in entries:
        print(f"{entry.name:<{width}}  {entry.cls.description()}  [{entry.origin}]")
        if args.verbose:
            print(f"{'':<{width}}    module: {entry.cls.__module__}  plugin: {entry.plugin}")
    if args.verbose:
        for name in sorted(reg.callbacks):
            entry = reg.callbacks[name]
            print(
                f"callback {name}: {entry.cls.__module__}.{entry.cls.__qualname__} [{entry.origin}]"
            )
        for failure in reg.failures:
            print(f"failed plugin {failure.plugin} [{failure.origin}]: {failure.error}")
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
    _show_variables(recipe, schedule)
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
    from beatloop.core.config import parse_settings
    from beatloop.fitting import fit
    from beatloop.plugins.registry import get_recipe, registry

    cls = get_recipe(args.recipe)
    overrides = parse_settings(args.set, cls.Config, f"recipe {cls.name!r}")
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
    )
    final = {name: values[-1] for name, values in result.history.items()}
    print(
        f"{cls.name}: {result.epochs} epoch(s), {result.steps} steps, seed {result.seed}; "
        + "  ".join(f"{k} {v:.4g}" for k, v in final.items())
    )
    print(f"run dir: {run_dir}")
    if result.checkpoint:
        print(f"checkpoint: {result.checkpoint}")
    for name, path in result.artifacts.items():
        print(f"{name}: {path}")
    return 0


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
    for flag, kind in (("--epochs", int), ("--out", Path), ("--seed", int), ("--repeats", int)):
        while flag in tokens:
            at = tokens.index(flag)
            if at + 1 >= len(tokens):
                raise ConfigError(f"{flag} needs a value")
            options[flag[2:]] = kind(tokens[at + 1])
            del tokens[at : at + 2]
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


def _evaluate(args, data=None) -> int:
    """Print one line per figure, ``NAME  VALUE`` (the value as Python writes the float:
    exact). ``data``: the data set to evaluate on (``None``: the recipe's validation
    data); where a ``--data`` option plugs in."""
    from beatloop.fitting import evaluate

    figures = evaluate(args.run_dir, data)
    width = max(map(len, figures), default=0)
    for name, value in figures.items():
        print(f"{name:<{width}}  {value!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
