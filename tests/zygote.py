"""A process that has imported TensorFlow, Keras and beatloop (and run no op), and forks a
child per request that runs ``python ARGS`` as a fresh interpreter would: a test's
worker or ``beatloop`` command starts in a fraction of a second instead of importing
TensorFlow again (``tests/forked.py`` is the other end; ``python_env`` says when not).

Run as ``python tests/zygote.py SOCKET``. A request is one connection: a JSON line
``{"args": [...], "env": {...}, "cwd": "..."}`` with the child's stdin, stdout and stderr
passed along as file descriptors. The child is forked twice, so that its parent is the
test's process (a subreaper then) that waits for it; the reply is its pid.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys


def preload() -> None:
    """Import what every child imports first; nothing here may run a TensorFlow op or
    start a thread (a fork keeps only the thread that forks)."""
    import keras  # noqa: F401
    import numpy  # noqa: F401
    import sklearn.datasets  # noqa: F401
    import tensorflow  # noqa: F401

    import beatloop
    import beatloop.cli  # noqa: F401


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    while True:
        connection, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        request = json.loads(message.decode())
        middle = os.fork()
        if middle == 0:
            child = os.fork()
            if child == 0:
                listener.close()
                connection.close()
                become(request, fds)  # never returns
            connection.sendall(f"{child}\n".encode())
            os._exit(0)  # the child is orphaned: the test's process adopts it
        os.waitpid(middle, 0)
        for fd in fds:
            os.close(fd)
        connection.close()


def become(request: dict, fds: list[int]) -> None:
    """Turn this forked process into ``python ARGS`` in the request's env and cwd, and
    exit as that interpreter would have."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    random.seed()
    import numpy

    numpy.random.seed()
    code = 0
    try:
        run(request["args"])
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    code = _finish(code)
    os._exit(code)


def run(args: list[str]) -> None:
    import runpy

    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path[0] = ""
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> int:
    """What the interpreter does at exit: wait for non-daemon threads, run the ``atexit``
    functions, flush the standard streams."""
    import atexit
    import threading

    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = code or 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or 120
    return code


def die_with_parent() -> None:
    """A zygote whose pytest process is killed goes too (Linux's parent-death signal)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


if __name__ == "__main__":
    die_with_parent()
    preload()
    serve(sys.argv[1])
