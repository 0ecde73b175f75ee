"""The GPU check: every built-in recipe on one GPU (float32, mixed_float16, XLA) and on
a MirroredStrategy over all GPUs, with supervised beside Keras ``fit`` and hand-written
``tf.function`` loops, and how far one device and the strategy end apart.

    python benchmarks/gpu_check.py                       # every recipe, on the GPUs
    python benchmarks/gpu_check.py --recipes supervised,gan --steps 100 --repeats 5
    python benchmarks/gpu_check.py --device cpu          # dry run on the CPU

Each recipe trains on its built-in data, read once and kept in memory unshuffled
(``--steps`` batches of ``--batch`` examples, where the recipe's ``batch_size`` is the
built-in data's; a recipe whose loop makes its data gets ``--steps`` steps an epoch),
``--epochs`` epochs a fit, ``--steps-per-execution`` steps a call, seed 0. Figures:
examples/s (and steps/s) of the fastest epoch of training time after the first
(``TrainingTimer``), median of ``--repeats`` repeats, the cases rotated each repeat,
± half the range. The strategy splits the same global batch over the GPUs. Equivalence:
the largest weight difference between the float32 one-device run and the strategy's run
after their first epoch (``--steps`` steps, same seed, same data), beside how far
training moved the weights. The supervised comparison trains ``engine_overhead.py``'s
784-64-10 classifier on its synthetic data with its loops (imported: beatloop, Keras
``fit``, a compiled step per batch, K steps per compiled call).

Without a GPU visible to TensorFlow (tensorflow-cpu, no CUDA device) it prints one line
and exits 0. ``--device cpu`` runs the same measuring code on the CPU: by default one
recipe (supervised), 4 steps an epoch, 2 epochs, one repeat, batch 32, the strategy a
MirroredStrategy over two logical CPUs (its tests run this). Exit status 1 when a case
failed (every case is still run and reported). A recipe whose batch has fewer
examples than there are replicas (``style_transfer``'s one image pair, ``dqn``'s
one-tick batches) runs under the strategy too: a replica with no rows computes nothing
(``style_transfer``), acts run once for all replicas (``dqn``).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import functools
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
import tensorflow as tf

GPU_DEFAULTS = {"recipes": None, "steps": 50, "epochs": 4, "repeats": 3, "batch": 256}
CPU_DEFAULTS = {"recipes": "supervised", "steps": 4, "epochs": 2, "repeats": 1, "batch": 32}
OWN_BATCH = {"meta", "style_transfer", "dqn"}
VARIANTS = ("float32", "mixed_float16", "XLA", "mirrored")
SUPERVISED_LOOPS = ("beatloop", "Keras fit", "tf.function step", "tf.function K steps")


@attrs.frozen
class Devices:
    """Where the check runs: ``kind`` ("GPU" or "CPU"), how many devices the strategy
    spans, the strategy's device names and a line describing them."""

    kind: str
    names: tuple[str, ...]
    description: str

    def strategy(self) -> tf.distribute.Strategy:
        """The one MirroredStrategy over the devices, made once: strategies made anew in
        one process number their collective ops from the same keys, and a later run's
        all-reduce then meets an earlier run's shapes ("Shape mismatch in the collective
        instance": measured over two logical CPUs, the second recipe on)."""
        return _strategy(self.names)


@functools.cache
def _strategy(names: tuple[str, ...]) -> tf.distribute.Strategy:
    return tf.distribute.MirroredStrategy(list(names))


def find_devices(device: str) -> Devices | None:
    """The devices to run on, set up before any op runs; ``None``: no GPU to check."""
    if device == "cpu":
        tf.config.set_visible_devices([], "GPU")
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
        return Devices("CPU", ("/cpu:0", "/cpu:1"), "CPU (dry run; the strategy: 2 logical CPUs)")
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)  # the loops share the GPUs
    details = [
        tf.config.experimental.get_device_details(gpu).get("device_name", "?") for gpu in gpus
    ]
    names = tuple(f"/gpu:{index}" for index in range(len(gpus)))
    return Devices("GPU", names, f"{len(gpus)} GPU(s): {', '.join(sorted(set(details)))}")


# --- data ---------------------------------------------------------------------------------


