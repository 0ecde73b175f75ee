"""Pieces the benchmark scripts share (run them as ``python benchmarks/NAME.py``)."""

from __future__ import annotations

import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import keras
from tensorflow.python.framework import config as tf_config

import beatloop


def spread(values: list[float]) -> str:
    """Half the min-max range over repeats as a percentage of the median ("" for one)."""
    if len(values) < 2:
        return ""
    return f"±{50 * (max(values) - min(values)) / statistics.median(values):.0f}%"


def fresh_process(
    script: str, arguments: Sequence[str], label: str, this_checkout: bool = False
) -> dict:
    """The figures a benchmark's child prints as its last line (JSON): ``script`` run in
    a fresh Python with ``arguments`` (``this_checkout``: this checkout's beatloop ahead
    of ``PYTHONPATH``); a child that fails ends the benchmark with its stderr's end."""
    env = None
    if this_checkout:
        root = str(Path(__file__).resolve().parents[1])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        }
    command = [sys.executable, script, *arguments]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{label} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def interleaved(cases: Sequence, modes: Sequence, repeats: int, run: Callable) -> dict:
    """``{(case, mode): [run(case, mode) per repeat]}``, each case's modes run in turn and
    their order reversed every other repeat, so machine noise falls on each alike."""
    runs: dict[tuple, list] = {(case, mode): [] for case in cases for mode in modes}
    for repeat in range(repeats):
        for case in cases:
            for mode in modes if repeat % 2 == 0 else modes[::-1]:
                runs[case, mode].append(run(case, mode))
    return runs


def epoch_figures(rounds: list[dict]) -> dict:
    """One side's figures over its rounds (fresh processes, each a dict of
    ``epoch_seconds``, ``cpu_seconds``, ``peak_mb``, ``start_mb``, the first epoch
    dropped): best and median kept epoch (pooled), the spread of the rounds' medians, the
    median kept epoch's CPU seconds, peak and start memory (medians of rounds)."""
    kept = [r["epoch_seconds"][1:] for r in rounds]
    pooled = [t for times in kept for t in times]
    peaks = [r["peak_mb"] for r in rounds]
    return {
        "best": min(pooled),
        "median": statistics.median(pooled),
        "spread": spread([statistics.median(times) for times in kept]),
        "cpu": statistics.median(t for r in rounds for t in r["cpu_seconds"][1:]),
        "peak_mb": statistics.median(peaks),
        "peak_spread": spread(peaks),
        "start_mb": statistics.median(r["start_mb"] for r in rounds),
    }


def machine() -> str:
    """The CPU's model name and count, from ``/proc/cpuinfo``."""
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
             .splitlines() if line.startswith("model name")]  # fmt: skip
    return f"{names[0] if names else platform.machine()}, {os.cpu_count()} CPUs"


def as_users_run() -> None:
    """TensorFlow's op determinism off, as a process has it unless something turns it
    on: where Keras ``fit`` and a hand-written loop run (a seeded beatloop run earlier
    in the process, or an older checkout's, would have left it on)."""
    tf_config.disable_op_determinism()


def as_the_others() -> dict:
    """``beatloop.fit``'s arguments for op determinism off, as in the hand-written loops
    beside it: a seeded run (kept for its repeatable randomness) would turn it on, and
    with it composite cross-entropy ops and deterministic ``tf.data`` ordering. An
    older checkout has no switch: nothing to pass (its loops then run with it on)."""
    takes = "op_determinism" in inspect.signature(beatloop.fit).parameters
    return {"op_determinism": False} if takes else {}


def summed_per_id(grads: list) -> list:
    """Each embedding gradient (``IndexedSlices``, a row per lookup) with the rows of one
    id summed, as beatloop hands its optimizers (Keras 3's would square each row apart);
    a hand-written loop doing beatloop's update does this too. Other gradients as they
    are."""
    import tensorflow as tf

    def summed(grad):
        if not isinstance(grad, tf.IndexedSlices):
            return grad
        ids, rows = tf.unique(grad.indices)
        values = tf.math.unsorted_segment_sum(grad.values, rows, tf.shape(ids)[0])
        return tf.IndexedSlices(values, ids, grad.dense_shape)

    return [summed(grad) for grad in grads]


class KerasTimer(keras.callbacks.Callback):
    """Wall time of each Keras ``fit`` epoch."""

    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._start)


class EpochTimer(beatloop.Callback):
    """Wall time of each epoch of a beatloop run (validation and epoch figures included)."""

    def __init__(self):
        self.times: list[float] = []

    def on_epoch_start(self, run, epoch):
        self._start = time.perf_counter()

    def on_epoch_end(self, run, epoch, logs):
        self.times.append(time.perf_counter() - self._start)

    def rate(self, per_epoch: float) -> float:
        """``per_epoch`` (examples or steps) per second in the median epoch after the
        first (which traces)."""
        return per_epoch / statistics.median(self.times[1:])


def timed_fit(recipe, data, epochs: int, steps_per_execution: int, **parts) -> list[float]:
    """Epoch times of one quiet, seeded ``beatloop.fit`` with op determinism off, as the
    hand-written loops run (``parts``: models, optimizers)."""
    timer = EpochTimer()
    beatloop.fit(
        recipe,
        data=data,
        epochs=epochs,
        seed=0,
        steps_per_execution=steps_per_execution,
        progress=False,
        callbacks=[timer],
        **as_the_others(),
        **parts,
    )
    return timer.times


