"""The equivalence matrix's runs, in a process of their own (logical devices must be set
before TensorFlow runs anything): every case of ``CASES`` trained on one device and on a
``MirroredStrategy`` over two logical CPUs, same seed, shuffled data, a batch whose
replica shares differ. ``python equivalence_run.py OUT [CASE ...]`` writes, per case,
the largest difference of every model weight and optimizer variable, of the recipe
state, how far training moved the weights, and the steps each run took, to OUT (JSON),
and each case's one-device weights to OUT's folder as ``CASE.npz``.

``python equivalence_run.py --worker OUT_DIR CASE ...`` is one worker of a
``MultiWorkerMirroredStrategy`` run (its ``TF_CONFIG`` set by the caller): it trains each
case there and writes its weights to ``OUT_DIR/CASE.npz``.

``python equivalence_run.py --one OUT_DIR [--no-arithmetic-optimization | --rows-reversed]
[CASE ...]`` trains each case on one device alone and writes its weights to
``OUT_DIR/CASE.npz``: run with oneDNN off, the arithmetic optimizer off, or (the cases of
``ROWS_REVERSED``) each batch's rows in reverse order, it measures the cases' noise
floors (``benchmarks/replica_gaps.py --small``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder

import numpy as np
import tensorflow as tf

#: Each case: the recipe and what ``beatloop.fit`` is given beside it. Batch sizes are odd,
#: so every global batch is cut into shares that differ by a row (17 + 16, 13 + 12).
CASES: dict[str, dict] = {
    "supervised": {"recipe": "supervised", "config": {"batch_size": 33}, "steps_per_epoch": 24},
    "supervised_k1": {
        "recipe": "supervised",
        "config": {"batch_size": 33},
        "steps_per_epoch": 24,
        "steps_per_execution": 1,
    },
    "gan": {"recipe": "gan", "config": {"batch_size": 33}, "steps_per_epoch": 24},
    "style_transfer": {
        "recipe": "style_transfer",
        "config": {"image_size": 32, "steps_per_epoch": 24},
    },
    "risk_weighted_none": {
        "recipe": "risk_weighted",
        "config": {"batch_size": 33, "clip": "none"},
        "epochs": 2,
    },
    "risk_weighted_norm": {
        "recipe": "risk_weighted",
        "config": {"batch_size": 33, "clip": "norm"},
        "epochs": 2,
    },
    "risk_weighted_global_norm": {
        "recipe": "risk_weighted",
        "config": {"batch_size": 33, "clip": "global_norm"},
        "epochs": 2,
    },
    "multitask": {"recipe": "multitask", "config": {"batch_size": 33}, "steps_per_epoch": 24},
    "multitask_pcgrad": {
        "recipe": "multitask",
        "config": {"batch_size": 33, "combine": "pcgrad"},
        "steps_per_epoch": 24,
    },
    "contrastive": {
        "recipe": "contrastive",
        "config": {"batch_size": 33, "pretrain_epochs": 1},
        "epochs": 2,
        "steps_per_epoch": 12,
    },
    "meta": {"recipe": "meta", "config": {"batch_size": 25}, "steps_per_epoch": 24},
    "dqn": {"recipe": "dqn", "config": {"steps_per_epoch": 48}},
    # The TFRS multitask two-tower model (tests/two_tower_recipe.py): 31 batches of 33,
    # then one row (shares 1 + 0); Adam on ReLUs, and the same with GELUs.
    "two_tower": {"recipe": "two_tower", "config": {"batch_size": 33}},
    "two_tower_gelu": {"recipe": "two_tower", "config": {"batch_size": 33, "activation": "gelu"}},
    # A beat drawing noise from the run's generator inside a conditional.
    "noisy": {"recipe": "noisy", "steps_per_epoch": 24},
    # One agent (5 cart-poles, rollouts of 12 steps collected once for both replicas),
    # minibatches of 15 rows split 8 + 7, clipped global-norm gradients, falling rate.
    "ppo": {
        "recipe": "ppo",
        "config": {"envs": 5, "rollout_steps": 12, "rollouts_per_epoch": 2, "anneal_rollouts": 4},
        "epochs": 2,
    },
    # The built-in two towers: in-batch softmax over the gathered items with log-Q,
    # recall@K over every item, DWA's weights set from the epochs' logged losses.
    "recommender": {
        "recipe": "recommender",
        "config": {
            "batch_size": 33,
            "users": 60,
            "items": 40,
            "ratings_per_user": 20,
            "weighting": "dwa",
        },
        "epochs": 3,
    },
}


#: Cases whose batches, rows reversed, make the same run with its sums in another order
#: (no random draw is tied to a row), and whose embeddings' gradients are summed per id
#: over the batch's rows: a sum neither oneDNN nor the arithmetic optimizer reorders,
#: which Adam carries on wherever an id's rows nearly cancel.
ROWS_REVERSED = ("two_tower", "two_tower_gelu", "recommender")


def flat_weights(result) -> dict[str, np.ndarray]:
    """Every model weight, optimizer variable and recipe state variable of a finished
    run, by a name that is the same in both runs."""
    arrays = {}
    for name in sorted(result.models):
        for index, weight in enumerate(result.models[name].weights):
            arrays[f"model:{name}/{index}"] = np.array(weight.numpy())
    for name in sorted(result.optimizers):
        for index, variable in enumerate(result.optimizers[name].variables):
            arrays[f"optimizer:{name}/{index}"] = np.array(variable.numpy())
    for name, variable in sorted((result.bound.state or {}).items()):
        arrays[f"state:{name}"] = np.array(variable.numpy())
    return arrays


def largest(first: dict, second: dict, prefix: str) -> float:
    keys = [key for key in first if key.startswith(prefix)]
    assert sorted(keys) == sorted(k for k in second if k.startswith(prefix)), prefix
    if not keys:
        return 0.0
    gaps = [np.abs(first[k].astype(np.float64) - second[k].astype(np.float64)) for k in keys]
    return float(max(gap.max() if gap.size else 0.0 for gap in gaps))


def recipe_of(name: str):
    """A built-in recipe's name, or a test recipe's class."""
    if name == "two_tower":
        from two_tower_recipe import TwoTower

        return TwoTower
    if name == "noisy":
        return noisy()
    return name


def noisy(every: int = 1):
    """Two beats on one classifier, the second (every ``every`` steps) on inputs with
    noise drawn from ``models.random`` inside a conditional of the loss's own."""
    import keras

    import beatloop
    from beatloop.datasets import digits

    def cross_entropy(models, x, y):
        logits = models["model"](x)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.cast(y, tf.int32), logits=logits
            )
        )

    class NoisyEvery(beatloop.Recipe):
        name, batch_keys = "noisy", {"x": 2, "y": 1}

        def default_data(self, seed):
            return digits(seed, 33)

        def build_models(self, spec):
            dense = keras.layers.Dense
            return {"model": keras.Sequential([keras.Input((64,)), dense(16, "relu"), dense(10)])}

        def build_optimizers(self):
            return {"clean": keras.optimizers.SGD(0.05), "noisy": keras.optimizers.Adam(1e-3)}

        def losses(self):
            return {"clean": self.clean, "noisy": self.noisy}

        def clean(self, models, batch):
            return cross_entropy(models, batch["x"], batch["y"])

        def noisy(self, models, batch):
            x = batch["x"]
            noise = tf.cond(
                tf.reduce_max(x) >= 0.0,  # always: a draw inside a conditional
                lambda: models.random.normal(tf.shape(x)),
                lambda: tf.zeros_like(x),
            )
            return cross_entropy(models, x + 0.5 * noise, batch["y"])

        def schedule(self):
            return beatloop.Schedule(
                [
                    beatloop.Beat("clean", "clean", "model"),
                    beatloop.Beat("noisy", "noisy", "model", every=every),
                ],
                shared=("model",),
            )

    return NoisyEvery


