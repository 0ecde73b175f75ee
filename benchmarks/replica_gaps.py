"""Where a recipe on two replicas parts from one device, and why.

Each case fits a recipe twice from the same seed (so the same initial weights and data):
on one device, and under a ``MirroredStrategy`` over two logical CPUs, one step per
compiled call, recording every weight after every step. Printed per case: the steps,
the largest weight difference after step 1 and at the end, the step where it first
exceeds 1e-6, the largest one-step growth when it is a jump (tenfold, past 1e-6: a
step where one run took another branch of a kink, e.g. a ReLU's input within round-off
of 0), and the growth (the gap at steps 1, 2, 4, 8, ...). Variants turn one thing off
at a time (a loss term, Adam for SGD, the learning rate, ReLU for GELU) to show what
the gap comes from; ``1 vs 1`` fits one device twice (the process's own
reproducibility). docs/speed.md, "Many devices: where the gaps come from", explains
the figures.

    python benchmarks/replica_gaps.py                 # every case (8-10 minutes on 2 cores)
    python benchmarks/replica_gaps.py --only two_tower,meta

``--defaults`` sets each built-in recipe's gap beside its *noise floor*. Each recipe, at
its default config and data for one epoch (seed 0, K fixed: bits do not depend on K), is
fitted four times, each in a process of its own (oneDNN is chosen before TensorFlow is
imported): on one device and on two replicas with oneDNN on, and on one device twice
more with its sums in another valid order, oneDNN off (``TF_ENABLE_ONEDNN_OPTS=0``) and
Grappler's arithmetic optimizer off (it orders sums' operands by node names). The floor
is the larger of those two one-device gaps, and never below one float32 spacing of the
largest weight (the least two orders of a sum can part by). Printed per recipe: the
largest weight gap and last-epoch loss gap of two replicas, each floor, the ratio gap /
floor, the gap after call 1, 2, 4, ..., its growth per call while the data are
identical, the first call whose data differ (an integer of the recipe state: an action,
an episode's length) and whether the recipe is *chaotic*: a gap of any of the three
grows tenfold or more, to 1e-4 and beyond (round-off carried by Adam stays below 1e-5 in
the other built-ins), so no run of it is reproducible past round-off on other hardware,
one device or many.

``--small`` does the same for the equivalence matrix's cases (the test configuration,
``tests/workers/equivalence_run.py``): the floors ``tests/test_equivalence.py`` holds;
for the cases whose embeddings' rows are summed per id (``ROWS_REVERSED`` there), a third
one-device run with each batch's rows in reverse order reorders those sums too.

    python benchmarks/replica_gaps.py --defaults      # about 9 minutes on 2 cores
    python benchmarks/replica_gaps.py --defaults --only ppo,recommender
    python benchmarks/replica_gaps.py --small         # about 3 minutes
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

if __name__ == "__main__":  # logical devices before TensorFlow runs anything
    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import attrs
import keras
import numpy as np

import beatloop

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

THRESHOLD = 1e-6


class StepWeights(beatloop.Callback):
    """Every weight of every model before the first step and after each call (one step
    a call here), and the logs of each call."""

    def __init__(self):
        self.weights: list[dict[str, np.ndarray]] = []
        self.logs: list[dict[str, float]] = []

    def _snapshot(self, run) -> None:
        self.weights.append(
            {
                f"{name}/{variable.path}": np.array(variable.numpy())
                for name, model in run.models.items()
                for variable in model.weights
            }
        )

    def on_fit_start(self, run) -> None:
        self._snapshot(run)

    def on_execution_end(self, run, steps, logs) -> None:
        self._snapshot(run)
        self.logs.append(dict(logs))


@attrs.frozen
class Case:
    """One comparison: ``fit(**kwargs())`` with a fresh recipe, on one device and on two
    replicas. ``kwargs`` builds the recipe and data anew for each fit."""

    recipe: str
    variant: str
    kwargs: Callable[[], dict]
    steps: int
    control: bool = False  # also fit one device twice


def fit_recorded(case: Case, strategy) -> StepWeights:
    record = StepWeights()
    with strategy.scope() if strategy else contextlib.nullcontext():  # an optimizer given
        kwargs = case.kwargs()
    beatloop.fit(
        **kwargs,
        strategy=strategy,
        steps_per_execution=1,
        callbacks=[record],
        progress=False,
    )
    return record


def gaps(first: StepWeights, second: StepWeights) -> list[float]:
    """The largest weight difference before the first step and after each step."""
    return [
        max(float(np.abs(a[key] - b[key]).max()) for key in a)
        for a, b in zip(first.weights, second.weights, strict=True)
    ]


def summary(case: Case, variant: str, per_step: list[float], seconds: float) -> dict:
    over = next((step for step, gap in enumerate(per_step) if gap > THRESHOLD), None)
    marks = [1]
    while marks[-1] * 2 < len(per_step):
        marks.append(marks[-1] * 2)
    marks.append(len(per_step) - 1)
    # The largest one-step growth, shown when tenfold and past THRESHOLD: a jump (a step
    # that took another branch of a kink, a ReLU's, a sign) rather than steady growth.
    # From step 2: step 1 grows the gap from nothing.
    jump = max(range(2, len(per_step)), key=lambda t: per_step[t] / max(per_step[t - 1], 1e-9))
    return {
        "recipe": case.recipe,
        "variant": variant,
        "steps": len(per_step) - 1,
        "start": per_step[0],
        "first": per_step[1],
        "final": per_step[-1],
        "over": over,
        "jump": (
            f"{jump}: {per_step[jump - 1]:.0e} -> {per_step[jump]:.0e}"
            if per_step[jump] > THRESHOLD and per_step[jump] >= 10 * per_step[jump - 1]
            else "none"
        ),
        "growth": " ".join(f"{per_step[m]:.0e}" for m in dict.fromkeys(marks)),
        "seconds": seconds,
    }


def measure(case: Case, strategy) -> list[dict]:
    started = time.perf_counter()
    one = fit_recorded(case, None)
    two = fit_recorded(case, strategy)
    rows = [summary(case, case.variant, gaps(one, two), time.perf_counter() - started)]
    if case.control:
        again = fit_recorded(case, None)
        rows.append(summary(case, "1 vs 1 device: " + case.variant, gaps(one, again), 0.0))
    return rows


# --- the cases ---------------------------------------------------------------------------


def two_tower_cases() -> list[Case]:
    from two_tower_recipe import TwoTower

    def make(steps=32, **config):
        def kwargs():
            recipe = TwoTower(TwoTower.Config(**config))
            return {"recipe": recipe, "epochs": 1, "seed": 0}

        return kwargs

    def odd(**config):  # batches of 33
        return make(batch_size=33, **config)

    return [
        Case("two_tower", "defaults (Adam, batch 32: shares 16 + 16)", make(), 32, control=True),
        Case("two_tower", "batch 33 (shares 17 + 16, last 1 + 0)", make(batch_size=33), 32),
        Case("two_tower", "batch 33, SGD 0.01", make(batch_size=33, optimizer="sgd"), 32),
        Case("two_tower", "batch 33, rating model with gelu", odd(activation="gelu"), 32),
        Case("two_tower", "batch 33, rating task alone", odd(retrieval_weight=0.0), 32),
        Case("two_tower", "batch 33, retrieval task alone", odd(rating_weight=0.0), 32),
    ]


def smooth_learner(recipe, activation: str) -> Callable:
    """``recipe.build_models`` with the learner's hidden layers' ReLU replaced."""
    build = recipe.build_models

    def build_models(spec):
        models = build(spec)
        for layer in models["learner"].layers[:-1]:
            layer.activation = keras.activations.get(activation)
        return models

    return build_models


def meta_cases() -> list[Case]:
    def make(optimizer=None, activation="relu", **config):
        def kwargs():
            recipe = beatloop.make_recipe("meta", config)
            if activation != "relu":
                recipe.build_models = smooth_learner(recipe, activation)
            fitted = {"recipe": recipe, "epochs": 1, "seed": 0}
            # Training only (no validation), built as fit builds it: a seeded shuffle
            # also depends on the global seed (fit's own data gives the same figures).
            keras.utils.set_random_seed(0)
            fitted["data"] = recipe.default_data(0).train
            if optimizer is not None:
                fitted["optimizers"] = {"adam": optimizer()}
            return fitted

        return kwargs

    return [
        Case("meta", "defaults (Adam)", make(), 400, control=True),
        Case("meta", "SGD 1e-3", make(lambda: keras.optimizers.SGD(1e-3)), 400),
        Case("meta", "learner with gelu (no kink)", make(activation="gelu"), 400),
    ]


def style_transfer_cases() -> list[Case]:
    def make(optimizer=None, **config):
        def kwargs():
            fitted = {"recipe": "style_transfer", "config": config, "epochs": 1, "seed": 0}
            if optimizer is not None:
                fitted["optimizers"] = {"optimizer": optimizer()}
            return fitted

        return kwargs

    return [
        Case("style_transfer", "defaults (Adam 0.02)", make(), 50, control=True),
        Case("style_transfer", "SGD 0.02", make(lambda: keras.optimizers.SGD(0.02)), 50),
        Case("style_transfer", "Adam 2e-4", make(learning_rate=2e-4), 50),
    ]


def byol_cases() -> list[Case]:
    from contrastive_hand import SMALL, digits_data

    def make(rows=216, batch_size=9, sgd=False):
        def kwargs():
            config = {**SMALL, "target": "ema", "pretrain_epochs": 1}
            fitted = {"recipe": "contrastive", "config": config, "epochs": 1, "seed": 3}
            fitted["data"] = digits_data(rows, batch_size, 9)[0]  # pretraining only
            if sgd:
                fitted["optimizers"] = {
                    "pretrain": keras.optimizers.SGD(0.05),
                    "predictor": keras.optimizers.SGD(0.05),
                }
            return fitted

        return kwargs

    return [
        Case("byol", "Adam, batch 9 (shares 5 + 4)", make(), 24, control=True),
        Case("byol", "Adam, batch 9, 217 rows: last batch 1 + 0", make(rows=217), 25),
        Case("byol", "Adam, batch 8 (shares 4 + 4)", make(rows=192, batch_size=8), 24),
        Case("byol", "SGD 0.05, batch 9", make(sgd=True), 24),
    ]


CASES: dict[str, Callable[[], list[Case]]] = {
    "two_tower": two_tower_cases,
    "meta": meta_cases,
    "style_transfer": style_transfer_cases,
    "byol": byol_cases,
}


# --- the built-ins at their defaults, beside the noise floor ------------------------------

#: Each built-in recipe at its defaults (a label, the recipe, the config it is given).
DEFAULTS: dict[str, tuple[str, dict]] = {
    "supervised": ("supervised", {}),
    "gan": ("gan", {}),
    "style_transfer": ("style_transfer", {}),
    "risk_weighted": ("risk_weighted", {}),
    "multitask": ("multitask", {}),
    "contrastive": ("contrastive", {}),
    "contrastive target=ema": ("contrastive", {"target": "ema"}),
    "meta": ("meta", {}),
    "dqn": ("dqn", {}),
    "ppo": ("ppo", {}),
    "recommender": ("recommender", {}),
}

#: Steps per compiled call, so the trace has a point per call: ``ppo``'s are one
#: rollout's updates (E x M = 16); 8 for the others.
STEPS_PER_CALL = {"ppo": 16}

#: The four fits of a recipe: replicas, oneDNN, Grappler's arithmetic optimizer.
RUNS = {
    "one": (1, "1", True),
    "two": (2, "1", True),
    "onednn_off": (1, "0", True),
    "arithmetic_off": (1, "1", False),
}

#: A gap that ends past this, ten times or more what it was after the first call, marks
#: a chaotic recipe (float32 round-off carried by Adam stays below it in every built-in).
CHAOTIC = 1e-4


def grows(gaps: list[float]) -> bool:
    """Whether a run's gap grew past ``CHAOTIC`` from a tenth of it or less."""
    return gaps[-1] >= CHAOTIC and gaps[-1] >= 10 * gaps[0]


