"""What ended a command, on standard error, and its exit code: one ``beatloop: error:``
line for an error beatloop recognises (in the command line's spelling), the traceback
and a request to report it for anything else."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from beatloop.cli.spelling import for_command_line

#: Where an unexpected error sends the user: no address, since none is published.
REPORT = (
    "beatloop: this is a bug in beatloop (or a library it uses), not in your input; "
    "please report it to beatloop's maintainers with the command and the traceback above"
)


def report_failure(error: BaseException, verbose: bool) -> int:
    """Report what ended the command on standard error; return its exit code. A
    ``SystemExit`` goes on as it is."""
    from beatloop.core.failures.errors import BeatloopError, RunInterrupted, UserCodeError

    if isinstance(error, SystemExit):
        raise error
    if isinstance(error, BrokenPipeError):  # the reader went away (`beatloop list | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if verbose:
        traceback.print_exception(error, file=sys.stderr)
    if isinstance(error, KeyboardInterrupt):
        return _interrupted(error, RunInterrupted)
    if isinstance(error, BeatloopError):
        # A recipe's own error text is the user's, as they wrote it.
        text = str(error) if isinstance(error, UserCodeError) else for_command_line(str(error))
        print(f"beatloop: error: {text}", file=sys.stderr)
        return error.exit_code
    if not verbose:
        traceback.print_exception(error, file=sys.stderr)
    print(f"beatloop: internal error: {type(error).__name__}: {error}\n{REPORT}", file=sys.stderr)
    return 1


def report_run_failures(failures) -> int:
    """Failed runs of a comparison (``compare.RunFailure``), each one ``beatloop:
    error:`` line in the command line's spelling (a bug's: its traceback, then
    ``beatloop: internal error:`` and the request to report it); returns the first's
    exit code, the code of the failure printed first."""
    for failure in failures:
        if failure.internal:
            if failure.detail.strip():
                print(failure.detail.rstrip(), file=sys.stderr)
            print(f"beatloop: internal error: {failure.text()}\n{REPORT}", file=sys.stderr)
        else:
            print(f"beatloop: error: {failure.text(for_command_line)}", file=sys.stderr)
    return failures[0].exit_code


def _interrupted(error: KeyboardInterrupt, run_interrupted: type) -> int:
    """Ctrl-C: where the run stopped and how to resume it, when it saved a checkpoint."""
    if not isinstance(error, run_interrupted):
        print("beatloop: interrupted", file=sys.stderr)
        return 130
    print(f"beatloop: {error}", file=sys.stderr)
    if error.checkpoint:
        print(
            "beatloop: resume with the same command and --run-dir "
            f"{Path(error.checkpoint).parent.parent}",
            file=sys.stderr,
        )
    return error.exit_code
