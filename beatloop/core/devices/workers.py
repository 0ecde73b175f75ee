"""Which worker of a multi-worker run this process is, where it writes, and what it says
when another worker is lost.

Under ``MultiWorkerMirroredStrategy`` every worker runs the whole program on the same
``run_dir`` (a file system they share). The chief (the task ``chief``, or worker 0 when
the cluster has none, as Keras's ``_is_chief`` decides) writes the run dir: ``run.json``,
the history, checkpoints, pictures, the lock. Every other worker runs the same
callbacks and saves the same checkpoints (saving reads synchronised-on-read variables
across the workers, so every worker must save), into a temporary dir of its own that
is removed when the run ends, failed runs included; every worker restores the chief's
checkpoints from the shared run dir, and ``agree_on_start`` checks that they all did.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import tensorflow as tf

from beatloop.core.failures.errors import BeatloopError, CheckpointError
from beatloop.core.saving.checkpoint_files import number_of


class WorkerLostError(BeatloopError, RuntimeError):
    """Another worker of a multi-worker run stopped (killed, its machine gone): this
    worker's collective ops failed. Names the worker lost, where the run stopped and the
    checkpoint the run dir holds; every worker must be started again with the same
    command to resume. ``original`` is TensorFlow's error."""

    exit_code = 6


@attrs.frozen
class Worker:
    """This process's place in the cluster: its task (``task_type`` ``None`` on one
    machine), and how many training tasks (chief and workers) the cluster has."""

    task_type: str | None = None
    task_id: int = 0
    count: int = 1
    has_chief_task: bool = False

    @property
    def is_chief(self) -> bool:
        """Whether this worker writes the run dir."""
        if self.task_type is None or self.count == 1:
            return True
        if self.has_chief_task:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_id == 0

    @property
    def name(self) -> str:
        return task_name(self.task_type or "worker", self.task_id, self.has_chief_task)


def task_name(task_type: str, task_id: int, has_chief_task: bool) -> str:
    """A task in words: ``worker 2``, ``worker 0 (the chief)``, ``the chief``."""
    if task_type == "chief":
        return "the chief"
    chief = task_type == "worker" and task_id == 0 and not has_chief_task
    return f"{task_type} {task_id}" + (" (the chief)" if chief else "")


def worker_of(strategy: tf.distribute.Strategy | None) -> Worker:
    """The worker this process is under ``strategy`` (one worker, the chief, for any
    strategy without a cluster)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return Worker()
    jobs = resolver.cluster_spec().as_dict()
    count = sum(len(jobs.get(job, ())) for job in ("chief", "worker"))
    return Worker(resolver.task_type, int(resolver.task_id or 0), max(count, 1), "chief" in jobs)


@contextlib.contextmanager
def write_dir(run_dir: Path, worker: Worker) -> Iterator[Path]:
    """Where ``worker`` writes: the run dir for the chief; for any other worker a new
    temporary dir, removed when the block ends (however it ends)."""
    if worker.is_chief:
        yield Path(run_dir)
        return
    prefix = f"beatloop-{(worker.task_type or 'worker')}{worker.task_id}-"
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def agree_on_start(
    strategy: tf.distribute.Strategy, worker: Worker, run_dir: Path | None, restored: str | None
) -> None:
    """Check, with one gather across the workers, that every worker has a run dir or
    none and restored the same checkpoint (or none): a worker whose run dir is not the
    chief's shared one would train on from other weights. Also a barrier: no worker
    writes a checkpoint before every worker has read the one it restores."""
    number = -1 if restored is None else number_of(restored)
    row = tf.constant([[int(run_dir is not None), number]], tf.int64)
    gather = tf.function(
        lambda: strategy.gather(strategy.run(lambda: row), axis=0), autograph=False
    )
    rows = gather().numpy()
    per_worker = max(1, len(rows) // worker.count)
    seen = [tuple(int(v) for v in rows[i]) for i in range(0, len(rows), per_worker)]
    if len(set(seen)) == 1:
        return
    said = "; ".join(
        f"worker {index}: "
        + ("no run dir" if not has else "no checkpoint" if number < 0 else f"ckpt-{number}")
        for index, (has, number) in enumerate(seen)
    )
    raise CheckpointError(
        f"the workers did not start from the same checkpoint ({said}); every worker must "
        f"be given the same run dir (--run-dir, run_dir=) on a file system they share, "
        f"where the chief writes (this is {worker.name}, run dir {run_dir})"
    )


def slowest_of(strategy: tf.distribute.Strategy | None) -> Callable[[float], float] | None:
    """Under several workers, a function giving the largest of every worker's value (one
    reduction across them; ``None`` on one worker): ``"auto"`` pacing decides on it, so
    every worker settles on the same K and their calls, and the collectives reading
    figures at a call's end, stay in step."""
    if worker_of(strategy).count == 1:
        return None
    largest = tf.function(  # tf.distribute reduces by SUM or MEAN only: gather, then max
        lambda value: tf.reduce_max(strategy.gather(strategy.run(lambda: value[None]), axis=0)),
        autograph=False,
    )
    return lambda seconds: float(largest(tf.constant(seconds, tf.float32)))


