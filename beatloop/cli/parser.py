"""The ``beatloop`` command's parser: ``--version``, and one sub-parser per command, each
declared by its command's module (``add_command``), in the order the help lists them."""

from __future__ import annotations

import argparse

import beatloop.cli.cmd_compare as cmd_compare
import beatloop.cli.cmd_data as cmd_data
import beatloop.cli.cmd_evaluate as cmd_evaluate
import beatloop.cli.cmd_export as cmd_export
import beatloop.cli.cmd_list as cmd_list
import beatloop.cli.cmd_run as cmd_run
import beatloop.cli.cmd_show as cmd_show
import beatloop.cli.cmd_tune as cmd_tune
from beatloop.cli.options import HelpFormatter, exit_codes
from beatloop.cli.version import VersionAction

#: The command modules, each with ``NAME``, ``add_command(commands)`` and ``run(args)``.
COMMANDS = (cmd_list, cmd_show, cmd_run, cmd_compare, cmd_tune, cmd_data, cmd_export, cmd_evaluate)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``beatloop`` and every command."""
    parser = argparse.ArgumentParser(
        prog="beatloop",
        description="Run TensorFlow training recipes by name.",
        epilog=exit_codes(),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_command(commands)
    return parser
