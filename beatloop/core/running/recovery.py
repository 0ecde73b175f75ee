"""Recovery: checkpoint save and restore, rollback after a fault, Ctrl-C and SIGTERM.

The engine tells ``Recovery`` where the run is (the start, a call boundary, an
epoch's end, a faulted call); Recovery decides whether to save, restores on resume and
on rollback, and turns Ctrl-C and SIGTERM into a checkpoint at the next call boundary.
Without a run dir there is nothing to save: faults stop the run, and the signals act as
usual.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from pathlib import Path

from beatloop.core.compiled.counters import Counters
from beatloop.core.compiled.loop import CallResult
from beatloop.core.compiled.metrics import StepMetrics
from beatloop.core.compiled.numerics import describe_checks
from beatloop.core.devices.workers import Cluster
from beatloop.core.events.callbacks import CallbackList
from beatloop.core.failures.errors import ConfigError, NumericsError, RunInterrupted
from beatloop.core.running.best import BestKeeper
from beatloop.core.running.options import EngineOptions
from beatloop.core.saving.checkpoints import RunCheckpoints
from beatloop.core.saving.record import RunRecord

#: The signals a run with a run dir turns into a checkpoint and a stop: Ctrl-C, and what
#: kill, Slurm, Docker and Kubernetes send.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class InterruptFlag:
    """Turns Ctrl-C (SIGINT) and SIGTERM into a request the engine acts on between
    compiled calls, so the state it checkpoints is whole; a second one stops at once.

    ``requested``: the number of the signal received (``None``: none)."""

    def __init__(self):
        self.requested: int | None = None

    @contextlib.contextmanager
    def catching(self, enabled: bool = True):
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

        def request(signum, frame):
            if self.requested is not None:
                for number, handler in previous.items():
                    signal.signal(number, handler)
                if signum == signal.SIGINT:
                    raise KeyboardInterrupt
                raise RunInterrupted(
                    f"stopped at once by a second {signal.Signals(signum).name}, without a "
                    "checkpoint of this moment",
                    None,
                    signum,
                )
            self.requested = signum

        self.requested = None
        for signum in STOP_SIGNALS:
            signal.signal(signum, request)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class Recovery:
    """Saves, restores and rolls back one run's checkpoints (none without a run dir)."""

    def __init__(
        self,
        checkpoints: RunCheckpoints | None,
        record: RunRecord,
        *,
        callbacks: CallbackList,
        counters: Counters,
        metrics: StepMetrics,
        options: EngineOptions,
        cluster: Cluster | None = None,
        best: BestKeeper | None = None,
    ):
        self.checkpoints = checkpoints
        #: The best epoch so far (``keep_best``), kept in every checkpoint and run.json.
        self.best = best or BestKeeper(None)
        self.cluster = cluster or Cluster(None, None)
        self.record = record
        self.callbacks = callbacks
        self.counters = counters
        self.metrics = metrics
        self.options = options
        #: Paths of the checkpoints written so far by this process, oldest first.
        self.saved: list[str] = []
        #: The checkpoint this run resumed from, if it did.
        self.resumed_from: str | None = None
        self._resume_checked = False
        self._saved_step = -1
        self._rollbacks = 0
        self._interrupt = InterruptFlag()

    @property
    def latest(self) -> str | None:
        return self.checkpoints.latest if self.checkpoints is not None else None

    # --- resume and save ---------------------------------------------------------------

    def resume(self, checkpoint: str | None = None) -> str | None:
        """Restore the latest readable checkpoint (``checkpoint``: that one), if there
        is one, and return its path (the first call does this; later calls return what it
        found)."""
        if self.checkpoints is None or self._resume_checked:
            self.cluster.start(self.resumed_from)  # without a run dir: checked all the same
            return self.resumed_from
        self._resume_checked = True
        restored = self.checkpoints.restore_latest(self.record, only=checkpoint)
        if restored is not None:
            path, host = restored
            self._restore_host(path, host)
            self._saved_step = int(self.counters.step)
            self.resumed_from = path
        self.cluster.start(self.resumed_from)
        return self.resumed_from

    def trains_more(self, epochs: int) -> bool:
        """Whether a run of ``epochs`` has anything to train after the resume: ``False``
        when the checkpoint holds exactly ``epochs`` finished epochs. A checkpoint past
        ``epochs`` is refused with a ConfigError: training cannot go back, and a run.json
        rewritten to the lower epochs would replay as another run."""
        done, into = int(self.counters.epoch), int(self.counters.epoch_batches)
        if self.resumed_from is None or epochs > done:
            return True
        if epochs == done and into == 0:
            return False
        held = f"{done} finished epoch(s)" + (f" and {into} step(s) of the next" if into else "")
        raise ConfigError(
            f"the run dir {self.checkpoints.directory.parent} holds {held} (step "
            f"{int(self.counters.step)}), more than the {epochs} epoch(s) asked for "
            f"(--epochs, epochs=); nothing was changed. Pass --epochs {done + 1} or more to "
            "train it further, or another run dir (--run-dir, run_dir=) for a new run"
        )

    def _restore_host(self, path: str, host: dict) -> None:
        """The Python-side state a restored checkpoint holds: callbacks', the best's."""
        self.callbacks.restore_state(host.get("callbacks", {}))
        self.best.restore(host, path, self.checkpoints.read_directory)
        self.checkpoints.protected = self.best.checkpoint

    def save(self, logs=None) -> None:
        """Write a checkpoint now (with a run dir); ``logs``: an epoch's end's figures,
        its checkpoint then the best (``keep_best``) when they beat the best so far:
        ``run.json`` names it once it is saved, and only then is the former best let go."""
        if self.checkpoints is None:
            return
        better = logs is not None and self.best.consider(int(self.counters.epoch), logs)
        host = {
            "position": self.counters.position(),
            "callbacks": self.callbacks.checkpoint_state(),
            **self.best.host_state(),
        }
        self.saved.append(self.checkpoints.save(host, self.record))
        self._saved_step = int(self.counters.step)
        if better:
            self.best.settle(self.saved[-1])
            self.best.write(self._run_json)
            self.checkpoints.protect(self.best.checkpoint)

    @property
    def _run_json(self) -> Path:
        return self.checkpoints.directory.parent / "run.json"

    def tidy(self) -> list[str]:
        """After a resume with nothing to train, put right what a kill after the last
        save of a new best left, and say what (``[]``: nothing, nothing written):
        ``run.json`` names the best the checkpoint holds (the kill came before it was
        rewritten), and checkpoints older than the best and the newest ``max_to_keep``
        (the former best) go (it came before they were deleted)."""
        done, best = [], self.best.checkpoint
        if not self.best.recorded(self._run_json):
            self.best.write(self._run_json)
            done.append(f"run.json names the best epoch's checkpoint, {best or 'none'}")
        names = self._checkpoint_names()
        if best in names:
            former = set(names[: names.index(best)]) - set(names[-self.options.max_to_keep :])
            if former:
                self.checkpoints.protect(best)
                left = self._checkpoint_names()
                done += [f"removed {name}" for name in sorted(former) if name not in left]
        return done

    def _checkpoint_names(self) -> list[str]:
        return [Path(path).name for path in self.checkpoints.paths()]

    def save_first(self) -> None:
        """At the start of a new run: a step-0 checkpoint, something to roll back to."""
        if self.resumed_from is None:
            self.save()

    def steps_before_due(self) -> int | None:
        """Steps until the next multiple of ``checkpoint_every`` (``None``: no such
        checkpoints are written)."""
        every = self.options.checkpoint_every
        if self.checkpoints is None or every is None:
            return None
        return every - int(self.counters.step) % every

    def save_if_due(self) -> None:
        """At a call boundary within an epoch: save if ``checkpoint_every`` steps passed."""
        every = self.options.checkpoint_every
        if self.checkpoints is None or every is None:
            return
        if int(self.counters.step) // every > self._saved_step // every:
            self.save()

    # --- faults ------------------------------------------------------------------------

    def recover(self, result: CallResult, beats) -> None:
        """A step reported a non-finite loss or gradient norm, or a diverged loss: roll
        back to the last checkpoint (``on_nan="rollback"``, while rollbacks are left),
        else stop."""
        counters = self.counters
        where = f"at step {int(counters.step)} (epoch {int(counters.epoch) + 1})"
        problem = f"{describe_checks(beats, result.checks, self.options.divergence)} {where}"
        rolls_back = self.options.on_nan == "rollback" and self.checkpoints is not None
        if rolls_back and self._rollbacks < self.options.max_rollbacks:
            self._rollbacks += 1
            self._roll_back(problem)
            return
        advice = (
            f"; the last good checkpoint is {self.latest}"
            if self.latest
            else "; run with debug=True to stop before the bad update is applied"
        )
        if self.options.on_nan == "rollback":
            advice += f" (already rolled back {self._rollbacks} time(s), the most allowed)"
        raise NumericsError(problem + advice)

    def _roll_back(self, problem: str) -> None:
        """Restore the last checkpoint but keep the data where it is: training goes on
        with the batch after the offending one (the batches since the checkpoint are
        skipped with it)."""
        position = self.counters.position()
        path, host = self.checkpoints.restore_latest(self.record)
        self._restore_host(path, host)
        if not self.best.recorded(self._run_json):  # an older checkpoint's best (the
            self.best.write(self._run_json)  # newer ones could not be read)
        if int(self.counters.epoch_batches) == 0:
            self.metrics.reset()
        skipped = position["epoch_batches"] - int(self.counters.epoch_batches)
        self.counters.move_data_to(position)
        warnings.warn(
            f"{problem}; restored {path} (step {int(self.counters.step)}) and skipped "
            f"{skipped} batch(es) ending with the offending one (rollback {self._rollbacks} "
            f"of at most {self.options.max_rollbacks})",
            RuntimeWarning,
            stacklevel=2,
        )

    # --- Ctrl-C and SIGTERM ------------------------------------------------------------

    @contextlib.contextmanager
    def catching_interrupts(self):
        """While training: Ctrl-C or SIGTERM asks for a stop at the next call boundary
        (with a run dir, where a checkpoint can be saved; without one they act as usual:
        Ctrl-C interrupts at once, SIGTERM ends the process); an error saying another
        worker went away becomes a ``WorkerLostError`` (``core/devices/workers.py``)."""
        try:
            with self._interrupt.catching(enabled=self.checkpoints is not None):
                yield
        except BaseException as error:
            lost = self.cluster.lost(error, self.counters, self.latest)
            if lost is None:
                raise
            raise lost from error

    def stop_if_interrupted(self) -> None:
        """After Ctrl-C or SIGTERM: save a checkpoint at this call boundary and stop."""
        signum = self._interrupt.requested
        if signum is None:
            return
        if int(self.counters.step) != self._saved_step or not self.saved:
            self.save()
        by = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
        raise RunInterrupted(
            f"{by} at {self.counters.where()}; checkpoint saved: {self.latest}",
            self.latest,
            signum,
        )
