"""One worker of a multi-worker run for ``tests/test_workers.py``: ``beatloop run ARGS``
in this process (TF_CONFIG from the environment), exiting with the command's code.

With ``KILL_WHEN=PATH`` in the environment the worker SIGKILLs itself as soon as PATH
exists (a checkpoint the chief writes): a worker lost mid-epoch, with no chance to
clean up, as when its machine dies.
"""

from __future__ import annotations

import os
import signal
import sys
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


if __name__ == "__main__":
    if os.environ.get("KILL_WHEN"):
        kill_when(Path(os.environ["KILL_WHEN"]))
    from beatloop.cli.app import main

    sys.exit(main(["run", *sys.argv[1:]]))