# TensorFlow's words when a peer went away: its connection reset or refused, or the
# coordination service's heartbeats missing.
_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
_HEARTBEATS = re.compile(r"stopped sending heartbeats\):\s*((?:/job:\w+/replica:\d+/task:\d+\s*)+)")
_REMOTE = re.compile(r"remote target (/job:\w+/replica:\d+/task:\d+)")
_GONE = re.compile(
    r"Connection reset by peer|Failed to connect|failed to connect|Connection refused|"
    r"stopped sending heartbeats|Socket closed|unhealthy",
)


def peer_failure(error: BaseException) -> tf.errors.OpError | None:
    """The TensorFlow error in ``error``'s chain (itself, its cause or context, an
    ``original``) that says another task of the cluster went away, if there is one."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, tf.errors.OpError):
            message = error.message or str(error)
            if _TASK.search(message) and (
                isinstance(error, tf.errors.UnavailableError) or _GONE.search(message)
            ):
                return error
        error = getattr(error, "original", None) or error.__cause__ or error.__context__
    return None


def lost_tasks(message: str, worker: Worker) -> list[str]:
    """The tasks ``message`` says are gone, in words: those whose heartbeats stopped,
    else the first remote task named (TensorFlow names the failed peer first, then the
    peers that passed the failure on)."""
    found = _HEARTBEATS.search(message)
    names = _TASK.findall(found[1]) if found else []
    if not names:
        remote = [_TASK.search(target).groups() for target in _REMOTE.findall(message)]
        own = (worker.task_type, str(worker.task_id))
        names = [task for task in remote if task != own][:1]
    unique = dict.fromkeys((job, int(index)) for job, index in names)
    return [task_name(job, index, worker.has_chief_task) for job, index in unique]


def lost_worker_error(
    error: BaseException, worker: Worker, *, where: str, run_dir: Path | None,
    checkpoint: str | None,
) -> WorkerLostError | None:  # fmt: skip
    """The WorkerLostError for ``error`` when it says another worker went away (on a
    cluster of more than one worker), else ``None``."""
    failure = peer_failure(error) if worker.count > 1 else None
    if failure is None:
        return None
    message = failure.message or str(failure)
    lost = lost_tasks(message, worker)
    who = " and ".join(lost) if lost else "another worker"
    if not worker.is_chief and lost and all("chief" in name for name in lost):
        who += " (which stops when any worker is lost: its message names that worker)"
    why = _GONE.search(message)
    saved = (
        f"the run dir {run_dir} holds its last checkpoint, {Path(checkpoint).name}"
        if checkpoint
        else f"no checkpoint was written yet (run dir {run_dir})"
    )
    found = WorkerLostError(
        f"{who} of the {worker.count} workers was lost at {where} "
        f"({why[0] if why else type(failure).__name__}), so {worker.name} stopped; "
        f"{saved}: start all {worker.count} workers again with the same command to resume "
        "from it"
    )
    found.original = failure
    return found


class Cluster:
    """A run's view of its cluster, for the engine's recovery: the worker it is, the
    start every worker must agree on (checked once), and a lost worker in words."""

    def __init__(self, strategy: tf.distribute.Strategy | None, read_dir: Path | None):
        self.strategy, self.read_dir = strategy, read_dir
        self.worker = worker_of(strategy)
        self._agreed = self.worker.count == 1  # one worker: nothing to agree on

    def start(self, restored: str | None) -> None:
        """After a resume (found or not), before any worker writes: ``agree_on_start``."""
        if not self._agreed:
            self._agreed = True
            agree_on_start(self.strategy, self.worker, self.read_dir, restored)

    def lost(self, error: BaseException, counters, checkpoint: str | None):
        """The WorkerLostError ``error`` amounts to, if another worker went away."""
        if self.worker.count == 1:
            return None
        try:
            where = counters.where()
        except Exception:  # the runtime is failing: say less
            where = "a step"
        return lost_worker_error(
            error, self.worker, where=where, run_dir=self.read_dir, checkpoint=checkpoint
        )
