"""Grappler's remapper on and off: what its rewrite (and its ``remapper failed`` line on
the conv gan) is worth in steps per second.

Each fit runs in a fresh process (the remapper is a process-wide Grappler option,
``tf.config.optimizer.set_experimental_options({"remapping": False})``), the two
settings in turns, alternating which goes first. Cases: the `gan` recipe conv (the
digits at 28x28, the model whose remapper gives up) and dense, and `supervised` (where
the remapper fuses MatMul+BiasAdd+Relu), all on endlessly repeated data with
``steps_per_epoch`` (no end of a pass). Per fit the first epoch (tracing) is dropped and
the median of the others kept; the figure is the median over repeats. The last column
counts the ``remapper failed`` lines each setting printed.

    python benchmarks/remapper.py                       # 3 repeats, K=1
    python benchmarks/remapper.py --steps-per-execution 32 --only gan
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import json
import statistics
import subprocess
import sys

from common import spread

CASES = ("gan conv", "gan dense", "supervised")


def child(case: str, remapping: bool, epochs: int, steps_per_execution: int) -> None:
    """One fit; prints its steps per second as JSON on the last line of stdout."""
    import tensorflow as tf

    if not remapping:
        tf.config.optimizer.set_experimental_options({"remapping": False})
    from common import EpochTimer
    from epoch_boundary import BATCH, PASSES, StepOnly, digits, one_pass

    import beatloop
    from beatloop import DataSplit
    from beatloop.core.feeding import grappler_lines
    from beatloop.recipes.gan import Gan

    if case == "supervised":
        recipe = beatloop.make_recipe("supervised", {"batch_size": BATCH})
        train = one_pass(digits(), ["x", "y"], PASSES)
    else:
        architecture = case.split()[1]
        recipe = StepOnly(Gan.Config(architecture=architecture, batch_size=BATCH))
        arrays = digits(28 if architecture == "conv" else None, signed=True)
        train = one_pass(arrays, ["x"], 1 if architecture == "conv" else PASSES)
    steps = int(train.cardinality())
    timer = EpochTimer()
    with grappler_lines.shown():  # so the parent counts them
        beatloop.fit(
            recipe, data=DataSplit(train.repeat()), epochs=epochs, seed=0,
            steps_per_epoch=steps, steps_per_execution=steps_per_execution, progress=False,
            callbacks=[timer],
        )  # fmt: skip
    print(json.dumps({"steps_per_second": timer.rate(steps)}))


def measure(case: str, remapping: bool, epochs: int, k: int) -> tuple[float, int]:
    """Steps/s of one fit in a fresh process, and the ``remapper failed`` lines it printed."""
    command = [sys.executable, __file__, "--child", case, "--epochs", str(epochs)]
    command += ["--steps-per-execution", str(k)] + ([] if remapping else ["--no-remapping"])
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{case} failed:\n{done.stderr[-3000:]}")
    rate = json.loads(done.stdout.strip().splitlines()[-1])["steps_per_second"]
    return rate, done.stderr.count("remapper failed")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5, help="epochs per fit, first dropped")
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--no-remapping", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    k, epochs = args.steps_per_execution, max(args.epochs, 2)
    if args.child:
        child(args.child, not args.no_remapping, epochs, k)
        return 0
    cases = [case for case in CASES if args.only in case]
    rates = {(case, on): [] for case in cases for on in (True, False)}
    lines = dict.fromkeys(rates, 0)
    for repeat in range(args.repeats):
        for case in cases:
            for on in (True, False) if repeat % 2 == 0 else (False, True):
                rate, failed = measure(case, on, epochs, k)
                rates[(case, on)].append(rate)
                lines[(case, on)] += failed
                print(f"repeat {repeat + 1}/{args.repeats}  {case:<11} remapper "
                      f"{'on ' if on else 'off'} {rate:8.1f} steps/s", file=sys.stderr,
                      flush=True)  # fmt: skip
    print(f"\nsteps/s, K={k}, median of {args.repeats} fresh process(es) per setting "
          f"({epochs} epochs each, first dropped)")  # fmt: skip
    print(f"{'case':<12}{'remapper on':>18}{'remapper off':>18}{'on / off':>14}"
          f"{'failed lines on/off':>22}")  # fmt: skip
    for case in cases:
        on, off = rates[(case, True)], rates[(case, False)]
        ratios = [a / b for a, b in zip(on, off, strict=True)]
        print(
            f"{case:<12}{statistics.median(on):>12.1f} {spread(on):<5}"
            f"{statistics.median(off):>12.1f} {spread(off):<5}"
            f"{statistics.median(ratios):>8.2f}x {spread(ratios):<5}"
            f"{lines[(case, True)]:>12}/{lines[(case, False)]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
