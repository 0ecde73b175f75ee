"""``main``: parse the command line, run the command with TensorFlow's start-up lines
filtered out and warnings on one line (``--verbose``: as they come), and turn whatever
ended it into an exit code."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from beatloop.cli.failure import report_failure
from beatloop.cli.parser import COMMANDS, build_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``beatloop`` command and return its exit code (see ``EXIT_CODES``)."""
    program = argv is None  # the process is this command (not Python calling main)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    args.forks = program and args.command in ("tune", "compare")
    command = {module.NAME: module for module in COMMANDS}[args.command]
    try:
        return _run(command, args)
    except BaseException as error:  # every way out gets its line and its exit code
        return report_failure(error, args.verbose)


def _run(command, args) -> int:
    """``command.run(args)`` in the terminal set-up the options ask for, after the
    modules ``--import`` names. ``list`` imports TensorFlow on a cache miss only (or for
    a module to import); a command whose ``without_tensorflow(args)`` says so (``run
    --workers N`` starting its workers, which import the modules themselves) not at all."""
    from beatloop.forking import forked_children
    from beatloop.terminal import import_tensorflow_quietly, one_line_warnings
    from beatloop.user_modules import import_modules

    without = getattr(command, "without_tensorflow", None)
    launcher = without is not None and without(args)
    if args.verbose:
        from beatloop.core.feeding import grappler_lines

        with forked_children(getattr(args, "forks", False)), grappler_lines.shown():
            import_modules([] if launcher else args.imports)
            return command.run(args)
    if launcher or (command.NAME == "list" and not args.imports):
        return command.run(args)
    import_tensorflow_quietly()
    # The command's trials or runs fork from a process forked here, when the process is
    # the command: TensorFlow imported, nothing of the user's yet, Python's warnings
    with forked_children(getattr(args, "forks", False)), one_line_warnings():
        import_modules(args.imports)
        return command.run(args)