def run_case(beatloop, case: dict, strategy, callbacks=(), rows_reversed=False):
    settings = {key: value for key, value in case.items() if key != "recipe"}
    settings.setdefault("epochs", 1)
    settings.setdefault("steps_per_execution", 4)
    if rows_reversed:
        settings["data"] = reversed_rows
    return beatloop.fit(
        recipe_of(case["recipe"]),
        seed=0,
        progress=False,
        strategy=strategy,
        callbacks=callbacks,
        **settings,
    )


def reversed_rows(recipe, seed: int):
    """The recipe's own data with the rows of every training batch in reverse order."""
    import attrs

    split = recipe.default_data(seed)
    flipped = split.train.map(lambda batch: {k: tf.reverse(v, [0]) for k, v in batch.items()})
    return attrs.evolve(split, train=flipped)


def start_weights(beatloop) -> tuple[object, dict]:
    """A callback keeping the models' weights as the run starts, and where it keeps them."""
    kept: dict[str, np.ndarray] = {}

    class Start(beatloop.Callback):
        def on_fit_start(self, run) -> None:
            for name in sorted(run.models):
                for index, weight in enumerate(run.models[name].weights):
                    kept[f"model:{name}/{index}"] = np.array(weight.numpy())

    return Start(), kept


def main(out: str, names: list[str]) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import beatloop

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {"replicas": strategy.num_replicas_in_sync, "cases": {}}
    for name in names or list(CASES):
        began = time.perf_counter()
        case = CASES[name]
        callback, start = start_weights(beatloop)
        one = run_case(beatloop, case, None, [callback])
        first = flat_weights(one)
        two = run_case(beatloop, case, strategy)
        second = flat_weights(two)
        np.savez(Path(out).parent / f"{name}.npz", **first)
        report["cases"][name] = {
            "weights": largest(first, second, "model:"),
            "optimizer": largest(first, second, "optimizer:"),
            "state": largest(first, second, "state:"),
            "moved": largest(first, start, "model:"),
            "worst": max(first, key=lambda k: largest({k: first[k]}, {k: second[k]}, k)),
            "steps": [one.steps, two.steps],
            "seconds": round(time.perf_counter() - began, 1),
        }
        print(name, report["cases"][name], flush=True)
    try:  # a beat every other step: refused on two replicas, before the first step
        beatloop.fit(noisy(every=2), seed=0, progress=False, strategy=strategy, epochs=1)
        report["every"] = None
    except beatloop.BeatloopError as error:
        report["every"] = {"class": type(error).__name__, "message": str(error)}
    Path(out).write_text(json.dumps(report, indent=1))


