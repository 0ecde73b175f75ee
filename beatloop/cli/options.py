"""What several commands share: the help format (defaults shown, the exit code table
kept), ``--verbose``, ``--import``, ``--set``, ``--steps-per-execution`` and the data options, and
the ``data=`` that ``--data`` asks ``fit`` for."""

from __future__ import annotations

import argparse

from beatloop.core.failures.errors import EXIT_CODES
from beatloop.core.running.pacing import steps_per_execution


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Help that shows every option's default and keeps the exit code table's lines. An
    option whose default is nothing (``None``: its help says what that means; an off
    flag; an empty list; a ``--no-...`` flag, whose help says what is on without it) shows
    no ``(default: ...)``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        nothing = action.default in (None, False, []) or action.default is argparse.SUPPRESS
        if nothing or isinstance(action, argparse._StoreFalseAction):
            return action.help or ""
        return super()._get_help_string(action)


def exit_codes() -> str:
    """The exit code table every help ends with."""
    lines = [f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items()]
    return "exit codes:\n" + "\n".join(lines)


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` and ``--import``, which every command takes."""
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also TensorFlow's own log lines, and the traceback of an error",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import this module first, for the recipes, callbacks and data sources it "
        "registers: a dotted name importable from the current directory (my_pkg.recipes) "
        "or a .py file's path, imported under its own name, not as __main__ (repeatable)",
    )


def command_parser(commands, name: str, **kwargs) -> argparse.ArgumentParser:
    """A command's sub-parser: ``--verbose``, the help format, the exit codes."""
    common = argparse.ArgumentParser(add_help=False)
    add_common_options(common)
    return commands.add_parser(
        name, parents=[common], formatter_class=HelpFormatter, epilog=exit_codes(), **kwargs
    )


def add_set_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--set FIELD=VALUE`` (repeatable): a recipe config field."""
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help=help)


def add_steps_per_execution(parser: argparse.ArgumentParser) -> None:
    """``--steps-per-execution K`` (or ``auto``)."""
    parser.add_argument(
        "--steps-per-execution",
        type=steps_per_execution,
        default="auto",
        metavar="K",
        help="steps per compiled call, or auto: timed and grown while it saves time",
    )


def add_data_options(parser: argparse.ArgumentParser) -> None:
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
    add_data_set_option(
        parser,
        "a parameter of the --data source (repeatable), e.g. image_size=28,28 or "
        "label=target; see `beatloop data KIND`",
    )


def add_data_set_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--data-set NAME=VALUE`` (repeatable): a parameter of the ``--data`` source."""
    parser.add_argument("--data-set", action="append", default=[], metavar="NAME=VALUE", help=help)


def add_model_option(parser: argparse.ArgumentParser) -> None:
    """``--model NAME=PATH`` (repeatable) for a command that rebuilds a run: a model in
    place of the one its run dir kept (or could not keep)."""
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a model from a .keras file in place of the run's NAME (repeatable): the model "
        "the run was passed, when its run dir could not keep it",
    )


def data_option(args):
    """The ``data=`` that ``--data`` asks for: ``None`` (the recipe's built-in data), or
    a function ``(recipe, seed) -> DataSplit`` for ``fit`` to call."""
    from beatloop.core.failures.errors import ConfigError

    validation = getattr(args, "validation_data", None)
    if args.data is None:
        if validation is not None or args.data_set:
            given = "--validation-data" if validation is not None else "--data-set"
            raise ConfigError(f"{given} needs --data KIND:PATH")
        return None
    from beatloop.named_data.load import NamedData

    return NamedData(args.data, tuple(args.data_set), validation)
