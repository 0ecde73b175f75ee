"""``beatloop run RECIPE``: train a recipe, from flags or a run file (``--config``), and
print its final figures and where it wrote."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from beatloop.cli.options import (
    add_common_options,
    add_data_options,
    add_set_option,
    add_steps_per_execution,
    command_parser,
    data_option,
)
from beatloop.cli.workers import workers_count

NAME = "run"


def add_command(commands) -> None:
    add_arguments(command_parser(commands, NAME, help="train a recipe"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option of ``run``, in the order its help lists them."""
    _add_what_runs(parser)
    _add_checkpoints_and_faults(parser)
    _add_how_it_runs(parser)
    add_data_options(parser)


def _add_what_runs(run: argparse.ArgumentParser) -> None:
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
        help="a TOML run file (recipe, epochs, seed, [config], callbacks, import, options), "
        "or a run dir's run.json to run that run again; flags given here override it "
        "(default: flags only)",
    )
    run.add_argument("--epochs", type=int, default=1, help="epochs in all (a resume included)")
    run.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed Python, NumPy and TensorFlow (default: a random seed, or the checkpoint's)",
    )
    _add_op_determinism(run)
    add_set_option(run, "override a config field (repeatable); see `beatloop show RECIPE`")
    run.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where logs and checkpoints go (default: runs/RECIPE-TIME); a run dir that "
        "holds checkpoints is resumed",
    )


def _add_op_determinism(run: argparse.ArgumentParser) -> None:
    """``--op-determinism`` / ``--no-op-determinism``: TensorFlow's op determinism."""
    run.add_argument(
        "--op-determinism",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="TensorFlow's op determinism for the run: deterministic kernels and input "
        "pipelines, slower (default: the checkpoint's on a resume, else on with --seed)",
    )


def _add_gradient_check(run: argparse.ArgumentParser) -> None:
    """``--no-gradient-check``: the NaN guard on the losses only."""
    run.add_argument(
        "--no-gradient-check",
        dest="check_gradients",
        action="store_false",
        help="the NaN guard checks the losses only, not every gradient each step: a little "
        "faster; a non-finite gradient is found at the first loss it spoils (default: losses "
        "and gradients checked)",
    )


def _add_checkpoints_and_faults(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="N",
        help="also checkpoint every N steps (default: at each epoch's end only)",
    )
    run.add_argument("--max-to-keep", type=int, default=3, metavar="N", help="checkpoints kept")
    run.add_argument(
        "--keep-best",
        default=None,
        metavar="FIGURE:MODE",
        help="also keep the checkpoint of the best epoch by FIGURE (FIGURE:min or FIGURE:max, "
        "e.g. val_loss:min; FIGURE alone: min; quality: the recipe's quality figure) beside "
        "the --max-to-keep newest; run.json names it (default: off; on a resume, the run's)",
    )
    run.add_argument(
        "--profile",
        default=None,
        metavar="START:STOP",
        help="record a TensorFlow profiler trace of training steps START to STOP-1 (counted "
        "from 0 over the run) into RUN_DIR/tensorboard, for TensorBoard's profile tab "
        "(default: none)",
    )
    run.add_argument(
        "--on-nan",
        choices=("raise", "rollback"),
        default="raise",
        help="on a non-finite (or diverging) loss or gradient: stop, or restore the last "
        "checkpoint and skip the batch",
    )
    _add_gradient_check(run)
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
        "--accept-changed-data",
        action="store_true",
        help="resume even though the --data files changed since run.json recorded them "
        "(run.json records the change; default: such a resume is refused)",
    )
    run.add_argument(
        "--divergence-window",
        type=int,
        default=100,
        metavar="N",
        help="steps in the running median --divergence compares with",
    )


def _add_how_it_runs(run: argparse.ArgumentParser) -> None:
    add_steps_per_execution(run)
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
    run.add_argument(
        "--workers",
        type=workers_count,
        default=1,
        metavar="N",
        help="start N local worker processes of one multi_worker run on 127.0.0.1, all "
        "with this --run-dir (1: a plain run)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar and no per-epoch lines")


def without_tensorflow(args) -> bool:
    """``--workers N`` (N > 1) only starts the workers: it needs no TensorFlow."""
    return args.workers > 1