class CallSnapshots(beatloop.Callback):
    """The models' weights and the recipe state's integers (actions, episode lengths,
    counters: the data an act made) after each compiled call."""

    def __init__(self):
        self.calls: list[dict[str, np.ndarray]] = []

    def on_execution_end(self, run, steps, logs) -> None:
        snapshot = {
            f"model:{name}/{index}": np.array(weight.numpy())
            for name in sorted(run.models)
            for index, weight in enumerate(run.models[name].weights)
        }
        for name, value in run.recipe_state.items():
            if np.issubdtype(np.asarray(value).dtype, np.integer):
                snapshot[f"data:{name}"] = np.asarray(value)
        self.calls.append(snapshot)


def child(spec: dict, out: str) -> None:
    """One fit at the defaults (``spec``: the recipe, config, replicas, K, Grappler),
    its final variables, every call's snapshot and its last epoch's figures to OUT
    (``.npz``, ``.json``)."""
    sys.path.insert(0, str(TESTS / "workers"))
    from equivalence_run import flat_weights

    if not spec["arithmetic"]:
        tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    strategy = (
        tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if spec["replicas"] == 2 else None
    )
    snapshots = CallSnapshots()
    began = time.perf_counter()
    result = beatloop.fit(
        spec["recipe"],
        config=spec["config"],
        epochs=1,
        seed=0,
        steps_per_execution=spec["steps_per_execution"],
        strategy=strategy,
        callbacks=[snapshots],
        progress=False,
    )
    seconds = time.perf_counter() - began
    arrays = {f"final/{key}": value for key, value in flat_weights(result).items()}
    for number, snapshot in enumerate(snapshots.calls):
        arrays |= {f"call{number:05d}/{key}": value for key, value in snapshot.items()}
    np.savez(out + ".npz", **arrays)
    losses = [beat.name for beat in result.bound.beats if beat.name in result.last_epoch]
    figures = {
        "seconds": seconds,
        "steps": result.steps,
        "calls": len(snapshots.calls),
        "losses": {name: result.last_epoch[name] for name in losses},
    }
    Path(out + ".json").write_text(json.dumps(figures))