@functools.cache
def recipe_data(name: str, batch: int, steps: int, seed: int = 0):
    """``(config, data, steps_per_epoch, rows)`` for a recipe: its built-in training data read
    once, ``steps`` batches kept in memory and repeated (each epoch those batches),
    unshuffled (a reshuffling data set would
    be shuffled anew under a strategy), batch dimension unknown as after ``batch(n)``;
    ``data=None`` for a recipe whose loop makes its data (endless one-example ticks);
    ``rows``: examples a batch."""
    from beatloop.fitting import make_recipe

    recipe = make_recipe(name, None)
    config = {"batch_size": batch} if _builtin_batch_size(recipe) else {}
    train = make_recipe(name, config).default_data(seed).train
    if train.cardinality() == tf.data.INFINITE_CARDINALITY:
        return config, None, steps, 1
    first = tf.nest.flatten(next(iter(train)))[0]
    size = int(first.shape[0])
    count = steps * size
    examples = next(iter(train.repeat().unbatch().take(count).batch(count)))
    data = tf.data.Dataset.from_tensor_slices(examples).batch(size).repeat()  # epochs: steps
    return config, data.prefetch(tf.data.AUTOTUNE), steps, size


def _builtin_batch_size(recipe) -> bool:
    """Whether ``--batch`` sets the recipe's ``batch_size``: its built-in data batch
    examples (not ``meta``'s tasks, ``style_transfer``'s one image pair or ``dqn``'s
    transitions sampled from its buffer, which keep their own)."""
    return recipe.name not in OWN_BATCH and "batch_size" in attrs.fields_dict(type(recipe.config))


# --- measuring ------------------------------------------------------------------------------


class Skipped(Exception):
    """A case that cannot run here (why: its message)."""


@attrs.frozen
class Measure:
    """One fit: examples/s and steps/s of its fastest epoch after the first; the weights
    before training and after the first epoch (``None`` where not kept)."""

    examples_rate: float
    steps_rate: float
    start: dict | None = None
    first_epoch: dict | None = None


def weights_of(models) -> dict[str, np.ndarray]:
    return {
        f"{name}/{index}": np.array(weight)
        for name in sorted(models)
        for index, weight in enumerate(models[name].get_weights())
    }


def largest_difference(first: dict, second: dict) -> float:
    if sorted(first) != sorted(second):
        raise ValueError("the runs hold different weights")
    return max(float(np.abs(first[key] - second[key]).max()) for key in first)


def timer_callbacks():
    """A ``TrainingTimer`` and a callback keeping the weights at the start and after the
    first epoch."""
    import beatloop

    class FirstEpoch(beatloop.Callback):
        start = first = None

        def on_fit_start(self, run):
            self.start = weights_of(run.models)

        def on_epoch_end(self, run, epoch, logs):
            if self.first is None:
                self.first = weights_of(run.models)

    return beatloop.TrainingTimer(), FirstEpoch()


def fastest(timer) -> tuple[float, float]:
    """(examples/s, steps/s) of the fastest epoch after the first."""
    epochs = list(zip(timer.epoch_examples, timer.epoch_steps, timer.epoch_seconds, strict=True))
    examples, steps, seconds = min(epochs[1:] or epochs, key=lambda e: e[2] / max(e[1], 1))
    return examples / seconds, steps / seconds


def fit_recipe(name: str, variant: str, settings, devices: Devices) -> Measure:
    """One beatloop fit of the recipe's variant on the kept data."""
    import beatloop

    config, data, steps, _rows = recipe_data(name, settings.batch, settings.steps)
    extra = {
        "float32": {},
        "mixed_float16": {"precision": "mixed_float16"},
        "XLA": {"jit_compile": True},
        "mirrored": {"strategy": devices.strategy()},
    }[variant]
    timer, weights = timer_callbacks()
    result = beatloop.fit(
        name,
        data=None if data is None else (data, None),
        config=config,
        epochs=settings.epochs,
        seed=0,
        steps_per_execution=settings.steps_per_execution,
        steps_per_epoch=steps,
        progress=False,
        callbacks=[timer, weights],
        **extra,
    )
    if result.steps != settings.epochs * steps:
        raise RuntimeError(f"ran {result.steps} steps, not {settings.epochs} x {steps}")
    return Measure(*fastest(timer), weights.start, weights.first)


def supervised_loop(loop: str, settings) -> Measure:
    """One of ``engine_overhead.py``'s loops on its data, ``--steps`` batches an epoch."""
    import engine_overhead as eo

    examples = settings.steps * settings.batch
    x, y = eo.make_arrays(examples)
    dataset = eo.make_dataset(x, y, settings.batch)
    weights = eo.initial_weights()
    k = settings.steps_per_execution
    run = {
        "beatloop": lambda: eo.run_beatloop(dataset, weights, settings.epochs, k),
        "Keras fit": lambda: eo.run_keras_fit(dataset, weights, settings.epochs, k),
        "tf.function step": lambda: eo.run_handwritten(dataset, weights, settings.epochs, None),
        "tf.function K steps": lambda: eo.run_handwritten(dataset, weights, settings.epochs, k),
    }[loop]
    times = run()
    seconds = min(times[1:] or times)
    return Measure(examples / seconds, settings.steps / seconds)


