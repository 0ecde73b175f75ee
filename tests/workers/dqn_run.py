"""The built-in dqn recipe run in its own process (tests/test_dqn.py).

``python dqn_run.py SPEC_JSON``: one run for the resume test; it can SIGKILL itself
after a given step, and writes the final weights and recipe state to an .npz
(``model/index``, ``state/name``).

``python dqn_run.py mirrored OUT``: dqn at its defaults, shortened, on a MirroredStrategy
over two logical CPUs at K=1 and K=4, each against one run on one device (at K=4: one
device's run does not depend on K), and a test recipe whose acts count their runs and
the global batch's rows, alike; writes what they measured to OUT
(JSON): the largest weight, optimizer-variable, recipe-state and figure differences,
and the acts' counters; and what a loss drawing a scalar under the strategy is told.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder

import numpy as np
from helpers import all_weights
from resumable_run import SignalAt

import beatloop


def fit(spec: dict, callbacks=()):
    """The run ``spec`` describes, fitted in this process (the resume test fits its
    reference and resumed runs so; only the killed one needs a process of its own)."""
    return beatloop.fit(
        "dqn",
        config=spec.get("config"),
        epochs=spec["epochs"],
        seed=spec["seed"],
        run_dir=spec["run_dir"],
        checkpoint_every=spec.get("checkpoint_every"),
        steps_per_execution=spec.get("steps_per_execution", "auto"),
        callbacks=list(callbacks),
        progress=False,
    )


def final(result) -> dict[str, np.ndarray]:
    """A run's final weights and recipe state, keyed ``model/index`` and ``state/name``."""
    state = {f"state/{name}": v.numpy() for name, v in result.engine.bound.state.items()}
    return {**all_weights(result.models), **state}


def main(spec: dict) -> int:
    kill = [] if spec.get("kill_at") is None else [SignalAt(spec["kill_at"], signal.SIGKILL)]
    result = fit(spec, kill)
    np.savez(spec["out"], **final(result))
    print(json.dumps({"steps": result.steps, "resumed_from": result.resumed_from}), flush=True)
    return 0


#: dqn at its defaults, an epoch shortened to 24 steps (two epochs: 100 warm-up moves,
#: then 48 moves and updates) and a target copy every 16 steps, so two copies happen.
SHORT = {"steps_per_epoch": 24, "target_every": 16, "validation_batches": 2}


def largest(first, second) -> float:
    """The largest absolute difference of two arrays (0 for equal integers)."""
    return float(np.abs(np.asarray(first, np.float64) - np.asarray(second, np.float64)).max())


def compared(one, two, strategy) -> dict:
    """How far the 2-replica run ``two`` ended from the one-device run ``one``."""
    local = strategy.experimental_local_results
    weights = all_weights(one.models), all_weights(two.models)
    slots = [
        (first, second)
        for name, optimizer in one.engine.bound.optimizers.items()
        for first, second in zip(
            optimizer.variables, two.engine.bound.optimizers[name].variables, strict=True
        )
    ]
    state_one, state_two = one.engine.bound.state, two.engine.bound.state
    figures = {
        key: max(largest(a, b) for a, b in zip(one.history[key], two.history[key], strict=True))
        for key in one.history
    }
    return {
        "steps": [one.steps, two.steps],
        "weights": max(largest(weights[0][k], weights[1][k]) for k in weights[0]),
        "slots": max(largest(a.numpy(), copy.numpy()) for a, b in slots for copy in local(b.value)),
        "state": {
            name: max(largest(v.numpy(), copy.numpy()) for copy in local(state_two[name]))
            for name, v in state_one.items()
        },
        "random": max(
            largest(one.engine.bound.random.state.numpy(), copy.numpy())
            for copy in local(two.engine.bound.random.state)
        ),
        "figures": figures,
        "q_from_target": max(  # how far q moved since the target's last copy
            largest(weights[0][k], weights[0]["target/" + k[2:]])
            for k in weights[0]
            if k.startswith("q/")
        ),
    }