class TrainingTimer(beatloop.TrainingTimer):
    """Training time only (see ``beatloop.TrainingTimer``), with a median rate."""

    def rate(self, per_epoch: float) -> float:
        """``per_epoch`` per second in the median epoch after the first (which traces)."""
        return per_epoch / statistics.median(self.epoch_seconds[1:])


# --- beatloop against a hand-written loop doing the same updates --------------------------


def handwritten_epochs(step, data, metrics, epochs: int, steps_per_call: int | None) -> list:
    """Epoch times of a hand-written loop: a compiled ``step(batch)`` called per batch
    (``steps_per_call=None``) or ``steps_per_call`` steps per compiled call; metrics
    reset each epoch and read at its end, as fit does; op determinism off, as a user's
    process has it."""
    import tensorflow as tf

    as_users_run()

    if steps_per_call is None:
        compiled = tf.function(step)

        def run_epoch():
            for batch in data:
                compiled(batch)

    else:

        @tf.function
        def run_steps(iterator):
            count = tf.constant(0)
            for _ in tf.range(steps_per_call):
                batch = iterator.get_next_as_optional()
                if not batch.has_value():
                    break
                step(batch.get_value())
                count += 1
            return count

        def run_epoch():
            iterator = iter(data)
            while int(run_steps(iterator)) == steps_per_call:
                pass

    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        for metric in metrics.values():
            metric.reset_state()
        run_epoch()
        _ = {name: float(m.result()) for name, m in metrics.items()}
        times.append(time.perf_counter() - start)
    return times


def race_rates(loops: dict, steps: int, repeats: int, epochs: int, log) -> dict[str, list]:
    """Steps/s of each loop (its fastest epoch after the first) in every repeat; the
    repeats' order rotates so machine noise spreads evenly."""
    rates: dict[str, list[float]] = {name: [] for name in loops}
    names = list(loops)
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            rate = steps / min(loops[name](epochs)[1:])
            rates[name].append(rate)
            log(f"repeat {repeat + 1}/{repeats}  {name:<40} {rate:8,.1f} steps/s")
    return rates


def race(loops: dict, steps: int, repeats: int, epochs: int, log) -> dict[str, float]:
    """Steps/s of each loop (its fastest epoch after the first), median over repeats."""
    rates = race_rates(loops, steps, repeats, epochs, log)
    return {name: statistics.median(values) for name, values in rates.items()}


def race_arguments(argv, description: str, add=None):
    """A race's command line, parsed: ``repeats`` and ``epochs`` (``--quick``: 1 repeat
    of 2 epochs); ``add(parser)`` adds a benchmark's own options."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per fit, first dropped")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2 epochs")
    if add is not None:
        add(parser)
    args = parser.parse_args(argv)
    args.repeats, args.epochs = (1, 2) if args.quick else (args.repeats, max(args.epochs, 2))
    return args


def cross_race(loops: dict, steps: int, repeats: int, epochs: int, what: str, target: float):
    """Race ``loops`` (``loop(epochs) -> epoch times``; the first two beatloop's, the
    others hand-written) and print each one's median steps/s with its spread, then every
    beatloop / hand-written ratio against the target. Returns the medians."""
    import sys

    rates = race_rates(loops, steps, repeats, epochs, lambda line: print(line, file=sys.stderr))
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n{what} steps/s ({steps} steps/epoch), median of {repeats} repeat(s)")
    for name, value in median.items():
        print(f"{name:<44} {value:10,.1f}  {spread(rates[name])}")
    names = list(loops)
    pairs = [(ours, theirs) for ours in names[:2] for theirs in names[2:]]
    width = max(len(f"{ours} / {theirs}") for ours, theirs in pairs)
    print(f"\n{'ratio':<{width}} {'value':>8}  target")
    for ours, theirs in pairs:
        ratio = median[ours] / median[theirs]
        verdict = "ok" if ratio >= target else "--"
        print(f"{ours + ' / ' + theirs:<{width}} {ratio:7.2f}x  >= {target} {verdict}")
    return median


def print_race(title: str, median: dict[str, float], pairs: list, target: float) -> None:
    """The medians, then ours/theirs for each (ours, theirs) pair against the target."""
    print(f"\n{title}")
    for name, value in median.items():
        print(f"{name:<44} {value:10,.0f}")
    print(f"\n{'ratio':<44} {'value':>10}  target")
    for ours, theirs in pairs:
        ratio = median[ours] / median[theirs]
        verdict = "ok" if ratio >= target else "--"
        print(f"{ours + ' / hand-written':<44} {ratio:9.2f}x  >= {target} {verdict}")


def race_main(argv, description: str, make_data, loops: dict, what: str, target: float):
    """The command line of a beatloop-vs-hand-written race: ``loops`` maps names to
    ``loop(data, epochs) -> epoch times``, the first two beatloop's (spe=1, spe=K), the
    next two the hand-written ones in the same order. Returns the medians."""
    import argparse
    import functools
    import sys

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per fit, first dropped")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2 epochs")
    args = parser.parse_args(argv)
    repeats, epochs = (1, 2) if args.quick else (args.repeats, max(args.epochs, 2))
    data = make_data()
    steps = int(data.cardinality())
    bound = {name: functools.partial(loop, data) for name, loop in loops.items()}
    median = race(bound, steps, repeats, epochs, lambda line: print(line, file=sys.stderr))
    names = list(loops)
    title = f"{what} steps/s ({steps} steps/epoch), median of {repeats} repeat(s)"
    print_race(title, median, [(names[0], names[2]), (names[1], names[3])], target)
    return median