def one_device(out_dir: str, names: list[str]) -> None:
    """Each case on one device alone, its weights to ``OUT_DIR/CASE.npz``: run under
    another ``TF_ENABLE_ONEDNN_OPTS`` (or ``--no-arithmetic-optimization``, or
    ``--rows-reversed`` for the cases of ``ROWS_REVERSED`` alone), the same run with its
    sums in another valid order, the noise floor of the replicas' gap."""
    cpu = tf.config.list_physical_devices("CPU")[0]  # the devices of ``main``'s process
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    rows_reversed = bool(names) and names[0] == "--rows-reversed"
    if names and names[0] == "--no-arithmetic-optimization":
        tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    if names and names[0].startswith("--"):
        names = names[1:]
    import beatloop

    for name in names or list(CASES):
        if rows_reversed and name not in ROWS_REVERSED:
            continue
        result = run_case(beatloop, CASES[name], None, rows_reversed=rows_reversed)
        np.savez(Path(out_dir) / f"{name}.npz", **flat_weights(result))


def worker(out_dir: str, names: list[str]) -> None:
    import beatloop

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    for name in names:
        result = run_case(beatloop, CASES[name], strategy)
        np.savez(Path(out_dir) / f"{name}.npz", **flat_weights(result))


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "--one":
        one_device(sys.argv[2], sys.argv[3:])
    else:
        main(sys.argv[1], sys.argv[2:])