def run(args) -> int:
    if args.workers > 1:
        from beatloop.cli.workers import launch

        return launch(args, _recipe_name(args))
    from beatloop.cli.run_parts import model_paths, resume_notice, strategy
    from beatloop.core.schedule.config import make_config, parse_settings
    from beatloop.fitting import fit
    from beatloop.plugins.registry import registry
    from beatloop.user_modules import registered_recipe

    args, file_config, recorded_module = _with_run_file(args)
    chosen = strategy(args.strategy)  # before the recipe's own code runs any op
    cls = registered_recipe(args.recipe, recorded_module)
    owner = f"recipe {cls.name!r}"
    overrides = {**file_config, **parse_settings(args.set, cls.Config, owner)}
    make_config(cls.Config, overrides, owner)  # a bad field fails here, before anything runs
    callbacks = [registry().callback(name).cls() for name in args.callback]
    callbacks.append(resume_notice())
    run_dir = args.run_dir or Path("runs") / f"{cls.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = fit(
        cls, config=overrides, models=model_paths(args.model) or None, epochs=args.epochs,
        seed=args.seed, op_determinism=args.op_determinism,
        steps_per_execution=args.steps_per_execution, callbacks=callbacks,
        debug=args.debug, run_dir=run_dir, progress=not args.quiet,
        checkpoint_every=args.checkpoint_every, max_to_keep=args.max_to_keep,
        on_nan=args.on_nan, check_gradients=args.check_gradients,
        max_rollbacks=args.max_rollbacks, divergence=args.divergence,
        divergence_window=args.divergence_window, jit_compile=args.jit_compile,
        precision=args.precision, strategy=chosen, data=data_option(args),
        accept_changed_data=args.accept_changed_data, profile=args.profile,
        keep_best=args.keep_best,
    )  # fmt: skip
    _print_result(args, cls.name, result, run_dir)
    return 0


def _print_result(args, name: str, result, run_dir: Path) -> None:
    """The run's last epoch's figures (one epoch's: a recipe in phases logs other
    figures in each), the K it ran with, and where it wrote."""
    from beatloop.callbacks.standard import format_logs

    final = result.last_epoch or {figure: values[-1] for figure, values in result.history.items()}
    print(
        f"{name}: {result.epochs} epoch(s), {result.steps} steps, seed {result.seed}; "
        + format_logs(final)
    )
    if args.steps_per_execution == "auto":
        how = "chosen by" if result.engine.pace.settled else "still being timed by"
        print(f"steps per call: {result.steps_per_execution} ({how} --steps-per-execution auto)")
    print(f"run dir: {run_dir}")
    if result.checkpoint:
        print(f"checkpoint: {result.checkpoint}")
    for artifact, path in result.artifacts.items():
        print(f"{artifact}: {path}")


def _with_run_file(args) -> tuple[argparse.Namespace, dict, str | None]:
    """The run's options: the flags given, over the run file's values (``--config``),
    over the flags' defaults; the run file's config fields (``--set`` overrides them);
    and, for a recorded ``run.json`` of the recipe run, the module it records the recipe
    came from (named, never imported, when the recipe is not registered). The modules the
    file's ``import = [...]`` names are imported first (``--import``'s already are).
    Without ``--config``: the flags, no fields, no module."""
    from beatloop.core.failures.errors import ConfigError
    from beatloop.run_file import read_run_file
    from beatloop.user_modules import import_modules

    merged, fields, recorded = vars(args).copy(), {}, None
    if args.config is not None:
        run_file = read_run_file(args.config, _run_file_options())
        import_modules(run_file.imports, f"{args.config}: import")
        run_file.refuse_other_recipe(args.recipe, lambda: _field_names(args.recipe))
        given = _given_options(args.argv)
        merged.update({k: v for k, v in run_file.options.items() if k not in given})
        merged["imports"] = [*run_file.imports, *args.imports]
        merged["recipe"] = args.recipe or run_file.recipe
        fields = run_file.config
        if run_file.recorded and merged["recipe"] == run_file.recipe:
            recorded = run_file.recipe_module
    if merged["recipe"] is None:
        raise ConfigError(
            "run needs a recipe: name it (beatloop run RECIPE) or give `recipe = ...` in "
            "--config FILE"
        )
    return argparse.Namespace(**merged), fields, recorded


def _recipe_name(args) -> str | None:
    """The recipe named on the command line, else the run file's (``--config``)."""
    from beatloop.run_file import read_run_file

    if args.recipe is not None or args.config is None:
        return args.recipe
    return read_run_file(args.config, _run_file_options()).recipe


def _run_file_options() -> dict[str, argparse.Action]:
    """The options a run file may set: ``run``'s, but ``--workers`` (a launcher's, given
    on the command line only: a run file read by each worker cannot start workers)."""
    return {a.dest: a for a in _run_parser()._actions if a.dest != "workers"}


def _field_names(recipe: str) -> list[str]:
    """The config field names of the registered recipe ``recipe``."""
    from beatloop.core.schedule.config import config_fields
    from beatloop.plugins.registry import get_recipe

    return [field.name for field in config_fields(get_recipe(recipe).Config)]


def _run_parser() -> argparse.ArgumentParser:
    """The ``run`` command's options alone: what a run file's keys are checked against."""
    parser = argparse.ArgumentParser(prog="beatloop run")
    add_common_options(parser)
    add_arguments(parser)
    return parser


def _given_options(argv: Sequence[str]) -> set[str]:
    """The option names given on the command line (``beatloop run ...``: not taken from
    their defaults)."""
    parser = _run_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv[1:])))
