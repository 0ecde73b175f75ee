"""``steps_per_execution="auto"`` beside every fixed K: beatloop's own, Keras ``fit``'s and
the hand-written loops', per recipe.

Cases (each the models, data and loops of an existing benchmark script):

- ``supervised``, batch 32 and 256 (``engine_overhead.py``): beatloop, Keras ``fit`` and
  a hand-written ``tf.function`` loop at K = 1, 8, 32, 128, and the whole epoch run inside
  one ``tf.function`` (the bound for this model on this machine); beside the default
  ``"auto"`` also ``"auto"`` with ``check_gradients=False`` (the NaN guard on the losses
  only: what neither fit nor the hand-written loop checks, so that pair is like for like);
- ``gan`` (``gan_step.py``) and ``multitask`` (``multitask_step.py``): beatloop and the
  hand-written loop at K = 1, 8, 32, 128.

Before the race one ``"auto"`` fit learns the K ``"auto"`` settles on; beatloop at that
K, fixed, races too (when not among the K above). Per fit the first epoch is dropped
(tracing, and ``"auto"``'s search) and the fastest remaining one kept; figures are
medians over interleaved repeats, the loop order rotated each repeat. Printed: steps/s
per loop, then ``auto`` over beatloop fixed at the K it chose (the same graph and K: what
the search and its choice cost) and over the best fixed K of each kind of loop. The
best of several K is the largest of several noisy medians, so it sits above each K's
own median by about the noise: more repeats shrink that bias.

    python benchmarks/auto_steps.py              # full run
    python benchmarks/auto_steps.py --quick      # smoke run
    python benchmarks/auto_steps.py --only gan   # the cases whose name has "gan"
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import functools
import logging
import re
import statistics
import sys

import engine_overhead
import gan_step
import multitask_step
from common import spread

KS = (1, 8, 32, 128)
WHOLE_EPOCH = 1 << 20  # more steps than any epoch: one call runs the whole pass
TARGETS = {
    "same K": 1.0,
    "beatloop": 1.0,
    "Keras fit": 1.0,
    "hand-written": 1.0,
    "whole epoch": 0.85,
}


def supervised_case(batch_size: int, examples: int):
    """engine_overhead.py's classifier and data at one batch size."""
    x, y = engine_overhead.make_arrays(examples)
    weights = engine_overhead.initial_weights()
    data = engine_overhead.make_dataset(x, y, batch_size)
    steps = -(-examples // batch_size)

    def beatloop_loop(k):
        return lambda epochs: engine_overhead.run_beatloop(data, weights, epochs, k)

    loops = {"beatloop auto": ("auto", beatloop_loop("auto"))}
    loops["beatloop auto, losses only"] = (
        "auto, losses only",
        lambda epochs: engine_overhead.run_beatloop(
            data, weights, epochs, "auto", check_gradients=False
        ),
    )
    for k in KS:
        loops[f"beatloop K={k}"] = ("beatloop", beatloop_loop(k))
    for k in KS:
        run = functools.partial(engine_overhead.run_keras_fit, data, weights)
        loops[f"Keras fit K={k}"] = ("Keras fit", functools.partial(run, steps_per_execution=k))
    for k in KS:
        run = functools.partial(engine_overhead.run_handwritten, data, weights)
        loops[f"hand-written K={k}"] = (
            "hand-written",
            functools.partial(run, steps=None if k == 1 else k),
        )
    run = functools.partial(engine_overhead.run_handwritten, data, weights)
    loops["whole epoch in one tf.function"] = (
        "whole epoch",
        functools.partial(run, steps=WHOLE_EPOCH),
    )
    return steps, loops, beatloop_loop


def recipe_case(module):
    """A race script's beatloop recipe and hand-written loop (``run_beatloop``,
    ``run_handwritten``) on its data."""
    data = module.make_data()
    steps = int(data.cardinality())

    def beatloop_loop(k):
        return functools.partial(module.run_beatloop, data, steps_per_execution=k)

    loops = {"beatloop auto": ("auto", beatloop_loop("auto"))}
    for k in KS:
        loops[f"beatloop K={k}"] = ("beatloop", beatloop_loop(k))
    for k in KS:
        loops[f"hand-written K={k}"] = (
            "hand-written",
            functools.partial(module.run_handwritten, data, steps_per_call=None if k == 1 else k),
        )
    return steps, loops, beatloop_loop


def cases(quick: bool):
    examples = 2048 if quick else engine_overhead.DEFAULTS["examples"]
    return {
        "supervised, batch 32": lambda: supervised_case(32, examples),
        "supervised, batch 256": lambda: supervised_case(256, examples),
        "gan": lambda: recipe_case(gan_step),
        "multitask": lambda: recipe_case(multitask_step),
    }


class ChosenK(logging.Handler):
    """The K each ``"auto"`` run chose, read from beatloop's log line."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.chosen: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"chose (\d+) steps per call", record.getMessage())
        if found:
            self.chosen.append(int(found.group(1)))


def add_chosen_k(loops: dict, beatloop_loop, chosen: ChosenK) -> int | None:
    """Run ``"auto"`` once (4 epochs) to learn the K it settles on; race beatloop fixed at
    that K as the ``"same K"`` loop (the K-loop already there when it is one of ``KS``)."""
    chosen.chosen = []
    loops["beatloop auto"][1](4)
    if not chosen.chosen:
        return None
    k = chosen.chosen[0]
    name = f"beatloop K={k}"
    loops[name] = ("same K", loops[name][1] if name in loops else beatloop_loop(k))
    chosen.chosen = []
    return k


def unlogged(run, chosen: ChosenK):
    """``run``, the K its ``"auto"`` chooses left out of ``chosen``."""

    def quiet(epochs: int) -> list[float]:
        kept = len(chosen.chosen)
        try:
            return run(epochs)
        finally:
            del chosen.chosen[kept:]

    return quiet


def race(steps: int, loops: dict, repeats: int, epochs: int) -> dict[str, list[float]]:
    """Steps/s of each loop per repeat: its fastest epoch after the first."""
    rates: dict[str, list[float]] = {name: [] for name in loops}
    names = list(loops)
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            times = loops[name][1](epochs)
            rates[name].append(steps / min(times[1:]))
            print(
                f"repeat {repeat + 1}/{repeats}  {name:<34} {rates[name][-1]:>10,.0f} steps/s",
                file=sys.stderr,
                flush=True,
            )
    return rates


def report(case: str, steps: int, loops: dict, rates: dict[str, list[float]], chosen) -> None:
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n{case}: steps/s ({steps} steps an epoch), median of {len(rates['beatloop auto'])}")
    print(f"  auto chose K = {', '.join(map(str, chosen)) or 'none (still timing)'}")
    for name, values in rates.items():
        print(f"  {name:<34} {median[name]:>10,.0f} {spread(values)}")
    auto = median["beatloop auto"]
    for kind, target in TARGETS.items():
        named = [name for name, (k, _) in loops.items() if k == kind]
        if kind == "beatloop":  # the same-K loop is one of beatloop's fixed K too
            named += [name for name, (k, _) in loops.items() if k == "same K"]
        if not named:
            continue
        best = max(named, key=median.__getitem__)
        ratio = auto / median[best]
        verdict = "ok" if ratio >= target else "--"
        label = f"auto / best {kind} ({best})"
        if kind in ("same K", "whole epoch"):
            label = f"auto / {'beatloop at the K auto chose' if kind == 'same K' else kind}"
        print(f"  {label:<52} {ratio:5.2f}x  >= {target} {verdict}")
    if "beatloop auto, losses only" in median:  # like for like: fit checks no gradient
        for kind in ("Keras fit", "hand-written"):
            best = max((n for n, (k, _) in loops.items() if k == kind), key=median.__getitem__)
            ratio = median["beatloop auto, losses only"] / median[best]
            label = f"auto, losses only / best {kind} ({best})"
            print(f"  {label:<52} {ratio:5.2f}x  (like for like)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6, help="epochs per fit, first dropped")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2 epochs")
    parser.add_argument("--only", default="", help="the cases whose name has this")
    args = parser.parse_args(argv)
    repeats, epochs = (1, 2) if args.quick else (args.repeats, max(args.epochs, 2))
    chosen = ChosenK()
    logger = logging.getLogger("beatloop")
    logger.addHandler(chosen)
    logger.setLevel(logging.INFO)
    for case, make in cases(args.quick).items():
        if args.only in case:
            steps, loops, beatloop_loop = make()
            add_chosen_k(loops, beatloop_loop, chosen)
            for name, (kind, run) in loops.items():
                if kind == "auto, losses only":  # its K is not the one reported
                    loops[name] = (kind, unlogged(run, chosen))
            rates = race(steps, loops, repeats, epochs)
            report(case, steps, loops, rates, chosen.chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
