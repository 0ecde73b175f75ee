"""``beatloop compare NAME [--tuned STUDY_DIR] [--set FIELD=VALUE]... ``: recipes (or
configs of one) side by side, each in its own process, in one table; with ``--seeds N``
each figure is a mean over N seeds with a 95% bootstrap interval."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from beatloop.cli.options import add_data_options, add_steps_per_execution, command_parser

NAME = "compare"

#: The options that may also come after the recipe names, with their types.
TRAILING = (("--epochs", int), ("--out", Path), ("--seed", int), ("--seeds", int),
            ("--repeats", int), ("--jobs", int), ("--data", str),
            ("--validation-data", str))  # fmt: skip


def add_command(commands) -> None:
    compare = command_parser(
        commands,
        NAME,
        help="recipes (or configs of one) side by side: speed, memory, losses, quality",
        description="Run each recipe on its default data (or on --data) for the same number "
        "of epochs, "
        "each in its own process, and print one table; write OUT/compare.json and "
        "OUT/loss_curves.png. Example: beatloop compare gan --set n_critic=1 gan --set "
        "n_critic=5 supervised --epochs 3. With --seeds N every figure is a mean over N "
        "seeds with a 95% bootstrap interval; --tuned STUDY_DIR gives an entry the config of "
        "a `beatloop tune` study's best trial. A run that fails ends its entry (its other "
        "runs are not started) but not the others: the table holds the entries that "
        "finished, each failure is one error line after it, and the command exits with "
        "the first failing entry's code (4 for a non-finite loss, ...).",
    )
    compare.add_argument(
        "entries",
        nargs=argparse.REMAINDER,
        metavar="NAME [--tuned STUDY_DIR] [--set FIELD=VALUE]...",
        help="recipes; each --set and --tuned applies to the name before it (--set wins "
        "over the study's config)",
    )
    compare.add_argument("--epochs", type=int, default=2, help="epochs per run")
    compare.add_argument(
        "--out", type=Path, default=None, help="where the table goes (default: runs/compare-TIME)"
    )
    compare.add_argument(
        "--seed", type=int, default=0, help="the seed of every run (the first of --seeds)"
    )
    compare.add_argument(
        "--seeds",
        type=int,
        metavar="N",
        default=1,
        help="runs per entry with the seeds SEED, SEED+1, ...: the table gives means and 95%% "
        "bootstrap intervals, and whether the best quality stands out of the seed noise",
    )
    compare.add_argument(
        "--repeats", type=int, default=1, help="timing runs per entry and seed (medians)"
    )
    compare.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        default=1,
        help="runs at once, each its own process (their speeds then share the machine)",
    )
    add_steps_per_execution(compare)
    add_data_options(compare)


def run(args) -> int:
    from beatloop.cli.failure import report_run_failures
    from beatloop.cli.options import data_option
    from beatloop.compare import ComparisonFailed, compare, parse_entries
    from beatloop.compare_report import format_table
    from beatloop.core.failures.errors import ConfigError
    from beatloop.plugins.registry import get_recipe
    from beatloop.user_modules import import_modules

    tokens, options = _trailing_options(args)
    import_modules(args.imports)  # those given after the entries too (the others: done)
    data_option(args)  # --validation-data or --data-set without --data fails here
    try:
        entries = parse_entries(tokens)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    for entry in entries:
        get_recipe(entry.recipe)  # an unknown name fails before anything runs
    epochs = options.get("epochs", args.epochs)
    if epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {epochs}")
    seeds, jobs = options.get("seeds", args.seeds), options.get("jobs", args.jobs)
    for flag, value in (("--seeds", seeds), ("--jobs", jobs)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    out = options.get("out", args.out) or Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    failed: ComparisonFailed | None = None
    try:
        rows = compare(
            entries,
            epochs=epochs,
            out=out,
            seed=options.get("seed", args.seed),
            seeds=seeds,
            repeats=options.get("repeats", args.repeats),
            jobs=jobs,
            steps_per_execution=args.steps_per_execution,
            data=args.data,
            data_settings=tuple(args.data_set),
            validation_data=args.validation_data,
            imports=args.imports,
        )
    except ComparisonFailed as error:  # the entries that finished, then what failed
        rows, failed = error.rows, error
    if rows:
        print()
        print(format_table(rows))
    print(f"\nfigures: {out / 'compare.json'}")
    if rows:
        print(f"loss curves: {out / 'loss_curves.png'}")
    if failed is None:
        return 0
    sys.stdout.flush()  # the table before the failures, on a terminal showing both
    return report_run_failures(failed.failures)


def _trailing_options(args) -> tuple[list[str], dict]:
    """The recipe entries, and the options given after them (argparse leaves those in
    the entries); ``--data``, ``--validation-data``, ``--data-set`` and ``--import`` go
    into ``args``."""
    from beatloop.core.failures.errors import ConfigError

    tokens, options = list(args.entries), {}
    for flag, kind in TRAILING:
        while flag in tokens:
            at = tokens.index(flag)
            if at + 1 >= len(tokens):
                raise ConfigError(f"{flag} needs a value")
            try:
                options[flag[2:]] = kind(tokens[at + 1])
            except ValueError:
                raise ConfigError(f"{flag} expects a number, got {tokens[at + 1]!r}") from None
            del tokens[at : at + 2]
    for flag, into, what in (("--data-set", args.data_set, "NAME=VALUE"),
                             ("--import", args.imports, "MODULE")):  # fmt: skip
        while flag in tokens:
            at = tokens.index(flag)
            if at + 1 >= len(tokens):
                raise ConfigError(f"{flag} needs {what}")
            into.append(tokens[at + 1])
            del tokens[at : at + 2]
    args.data = options.get("data", args.data)
    args.validation_data = options.get("validation-data", args.validation_data)
    return tokens, options
