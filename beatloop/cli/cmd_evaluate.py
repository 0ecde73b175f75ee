"""``beatloop evaluate RUN_DIR``: a run's validation figures at its latest checkpoint, on
its own validation data (that of the ``--data`` its ``run.json`` records, else the
recipe's) or on every example of ``--data``."""

from __future__ import annotations

from pathlib import Path

from beatloop.cli.options import add_data_set_option, add_model_option, command_parser

NAME = "evaluate"


def add_command(commands) -> None:
    evaluate = command_parser(
        commands,
        NAME,
        help="a run's validation figures at its latest checkpoint (its recipe's validation "
        "step: every beat's loss and every metric), to 4 significant digits as run prints "
        "them",
    )
    evaluate.add_argument("run_dir", type=Path, help="the run dir to evaluate")
    evaluate.add_argument(
        "--data",
        default=None,
        metavar="KIND:PATH",
        help="evaluate on every example of this source, e.g. csv:new.csv (see `beatloop "
        "data`; default: the run's validation data: that of the --data its run.json "
        "records, read again, else the recipe's built-in validation data)",
    )
    add_data_set_option(evaluate, "a parameter of the --data source (repeatable)")
    add_model_option(evaluate)
    evaluate.add_argument(
        "--best",
        action="store_true",
        help="at the best epoch's checkpoint (kept with run --keep-best) instead of the latest",
    )


def run(args) -> int:
    """Print one line per figure, ``NAME  VALUE`` (4 significant digits, as ``run``
    prints its figures; ``beatloop.evaluate`` returns them exactly), on the ``--data``
    source's every example or the run's validation data."""
    from beatloop.callbacks.standard import format_figure
    from beatloop.cli.recorded import existing_run_dir
    from beatloop.cli.run_parts import model_paths
    from beatloop.restoring import evaluate

    existing_run_dir(args.run_dir, "evaluate")
    models = model_paths(args.model) or None
    figures = evaluate(args.run_dir, _evaluation_data(args), best=args.best, models=models)
    width = max(map(len, figures), default=0)
    for name, value in figures.items():
        print(f"{name:<{width}}  {format_figure(value)}")
    return 0


def _evaluation_data(args):
    """The data set ``evaluate --data`` names, read for the run's recipe and seed (its
    batch size, its source defaults); ``None`` without ``--data``: ``evaluate`` then
    takes the run's own validation data."""
    from beatloop.cli.recorded import recorded_recipe
    from beatloop.core.failures.errors import ConfigError
    from beatloop.named_data.load import load_whole

    if args.data is None:
        if args.data_set:
            raise ConfigError("--data-set needs --data KIND:PATH")
        return None
    record, recipe = recorded_recipe(args.run_dir, "evaluate")
    return load_whole(args.data, args.data_set, recipe=recipe, seed=record.seed, role="evaluation")
