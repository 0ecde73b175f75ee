"""``python -m MODULE`` children that skip TensorFlow's import: ``tune``'s trial processes
and ``compare``'s runs start from a *starter*, a process the ``beatloop`` command forks
(``cli/app.py``) once it has imported TensorFlow and before the user's modules, while no
op ran and no thread started (TensorFlow's runtime does not survive a fork once started).
The starter forks each child on request, twice, so that the
child's parent is the command (a child subreaper for that moment), which waits for it and
signals it as it would a ``subprocess.Popen``'s. Where forking is not safe, not on Linux,
or ``BEATLOOP_FORK_TRIALS=0``, ``popen`` is ``subprocess.Popen``.

A forked child is set up as the spawned one would be: its own session when asked, the
given stdin, stdout and stderr and no other descriptor of the command's, the given
environment (a starter is used only when it equals the one the starter imported under),
fresh ``random`` and NumPy global state, a fresh interpreter's signal handlers, and its
exit status as ``python`` gives it (an uncaught exception: its traceback and 1; an
uncaught ``KeyboardInterrupt``: killed by SIGINT).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

#: The environment variable that turns forked children off (``0``).
SWITCH = "BEATLOOP_FORK_TRIALS"
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
#: What a starter imports before it forks a child: what the children import first.
_PRELOAD = ("numpy", "tensorflow", "keras", "beatloop", "beatloop.fitting",
            "beatloop.compare_report", "beatloop.tuning.study", "optuna")  # fmt: skip


def unsafe_reason() -> str | None:
    """Why this process may not fork a starter now (``None``: it may): switched off,
    not Linux, a Python thread or a named native one (TensorFlow's) running, or
    TensorFlow's eager context or devices initialised."""
    if os.environ.get(SWITCH, "1").strip() == "0":
        return f"{SWITCH}=0"
    if not sys.platform.startswith("linux") or not hasattr(socket, "send_fds"):
        return "not Linux"
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads run"
    named = _named_threads()
    if named:
        return f"native threads run ({', '.join(sorted(named))})"
    if "tensorflow" in sys.modules and _tensorflow_started():
        return "TensorFlow's runtime is initialised (an op ran, or its devices were listed)"
    return None


def _named_threads() -> set[str]:
    """The names of this process's other threads that are not unnamed (a math library's
    pool, which forks safely, keeps the process's name): TensorFlow's, gRPC's, ..."""
    task = Path("/proc/self/task")
    main = Path("/proc/self/comm").read_text().strip()
    names = set()
    for thread in task.iterdir():
        with contextlib.suppress(OSError):
            name = (thread / "comm").read_text().strip()
            if int(thread.name) != os.getpid() and name != main:
                names.add(name)
    return names


def _tensorflow_started() -> bool:
    from tensorflow.python.eager import context

    made = context.context_safe()
    return made is not None and (
        made._context_handle is not None or made._physical_devices is not None
    )


class ForkedChild:
    """The part of ``subprocess.Popen``'s interface ``tune`` and ``compare`` use, for a
    child a starter forked (this process's child once adopted)."""

    def __init__(self, pid: int, args: Sequence[str]):
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: as Popen, taken as 0
                self.returncode = 0
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Starter:
    """A process forked from this one that imports what children import, then forks
    one per request; it ends when this process closes its socket or dies."""

    def __init__(self):
        self.env = dict(os.environ)
        if "tensorflow" not in sys.modules:  # the starter imports it as a child would
            self.env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.state: str | None = None  # "ready", or why it cannot serve
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        interrupt = signal.getsignal(signal.SIGINT)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:
            ours.close()
            _serve(theirs, parent, self.env, interrupt)  # never returns
        theirs.close()
        self.socket = ours

    def ready(self) -> bool:
        """Whether it imported and can fork (waits for its imports the first time)."""
        if self.state is None:
            try:
                self.state = self.socket.recv(4096).decode() or "ended"
            except OSError as error:
                self.state = str(error)
        return self.state == "ready"

    def start(
        self, args: Sequence[str], env: dict[str, str], fds: Sequence[int], session: bool
    ) -> ForkedChild | None:
        """``python ARGS`` (``-m MODULE ...``) forked with stdin, stdout and stderr
        ``fds``; ``None`` where this starter cannot (its environment differs, it ended)."""
        if env != self.env or not self.ready():
            return None
        request = json.dumps({"args": list(args), "env": env, "cwd": os.getcwd(),
                              "session": session}).encode()  # fmt: skip
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        try:
            socket.send_fds(self.socket, [request], list(fds))
            pid = int(self.socket.recv(64) or b"-1")
            if pid > 0:
                _wait_until_adopted(pid)
        except (OSError, ValueError) as error:
            self.state = str(error)
            return None
        finally:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        return ForkedChild(pid, [sys.executable, *args]) if pid > 0 else None

    def close(self) -> None:
        """End it now (it may be importing still); the children it forked live on."""
        self.socket.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _wait_until_adopted(pid: int) -> None:
    """Until ``pid``'s parent is this process (its first parent exits at once)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return  # ended already, and reaped: by this process only
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            return
        time.sleep(0.0005)
    raise OSError(f"forked child {pid} was not adopted")


_open: list[Starter | None] = []


@contextlib.contextmanager
def forked_children(wanted: bool = True) -> Iterator[None]:
    """While it lasts, ``popen`` forks its children from a starter: the one already open
    (an outer ``forked_children``), else one forked now if this process may
    (``unsafe_reason``)."""
    if not wanted or _open:
        yield
        return
    starter = Starter() if unsafe_reason() is None else None
    _open.append(starter)
    try:
        yield
    finally:
        _open.clear()
        if starter is not None:
            starter.close()


def popen(
    command: Sequence[str],
    *,
    stdout=None,
    stderr=None,
    env=None,
    start_new_session: bool = False,
    **options,
) -> subprocess.Popen | ForkedChild:
    """``subprocess.Popen(command, ...)``, or for ``[sys.executable, "-m", MODULE, ...]``
    the same child forked from the open starter, when there is one that can."""
    starter = _open[0] if _open else None
    command = list(command)
    if starter is not None and command[0] == sys.executable and command[1:2] == ["-m"]:
        fds = [0, _fd(stdout, 1), _fd(stderr, 2)]
        fds[2] = fds[1] if stderr is subprocess.STDOUT else fds[2]
        child = starter.start(command[1:], dict(os.environ if env is None else env), fds,
                              start_new_session)  # fmt: skip
        if child is not None:
            return child
    return subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env,
                            start_new_session=start_new_session, **options)  # fmt: skip


def _fd(stream, default: int) -> int:
    if stream is None:
        return default
    return stream if isinstance(stream, int) else stream.fileno()


# --- in the starter ------------------------------------------------------------------------


def _serve(connection: socket.socket, parent: int, env: dict[str, str], interrupt) -> None:
    """The starter: dies with ``parent``, keeps none of its descriptors but its own
    stderr, imports, says whether it can fork, then forks a child per request."""
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the command's to handle
        _drop_descriptors(keep={2, connection.fileno()})
        os.environ.clear()
        os.environ.update(env)
        for name in _PRELOAD:
            with contextlib.suppress(ImportError):
                __import__(name)
        gc.freeze()  # what it inherited is never collected in a child (nor copied)
        reason = unsafe_reason()
        connection.send(b"ready" if reason is None else reason.encode())
        while reason is None:
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            if not message:
                break
            _fork_child(connection, json.loads(message), fds, parent, interrupt)
    finally:  # the command gone (or this starter failing): the command spawns instead
        os._exit(0)


def _drop_descriptors(keep: set[int]) -> None:
    """Every descriptor but ``keep`` made /dev/null (not closed: an object that still
    names one can never close a file a child opens later under its number)."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep and fd != null:
            with contextlib.suppress(OSError):
                os.fstat(fd)  # open still (not the listing's own)
                os.dup2(null, fd, inheritable=False)
    os.close(null)


def _fork_child(connection, request: dict, fds: list[int], parent: int, interrupt) -> None:
    """A child for ``request``, forked through a middle process that exits at once, so
    that the command (a subreaper then) adopts it; its pid sent back (-1: none)."""
    middle = os.fork()
    if middle == 0:
        try:
            child = os.fork()
            if child == 0:
                connection.close()
                _become(request, fds, parent, interrupt)  # never returns
            connection.send(str(child).encode())
        finally:
            os._exit(0)
    os.waitpid(middle, 0)
    for fd in fds:
        os.close(fd)


def _become(request: dict, fds: list[int], parent: int, interrupt) -> None:
    """Turn this process into ``python ARGS`` as ``subprocess.Popen`` would start it,
    and exit as that interpreter would."""
    try:
        while os.getppid() != parent:  # adopted by the command once the middle exits
            if os.getppid() == 1:
                os._exit(1)
            time.sleep(0.0005)
        if request["session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        _fresh_streams()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _fresh_signals(interrupt)
        _fresh_random()
    except BaseException:  # as an interpreter that could not start: a traceback, 1
        with contextlib.suppress(BaseException):
            sys.excepthook(*sys.exc_info())
            sys.stderr.flush()
        os._exit(1)
    os._exit(_finish(_run(request["args"])))


def _fresh_streams() -> None:
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` as a new interpreter makes them
    for descriptors 0, 1 and 2: buffered by line on a terminal only."""
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            buffered,
            encoding=getattr(old, "encoding", None),
            errors=getattr(old, "errors", None),
            line_buffering=raw.isatty() or name == "stderr",
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _fresh_signals(interrupt) -> None:
    """A new interpreter's handlers: SIGINT raises KeyboardInterrupt (unless the command
    was started ignoring it), a Python handler is the default again."""
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            handler = signal.getsignal(number)
            if callable(handler):
                signal.signal(number, signal.SIG_DFL)
    ignored = interrupt == signal.SIG_IGN
    signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)


def _fresh_random() -> None:
    """``random`` and NumPy's global generator seeded afresh, as in a new interpreter."""
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _run(args: list[str]) -> int:
    """``python -m MODULE ARGS...`` run here: its exit status."""
    import runpy

    sys.argv = [args[1], *args[2:]]
    sys.path[0] = os.getcwd()
    sys.modules.pop(args[1], None)  # run afresh as __main__, as by ``python -m``
    try:
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        return _exit_code(stop.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return -signal.SIGINT  # the interpreter ends killed by SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> int:
    """What the interpreter does at exit: wait for non-daemon threads, run the ``atexit``
    functions, flush the standard streams; then a SIGINT death is one."""
    import atexit

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
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    return code