def start_child(spec: dict, out: Path, onednn: str) -> subprocess.Popen:
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, __file__, "--child", json.dumps(spec), str(out)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process: subprocess.Popen, what: str) -> None:
    _, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"{what} failed:\n{err.decode()[-3000:]}")


def load(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    with np.load(f"{path}.npz") as archive:
        arrays = {key: archive[key] for key in archive.files}
    return arrays, json.loads(Path(f"{path}.json").read_text())


def largest(first: dict, second: dict, prefix: str) -> float:
    """The largest difference of the arrays whose keys start with ``prefix``."""
    keys = [key for key in first if key.startswith(prefix)]
    assert keys == [key for key in second if key.startswith(prefix)], prefix
    return max(
        (float(np.abs(first[k].astype(np.float64) - second[k]).max(initial=0.0)) for k in keys),
        default=0.0,
    )


def spacing(arrays: dict, prefix: str) -> float:
    """One float32 spacing at the largest magnitude among the arrays under ``prefix``."""
    top = max(float(np.abs(v).max(initial=0.0)) for k, v in arrays.items() if k.startswith(prefix))
    return float(np.spacing(np.float32(top)))


def trace(first: dict, second: dict, calls: int) -> tuple[list[float], int | None]:
    """The weight gap after each call, and the first call whose data (the recipe
    state's integers) differ (numbered from 1), if any."""
    gaps, event = [], None
    for number in range(calls):
        prefix = f"call{number:05d}/"
        gaps.append(largest(first, second, prefix + "model:"))
        if event is None and largest(first, second, prefix + "data:") > 0:
            event = number + 1
    return gaps, event


def growth(gaps: list[float], event: int | None) -> str:
    """The gap's growth per call while the data are the same (up to the call before
    ``event``): the geometric mean and the range of each call's factor, over the calls
    from the first past 1e-7 (round-off itself flickers below it)."""
    end = len(gaps) if event is None else event - 1
    start = next((t for t in range(end) if gaps[t] > 1e-7), None)
    if start is None or end - start < 2:
        return "—"
    factors = [gaps[t] / gaps[t - 1] for t in range(start + 1, end)]
    mean = (gaps[end - 1] / gaps[start]) ** (1 / (end - 1 - start))
    return f"{mean:.2f}x ({min(factors):.2f}-{max(factors):.2f})"


def marks(gaps: list[float]) -> str:
    points = [1]
    while points[-1] * 2 < len(gaps):
        points.append(points[-1] * 2)
    points.append(len(gaps))
    return " ".join(f"{gaps[p - 1]:.0e}" for p in dict.fromkeys(points))


def measure_defaults(label: str, folder: Path) -> dict:
    """The four fits of one recipe at its defaults, one after another, and their gaps."""
    recipe, config = DEFAULTS[label]
    paths = {}
    for run, (replicas, onednn, arithmetic) in RUNS.items():
        spec = {
            "recipe": recipe,
            "config": config,
            "replicas": replicas,
            "arithmetic": arithmetic,
            "steps_per_execution": STEPS_PER_CALL.get(recipe, 8),
        }
        paths[run] = folder / f"{label.replace(' ', '_')}-{run}"
        finish(start_child(spec, paths[run], onednn), f"{label} ({run})")
    loaded = {run: load(path) for run, path in paths.items()}
    one, one_figures = loaded["one"]
    row = {"recipe": label, "steps": one_figures["steps"], "calls": one_figures["calls"]}
    row["seconds"] = {run: figures["seconds"] for run, (_, figures) in loaded.items()}
    for run in ("two", "onednn_off", "arithmetic_off"):
        other, figures = loaded[run]
        assert figures["steps"] == row["steps"], (run, figures["steps"], row["steps"])
        losses = one_figures["losses"]
        row[run] = {
            "weights": largest(one, other, "final/model:"),
            "loss": max(abs(losses[k] - figures["losses"][k]) for k in losses),
            "trace": trace(one, other, row["calls"]),
        }
    row["spacing"] = spacing(one, "final/model:")
    reordered = max(row["onednn_off"]["weights"], row["arithmetic_off"]["weights"])
    row["floor"] = max(reordered, row["spacing"])
    row["loss_floor"] = max(row["onednn_off"]["loss"], row["arithmetic_off"]["loss"])
    row["ratio"] = row["two"]["weights"] / row["floor"]
    row["chaotic"] = any(grows(row[run]["trace"][0]) for run in RUNS if run != "one")
    return row


def print_defaults(rows: list[dict]) -> None:
    header = (
        "recipe", "steps", "two replicas: weights", "loss", "floor: oneDNN off",
        "arithmetic off", "1 spacing", "ratio", "loss floor", "chaotic",
        "growth a call (same data)", "data differ from call", "gap after call 1, 2, 4, ..., last",
    )  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        two = row["two"]
        gaps, event = two["trace"]
        cells = (
            row["recipe"], str(row["steps"]), f"{two['weights']:.1e}", f"{two['loss']:.1e}",
            f"{row['onednn_off']['weights']:.1e}", f"{row['arithmetic_off']['weights']:.1e}",
            f"{row['spacing']:.1e}", f"{row['ratio']:.2g}", f"{row['loss_floor']:.1e}",
            "yes" if row["chaotic"] else "no", growth(gaps, event),
            "never" if event is None else f"{event} of {row['calls']}", marks(gaps),
        )  # fmt: skip
        print("| " + " | ".join(cells) + " |", flush=True)


def defaults(labels: list[str], keep: str | None) -> None:
    began = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for label in labels:
            rows.append(measure_defaults(label, folder))
            row = rows[-1]
            print(
                f"{label}: two replicas {row['two']['weights']:.1e}, floor {row['floor']:.1e}"
                f" ({', '.join(f'{k} {v:.0f} s' for k, v in row['seconds'].items())})",
                file=sys.stderr,
                flush=True,
            )
    print_defaults(rows)
    print(f"\n{time.perf_counter() - began:.0f} s in all", flush=True)


# --- the test configuration's floors ----------------------------------------------------


def small(keep: str | None) -> None:
    """The equivalence matrix's cases: its worker on one device and two replicas, and on
    one device with oneDNN off, with the arithmetic optimizer off and (some cases) with
    each batch's rows reversed, one after another."""
    worker = TESTS / "workers" / "equivalence_run.py"
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(keep or scratch)
        runs = {
            "matrix": ([str(folder / "matrix" / "matrix.json")], "1"),
            "onednn_off": (["--one", str(folder / "onednn_off")], "0"),
            "arithmetic_off": (
                ["--one", str(folder / "arithmetic_off"), "--no-arithmetic-optimization"],
                "1",
            ),
            "rows_reversed": (["--one", str(folder / "rows_reversed"), "--rows-reversed"], "1"),
        }
        for name, (args, onednn) in runs.items():
            (folder / name).mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPP_MIN_LOG_LEVEL": "2"}
            command = [sys.executable, str(worker), *args]
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        matrix = json.loads((folder / "matrix" / "matrix.json").read_text())
        header = (
            "case", "two replicas", "oneDNN off", "arithmetic off", "rows reversed",
            "1 spacing", "floor", "ratio",
        )  # fmt: skip
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for case, figures in matrix["cases"].items():
            one = dict(np.load(folder / "matrix" / f"{case}.npz"))
            gap = max(figures[part] for part in ("weights", "optimizer", "state"))
            floors = []
            for name in ("onednn_off", "arithmetic_off", "rows_reversed"):
                path = folder / name / f"{case}.npz"  # rows reversed: some cases only
                floors.append(largest(one, dict(np.load(path)), "") if path.exists() else None)
            floor = max(*(f for f in floors if f is not None), spacing(one, "model:"))
            shown = [f"{f:.1e}" if f is not None else "—" for f in floors]
            cells = (
                case, f"{gap:.1e}", *shown, f"{spacing(one, 'model:'):.1e}", f"{floor:.1e}",
                f"{gap / floor:.2g}",
            )  # fmt: skip
            print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\n{time.perf_counter() - began:.0f} s in all", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated recipes (cases, or with --defaults labels)")
    parser.add_argument("--defaults", action="store_true", help="the built-ins at their defaults")
    parser.add_argument("--small", action="store_true", help="the equivalence matrix's cases")
    parser.add_argument("--keep", help="keep the runs' weights in this folder")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child[0]), args.child[1])
        return
    if args.defaults:
        defaults(args.only.split(",") if args.only else list(DEFAULTS), args.keep)
        return
    if args.small:
        if args.only:  # the matrix's worker runs its cases in one process
            parser.error("--only does not apply to --small: the matrix runs all its cases")
        small(args.keep)
        return
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    header = (
        "recipe", "variant", "steps", "after step 1", "final", "first > 1e-6",
        "largest jump (step: before -> after)", "growth (steps 1, 2, 4, ..., last)",
    )  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in (args.only or ",".join(CASES)).split(","):
        for case in CASES[name]():
            for row in measure(case, strategy):
                assert row["start"] == 0.0, row  # the same initial weights
                over = "never" if row["over"] is None else str(row["over"])
                print(
                    f"| {row['recipe']} | {row['variant']} | {row['steps']} | "
                    f"{row['first']:.1e} | {row['final']:.1e} | {over} | {row['jump']} | "
                    f"{row['growth']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