@attrs.frozen
class Case:
    """A measured case: ``(recipe, what)``, and how to run it once."""

    recipe: str
    what: str
    run: Callable[[], Measure]


def cases(settings, devices: Devices) -> list[Case]:
    found = []
    for name in settings.recipes:
        for variant in VARIANTS:
            found.append(
                Case(name, variant, lambda n=name, v=variant: fit_recipe(n, v, settings, devices))
            )
        if name == "supervised":
            for loop in SUPERVISED_LOOPS:
                found.append(
                    Case("784-64-10", loop, lambda loop=loop: supervised_loop(loop, settings))
                )
    return found


def measure(settings, devices: Devices, log) -> tuple[dict, dict, dict]:
    """Every case ``--repeats`` times, each recipe's cases rotated each repeat. Returns
    the measures by case (a list per repeat), the first repeat's measures, and each
    failed case's error."""
    every = cases(settings, devices)
    by_recipe: dict[str, list[Case]] = {}
    for case in every:
        by_recipe.setdefault(case.recipe, []).append(case)
    measures: dict[tuple, list[Measure]] = {(c.recipe, c.what): [] for c in every}
    first: dict[tuple, Measure] = {}
    failed: dict[tuple, str] = {}  # and the skipped, their reasons beginning "skipped: "
    for repeat in range(settings.repeats):
        for group in by_recipe.values():
            shift = repeat % len(group)
            for case in group[shift:] + group[:shift]:
                key = (case.recipe, case.what)
                if key in failed:
                    continue
                start = time.perf_counter()
                try:
                    value = case.run()
                except Skipped as why:
                    failed[key] = f"skipped: {why}"
                    log(f"repeat {repeat + 1}  {case.recipe:<14} {case.what:<20} skipped: {why}")
                    continue
                except Exception as error:  # a case that fails is reported, the rest run
                    failed[key] = f"{type(error).__name__}: {error}".split("\n")[0][:300]
                    log(f"repeat {repeat + 1}  {case.recipe:<14} {case.what:<20} FAILED")
                    log(traceback.format_exc(limit=-3))
                    continue
                measures[key].append(value)
                first.setdefault(key, value)
                log(
                    f"repeat {repeat + 1}/{settings.repeats}  {case.recipe:<14} "
                    f"{case.what:<20} {value.examples_rate:12,.0f} examples/s "
                    f"{value.steps_rate:10,.1f} steps/s  ({time.perf_counter() - start:.1f} s)"
                )
    return measures, first, failed


# --- reporting -------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    from common import spread as half_range

    return half_range(values)


def cell(values: list[float], failed: str | None) -> str:
    if failed:
        return "n/a" if failed.startswith("skipped") else "failed"
    if not values:
        return "-"
    return f"{statistics.median(values):,.0f} {spread(values)}".strip()