class Counted(beatloop.Recipe):
    """A line fitted to data batches, and two acts that count in recipe state: each
    run, the global batch's rows, a draw of the run's generator slice-assigned into a
    ring (every step), and the steps the second (``every=2``) ran on (test recipe)."""

    name = "counted_test"

    def build_models(self, batch_spec):
        import keras

        return {"line": keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])}

    def build_state(self):
        import tensorflow as tf

        def variable(value):
            return tf.Variable(value, trainable=False)

        return {
            "acts": variable(tf.constant(0, tf.int64)),
            "rows": variable(tf.constant(0, tf.int64)),
            "ring": variable(tf.zeros([4])),
            "evens": variable(tf.constant(0, tf.int64)),
        }

    def build_optimizers(self):
        import keras

        return {"sgd": keras.optimizers.SGD(0.1)}

    def losses(self):
        return {"mse": self.mse}

    def mse(self, models, batch):
        import tensorflow as tf

        return tf.reduce_mean(tf.square(models["line"](batch["x"]) - batch["y"]))

    def count(self, models, batch):
        import tensorflow as tf

        state = models.state
        slot = tf.cast(state["acts"] % 4, tf.int32)
        state["ring"][slot].assign(models.random.uniform([]))  # a slice, a scalar draw
        state["acts"].assign_add(1)
        state["rows"].assign_add(tf.cast(tf.shape(batch["x"])[0], tf.int64))

    def count_even(self, models, batch):
        models.state["evens"].assign_add(1)

    def schedule(self):
        return beatloop.Schedule(
            [
                beatloop.Act(self.count),
                beatloop.Beat("mse", "sgd", "line"),
                beatloop.Act(self.count_even, every=2),
            ]
        )


class ScalarDraw(Counted):
    """A loss drawing a scalar from ``models.random``: refused under a strategy."""

    name = "scalar_draw_test"

    def mse(self, models, batch):
        return super().mse(models, batch) * (1.0 + 0.0 * models.random.uniform([]))


def counted_data():
    """12 rows in batches of 5, 5 and 2: replica shares 3 and 2, then 1 and 1."""
    import tensorflow as tf

    x = np.linspace(-1, 1, 48, dtype=np.float32).reshape(12, 4)
    return tf.data.Dataset.from_tensor_slices({"x": x, "y": x[:, :2] * 0.5}).batch(5)


def mirrored(out: str) -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {"replicas": strategy.num_replicas_in_sync}

    def dqn(s, k):
        return beatloop.fit(
            "dqn", config=SHORT, epochs=2, seed=7, strategy=s, steps_per_execution=k,
            progress=False,
        )  # fmt: skip

    def counted(s, k):
        return beatloop.fit(
            Counted(), data=counted_data(), epochs=2, seed=0, strategy=s,
            steps_per_execution=k, progress=False,
        )  # fmt: skip

    # one device's run is the same at every K (test_dqn's bit-for-bit test): one
    # reference, at K=4, for the two replicas' runs at K=1 and K=4
    one = dqn(None, 4)
    for k in (1, 4):
        report[f"dqn_k{k}"] = compared(one, dqn(strategy, k), strategy)
    one = counted(None, 4)
    for k in (1, 4):
        two = counted(strategy, k)
        report[f"counted_k{k}"] = {
            "steps": two.steps,
            "one_device": {name: v.numpy().tolist() for name, v in one.engine.bound.state.items()},
            "per_replica": {
                name: [copy.numpy().tolist() for copy in strategy.experimental_local_results(v)]
                for name, v in two.engine.bound.state.items()
            },
        }
    try:
        beatloop.fit(ScalarDraw(), data=counted_data(), epochs=1, seed=0, strategy=strategy)
    except beatloop.BeatloopError as error:
        report["scalar_draw"] = f"{type(error).__name__}: {error}"
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1] == "mirrored":
        mirrored(sys.argv[2])
    else:
        sys.exit(main(json.loads(sys.argv[1])))
