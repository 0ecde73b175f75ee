"""Each epoch timed on its own: beatloop's supervised recipe beside the equal Keras ``fit``.

The two, at the defaults users run (beatloop without a seed: TensorFlow's op
determinism off, as for fit), and beatloop with ``check_gradients=False`` ("losses": its
NaN guard on the losses only, as fit's ``TerminateOnNaN`` would check) and with a seed
("seeded": a repeatable run, op determinism on, its cross-entropy in composite ops)
beside fit with op determinism on too ("fit det") train ``engine_overhead.py``'s
classifier (784-64-10, Adam, a loss mean and sparse categorical accuracy) from the same
weights on the same data, at the same batch size and steps per execution. A callback
notes ``perf_counter`` at each epoch's start and end in all; each fit's first epoch
(tracing) is dropped. Fits alternate (beatloop, fit, losses, seeded, fit det, then the
reverse: the order reverses each round) so that machine noise falls on all; every kept
epoch of a side is pooled. Printed per side: the best and the median epoch, their
ratios fit / beatloop (>= 1.0: beatloop at least as fast; fit det / seeded for the
seeded pair), the spread of the rounds' medians, and the per-call difference in
milliseconds.

    python benchmarks/epoch_times.py                # 7 rounds of 6 epochs (a few minutes)
    python benchmarks/epoch_times.py --quick        # smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import functools
import inspect
import json
import math
import platform
import statistics
import sys
from pathlib import Path

import engine_overhead as eo
import keras
import tensorflow as tf
from common import spread

import beatloop

DEFAULTS = {"rounds": 7, "epochs": 6, "examples": 16384, "batch_size": 32, "steps": 32}
QUICK = {"rounds": 2, "epochs": 3, "examples": 2048}
SIDES = {
    "beatloop": eo.run_beatloop,
    "fit": eo.run_keras_fit,
    "losses": functools.partial(eo.run_beatloop, check_gradients=False),
    "seeded": functools.partial(eo.run_beatloop, seed=0),
    "fit det": functools.partial(eo.run_keras_fit, op_determinism=True),
}
if "check_gradients" not in inspect.signature(beatloop.fit).parameters:  # an older checkout
    del SIDES["losses"]


def measure(settings: argparse.Namespace) -> dict[str, list[list[float]]]:
    """Each side's kept epoch times, one list per round; rounds alternate which side
    goes first."""
    x, y = eo.make_arrays(settings.examples)
    weights = eo.initial_weights()
    dataset = eo.make_dataset(x, y, settings.batch_size)
    rounds: dict[str, list[list[float]]] = {side: [] for side in SIDES}
    for number in range(settings.rounds):
        order = list(SIDES) if number % 2 == 0 else list(SIDES)[::-1]
        for side in order:
            times = SIDES[side](dataset, weights, settings.epochs, settings.steps)[1:]
            rounds[side].append(times)
            print(
                f"round {number + 1}/{settings.rounds}  {side:<9} "
                + " ".join(f"{1000 * t:7.1f}" for t in times)
                + " ms",
                file=sys.stderr,
                flush=True,
            )
    return rounds


def summary(rounds: dict[str, list[list[float]]], calls: int) -> dict:
    """Best and median epoch per side (every kept epoch pooled), the spread of the
    rounds' medians, fit / beatloop ratios and beatloop's extra milliseconds per call."""
    sides = {}
    for side, times in rounds.items():
        pooled = [t for epochs in times for t in epochs]
        sides[side] = {
            "best": min(pooled),
            "median": statistics.median(pooled),
            "spread": spread([statistics.median(epochs) for epochs in times]),
        }
    ours, theirs, losses = sides["beatloop"], sides["fit"], sides.get("losses")
    seeded, fit_det = sides.get("seeded"), sides.get("fit det")
    return {
        "sides": sides,
        "ratios": {key: theirs[key] / ours[key] for key in ("best", "median")},
        "ratios_losses_only": losses and {k: theirs[k] / losses[k] for k in ("best", "median")},
        "ratios_seeded": seeded and {k: fit_det[k] / seeded[k] for k in ("best", "median")},
        "per_call_ms": {
            key: 1000 * (ours[key] - theirs[key]) / calls for key in ("best", "median")
        },
    }


def print_report(settings, calls: int, figures: dict) -> None:
    """The two sides' best and median epochs, side by side, then the ratios."""
    steps = math.ceil(settings.examples / settings.batch_size)
    print(
        f"\nepoch times (ms), batch {settings.batch_size}, steps_per_execution "
        f"{settings.steps}: {steps} steps = {calls} compiled calls an epoch; "
        f"{settings.rounds} round(s) of {settings.epochs} epochs a fit, first dropped"
    )
    print(f"{'':<10}{'best':>10}{'median':>10}  spread of the rounds' medians")
    for side, values in figures["sides"].items():
        print(
            f"{side:<10}{1000 * values['best']:>10.1f}{1000 * values['median']:>10.1f}  "
            f"{values['spread']}"
        )
    ratios, extra = figures["ratios"], figures["per_call_ms"]
    print(f"{'fit / beatloop':<10}{ratios['best']:>9.3f}x{ratios['median']:>9.3f}x  target >= 1.0x")
    losses = figures["ratios_losses_only"]
    if losses:  # not for a checkout without check_gradients
        print(
            f"{'fit / losses':<14}{losses['best']:>5.3f}x{losses['median']:>9.3f}x  "
            "(beatloop's guard on the losses only)"
        )
    seeded = figures.get("ratios_seeded")
    if seeded:
        print(
            f"fit det / seeded {seeded['best']:.3f}x{seeded['median']:>9.3f}x  "
            "(both with op determinism on, as a seed sets it)"
        )
    print(
        f"{'ms a call':<10}{extra['best']:>+10.3f}{extra['median']:>+10.3f}  "
        "(beatloop minus fit; negative: beatloop faster)"
    )


def write_json(path: Path, settings, rounds, figures) -> None:
    """The settings, versions, every kept epoch and the summary."""
    record = {
        "settings": {key: getattr(settings, key) for key in DEFAULTS},
        "versions": {
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "beatloop": beatloop.__version__,
        },
        "epoch_seconds": rounds,
        **figures,
    }
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line settings; ``--quick`` changes the defaults, explicit flags still win."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help=f"fits per side ({DEFAULTS['rounds']})")
    parser.add_argument(
        "--epochs", type=int, help=f"epochs per fit, first dropped ({DEFAULTS['epochs']})"
    )
    parser.add_argument("--examples", type=int, help=f"per epoch ({DEFAULTS['examples']})")
    parser.add_argument("--batch-size", type=int, help=f"({DEFAULTS['batch_size']})")
    parser.add_argument(
        "--steps", type=int, help=f"steps_per_execution, both sides ({DEFAULTS['steps']})"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 3 epochs")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    for name, default in {**DEFAULTS, **(QUICK if args.quick else {})}.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first epoch is dropped)")
    if min(args.rounds, args.examples, args.batch_size, args.steps) < 1:
        parser.error("--rounds, --examples, --batch-size and --steps must be positive")
    return args


def main(argv: list[str] | None = None) -> dict:
    """Time both sides, print the report, optionally write the JSON record."""
    settings = parse_args(argv)
    rounds = measure(settings)
    calls = math.ceil(math.ceil(settings.examples / settings.batch_size) / settings.steps)
    figures = summary(rounds, calls)
    print_report(settings, calls, figures)
    if settings.json is not None:
        write_json(settings.json, settings, rounds, figures)
    return figures


if __name__ == "__main__":
    main()