def report(settings, devices: Devices, measures, first, failed) -> dict:
    """Print the tables; return the figures (for ``--json``)."""
    strategy = f"mirrored ({len(devices.names)} {devices.kind}s)"
    heads = {"float32": "float32", "mixed_float16": "mixed_float16", "XLA": "float32 + XLA",
             "mirrored": strategy}  # fmt: skip
    print(
        f"\n{devices.description}; batch {settings.batch} (meta, style_transfer, dqn: their own), "
        f"{settings.steps} steps an epoch, {settings.epochs} epochs a fit, "
        f"K={settings.steps_per_execution}; fastest epoch after the first, median of "
        f"{settings.repeats} repeat(s) (± half range); the strategy splits the same global batch"
    )
    figures: dict = {"devices": devices.description, "settings": vars(settings).copy()}
    for unit, attribute in (("examples/s", "examples_rate"), ("steps/s", "steps_rate")):
        print(f"\n{unit:<14}" + "".join(f"{heads[v]:>22}" for v in VARIANTS))
        for name in settings.recipes:
            cells = []
            for variant in VARIANTS:
                values = [getattr(m, attribute) for m in measures[name, variant]]
                cells.append(cell(values, failed.get((name, variant))))
                figures.setdefault(unit, {}).setdefault(name, {})[variant] = values
            print(f"{name:<14}" + "".join(f"{c:>22}" for c in cells))

    if "supervised" in settings.recipes:
        print(
            f"\nsupervised beside Keras fit and hand-written loops: engine_overhead.py's "
            f"784-64-10 classifier, batch {settings.batch}, K={settings.steps_per_execution}, "
            f"one {devices.kind}"
        )
        rates = {}
        for loop in SUPERVISED_LOOPS:
            values = [m.examples_rate for m in measures["784-64-10", loop]]
            rates[loop] = statistics.median(values) if values else None
            print(f"{loop:<24}{cell(values, failed.get(('784-64-10', loop))):>22} examples/s")
        figures["supervised_loops"] = rates
        if rates["beatloop"] and rates["Keras fit"]:
            print(f"{'beatloop / Keras fit':<24}{rates['beatloop'] / rates['Keras fit']:>21.2f}x")
        handwritten = [rates[k] for k in SUPERVISED_LOOPS[2:] if rates[k]]
        if rates["beatloop"] and handwritten:
            ratio = rates["beatloop"] / max(handwritten)
            print(f"{'beatloop / best hand-written':<24}{ratio:>21.2f}x")

    print(
        f"\nequivalence: one {devices.kind} (float32) vs {strategy}, after the first epoch "
        f"({settings.steps} steps, seed 0, same data): largest weight difference; the "
        "largest move training made, for scale"
    )
    if len(devices.names) == 1:
        print(
            f"(one {devices.kind}: the strategy has one replica, which takes whole batches "
            "read as without a strategy; its run is expected to match bit for bit)"
        )
    print(f"{'recipe':<14}{'max |difference|':>18}{'max |move|':>14}")
    figures["equivalence"] = {}
    for name in settings.recipes:
        one, many = first.get((name, "float32")), first.get((name, "mirrored"))
        if one is None or many is None or one.first_epoch is None or many.first_epoch is None:
            print(f"{name:<14}{'-':>18}{'-':>14}  (a run failed or was skipped)")
            continue
        difference = largest_difference(one.first_epoch, many.first_epoch)
        move = largest_difference(one.first_epoch, one.start)
        figures["equivalence"][name] = {"max_difference": difference, "max_move": move}
        print(f"{name:<14}{difference:>18.2e}{move:>14.2e}")

    skipped = {key: why for key, why in failed.items() if why.startswith("skipped")}
    failed = {key: why for key, why in failed.items() if key not in skipped}
    for title, cases in (("skipped (n/a)", skipped), ("failed", failed)):
        if cases:
            print(f"\n{len(cases)} case(s) {title}:")
            for (name, what), message in cases.items():
                print(f"  {name} {what}: {message}")
    figures["failed"] = {f"{name} {what}": message for (name, what), message in failed.items()}
    figures["skipped"] = {f"{name} {what}": why for (name, what), why in skipped.items()}
    return figures


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                        help="cpu: a dry run of the same code on the CPU")  # fmt: skip
    parser.add_argument("--recipes", help="comma-separated (default: every built-in recipe)")
    parser.add_argument("--steps", type=int, help="steps an epoch (gpu 50, cpu 4)")
    parser.add_argument("--epochs", type=int, help="epochs a fit, the first dropped (gpu 4)")
    parser.add_argument("--repeats", type=int, help="fits per case (gpu 3, cpu 1)")
    parser.add_argument("--batch", type=int, help="batch size (gpu 256, cpu 32)")
    parser.add_argument("--steps-per-execution", type=int, default=32)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    for name, default in (CPU_DEFAULTS if args.device == "cpu" else GPU_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.epochs < 2 or min(args.steps, args.repeats, args.batch) < 1:
        parser.error("--epochs must be at least 2; --steps, --repeats, --batch positive")
    return args


def main(argv=None) -> int:
    settings = parse_args(argv)
    devices = find_devices(settings.device)
    if devices is None:
        print(
            "gpu_check: TensorFlow sees no GPU here (no CUDA device, or tensorflow-cpu): "
            "nothing measured; --device cpu runs the check's code on the CPU"
        )
        return 0
    import beatloop

    known = beatloop.recipes()
    wanted = settings.recipes.split(",") if settings.recipes else [
        name for name in BUILT_IN if name in known
    ]  # fmt: skip
    unknown = [name for name in wanted if name not in known]
    if unknown:
        print(f"gpu_check: unknown recipe(s) {', '.join(unknown)}; known: {', '.join(known)}")
        return 2
    settings.recipes = wanted

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    measures, first, failed = measure(settings, devices, log)
    figures = report(settings, devices, measures, first, failed)
    if settings.json is not None:
        figures["settings"]["json"] = str(settings.json)
        settings.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    return 1 if figures["failed"] else 0


BUILT_IN = (
    "supervised", "gan", "style_transfer", "risk_weighted", "multitask", "contrastive", "meta",
    "dqn",
)  # fmt: skip

if __name__ == "__main__":
    sys.exit(main())
