"""``beatloop export RUN_DIR OUT``: a run's inference models, from its latest checkpoint,
as SavedModels in ``OUT``; the run is rebuilt on the data it trained on."""

from __future__ import annotations

from pathlib import Path

from beatloop.cli.options import add_data_set_option, add_model_option, command_parser

NAME = "export"


def add_command(commands) -> None:
    export = command_parser(
        commands,
        NAME,
        help="write a run's inference models (from its latest checkpoint) as SavedModels",
    )
    export.add_argument("run_dir", type=Path, help="the run dir to export")
    export.add_argument("out", type=Path, help="the folder the SavedModels go to")
    export.add_argument(
        "--data",
        default=None,
        metavar="KIND:PATH",
        help="the data the run trained on, to rebuild its models for (default: the --data "
        "its run.json records, else the recipe's built-in data); only its batches' shapes "
        "matter",
    )
    add_data_set_option(export, "a parameter of the --data source (repeatable)")
    add_model_option(export)
    export.add_argument(
        "--best",
        action="store_true",
        help="from the best epoch's checkpoint (kept with run --keep-best) instead of the latest",
    )


def run(args) -> int:
    from beatloop.cli.recorded import existing_run_dir
    from beatloop.cli.run_parts import model_paths
    from beatloop.core.saving.run_dir import check_export_dir
    from beatloop.restoring import restore

    check_export_dir(args.out)  # before the run is rebuilt, and before anything is written
    existing_run_dir(args.run_dir, "export")
    models = model_paths(args.model) or None
    result = restore(args.run_dir, _training_data(args), best=args.best, models=models)
    print(f"{result.recipe.name}: restored {result.checkpoint} (step {result.steps})")
    for name, path in result.export(args.out).items():
        print(f"{name}: {path}")
    return 0


def _training_data(args):
    """The ``data=`` to rebuild the run on: ``--data``, else the ``--data`` its
    ``run.json`` records (read now, for its batches' shapes), else ``None``: the recipe's
    built-in data."""
    from beatloop.cli.options import data_option
    from beatloop.cli.recorded import read_recorded_source, recorded_recipe, recorded_source

    given = data_option(args)
    if given is not None:
        return given
    source = recorded_source(args.run_dir)
    if source is None:
        return None
    record, recipe = recorded_recipe(args.run_dir, "export")
    return read_recorded_source(args.run_dir, source, recipe, record.seed)
