"""One worker of a multi-worker run for ``tests/test_workers.py``: ``beatloop run ARGS``
in this process (TF_CONFIG from the environment), exiting with the command's code.

``python cluster_run.py [--tmpdir DIR] [--kill-when PATH] ARGS``: with ``--tmpdir`` the
worker's temporary files go under DIR (TMPDIR set, and Python's cached temporary dir
dropped, before the run starts: the worker may be forked from a zygote that has
TensorFlow imported, whose environment holds no TMPDIR of this worker's). With
``--kill-when`` the worker SIGKILLs itself as soon as PATH exists (a checkpoint the
chief writes): a worker lost mid-epoch, with no chance to clean up, as when its machine
dies.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def kill_when(path: Path) -> None:
    """SIGKILL this process once ``path`` exists (checked every 5 ms)."""

    def watch():
        while not path.exists():
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def own_options(args: list[str]) -> list[str]:
    """Apply ``--tmpdir`` and ``--kill-when`` (leading), and return the rest."""
    while args and args[0] in ("--tmpdir", "--kill-when"):
        option, value, args = args[0], args[1], args[2:]
        if option == "--tmpdir":
            os.environ["TMPDIR"] = value
            tempfile.tempdir = None  # gettempdir() reads TMPDIR again
        else:
            kill_when(Path(value))
    return args


if __name__ == "__main__":
    arguments = own_options(sys.argv[1:])
    from beatloop.cli.app import main

    sys.exit(main(["run", *arguments]))
