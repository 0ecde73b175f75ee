"""Recipe state (``Recipe.build_state``), data the loop makes itself (``loop_data``), the
ResumeWarning for Python-fed data, and model building that runs no user code."""

from __future__ import annotations

import json
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, tuple_batches

import beatloop
from beatloop import Beat, Schedule
from beatloop.core.data.batches import as_data_split
from beatloop.core.running.engine import Engine, EngineOptions

ROWS = {"x": np.linspace(-1, 1, 48, dtype=np.float32).reshape(12, 4)}
ROWS["y"] = ROWS["x"][:, :2] * 0.5


def rows(count=12, batch=4):
    return tf.data.Dataset.from_tensor_slices({k: v[:count] for k, v in ROWS.items()}).batch(batch)


class Counting(beatloop.Recipe):
    """An unbuilt Sequential whose loss counts its calls in recipe state (test recipe)."""

    name = "counting_test"

    def __init__(self, repeat=1, state=None):
        super().__init__()
        self.repeat, self.state = repeat, state

    def build_models(self, batch_spec):
        return {"m": keras.Sequential([keras.layers.Dense(2)])}  # no Input: built lazily

    def build_state(self):
        if self.state is not None:
            return self.state()
        return {
            "calls": tf.Variable(0, dtype=tf.int64, trainable=False),
            "sum": tf.Variable(tf.zeros([2]), trainable=False),
        }

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.1)}

    def losses(self):
        return {"mse": self.mse}

    def mse(self, models, batch):
        models.state["calls"].assign_add(1)
        out = models["m"](batch["x"])
        models.state["sum"].assign_add(tf.reduce_sum(out, axis=0))
        return tf.reduce_mean(tf.square(out - batch["y"]))

    def schedule(self):
        return Schedule(Beat(loss="mse", optimizer="sgd", updates="m", repeat=self.repeat))


def calls(engine) -> int:
    return int(engine.bound.state["calls"].numpy())


@pytest.mark.parametrize("repeat", [1, 2])
def test_building_binding_and_tracing_run_no_loss_and_each_step_runs_it(repeat):
    split = as_data_split((rows(), rows(8)))
    engine = Engine(Counting(repeat), split, options=EngineOptions(steps_per_execution=2))
    assert engine.bound.models["m"].built  # built by a trace
    assert calls(engine) == 0  # built, bound, both loops traced: the loss never ran
    assert not engine.bound.state["sum"].numpy().any()
    engine.fit(2)  # 3 steps an epoch, then 2 validation batches an epoch
    assert int(engine.counters.step) == 6
    assert calls(engine) == 6 * repeat + 2 * 2
    engine.evaluate()  # the validation data's two batches, once each
    assert calls(engine) == 6 * repeat + 2 * 2 + 2


@pytest.mark.parametrize(
    ("made", "said"),
    [
        (lambda: {"buffer": np.zeros(3)}, r"'buffer' a ndarray; each entry must be a tf.Variable"),
        (lambda: {"w": tf.Variable(1.0)}, r"'w' a trainable variable.*trainable=False"),
        (lambda: [tf.Variable(1.0)], r"must return a dict of name -> tf.Variable, got list"),
    ],
)
def test_bad_state_is_a_config_error_naming_the_recipe_and_entry(made, said):
    with pytest.raises(beatloop.ConfigError, match=rf"recipe 'counting_test'.*{said}"):
        Engine(Counting(state=made), as_data_split(rows()))


def test_state_is_checkpointed_recorded_and_resumed_bit_exactly(tmp_path):
    whole = beatloop.fit(Counting(), data=rows(), epochs=3, seed=1, run_dir=tmp_path / "a")
    beatloop.fit(Counting(), data=rows(), epochs=1, seed=1, run_dir=tmp_path / "b")
    resumed = beatloop.fit(Counting(), data=rows(), epochs=3, seed=1, run_dir=tmp_path / "b")
    for result in (whole, resumed):
        assert int(result.engine.bound.state["calls"].numpy()) == 9
    np.testing.assert_array_equal(
        whole.engine.bound.state["sum"].numpy(), resumed.engine.bound.state["sum"].numpy()
    )
    assert_same_weights(all_weights(whole.models), all_weights(resumed.models))
    record = json.loads((tmp_path / "a" / "run.json").read_text())
    assert record["state"] == {
        "calls": {"shape": [], "dtype": "int64"},
        "sum": {"shape": [2], "dtype": "float32"},
    }
    keys = [name for name, _ in tf.train.list_variables(str(tmp_path / "a" / "checkpoints"))]
    assert any(key.startswith("recipe_state/calls/") for key in keys)


def test_a_recipe_without_state_writes_no_state_anywhere(tmp_path, small_digits):
    data = tuple_batches(small_digits[0], 100)
    beatloop.fit("supervised", data=data, epochs=1, seed=0, run_dir=tmp_path)
    assert "state" not in json.loads((tmp_path / "run.json").read_text())
    keys = [name for name, _ in tf.train.list_variables(str(tmp_path / "checkpoints"))]
    assert not any(key.startswith("recipe_state/") for key in keys)


class Ticking(beatloop.Recipe):
    """Data its own loop makes: ticks, a counter of steps in recipe state (test recipe)."""

    name = "ticking_test"
    steps_per_epoch = 5

    def default_data(self, seed):
        return beatloop.loop_data()

    def build_models(self, batch_spec):
        return {"m": keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])}

    def build_state(self):
        return {"t": tf.Variable(0.0, trainable=False)}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.05)}

    def losses(self):
        return {"fit_t": self.fit_t}

    def fit_t(self, models, batch):
        t = models.state["t"].assign_add(1.0)
        x = tf.reshape(tf.math.sin(t), [1, 1]) + models.random.normal([1, 1])
        return tf.reduce_mean(tf.square(models["m"](x) - tf.cos(t)))

    def schedule(self):
        return Schedule(Beat(loss="fit_t", optimizer="sgd", updates="m"))


def test_loop_data_runs_without_data_and_resumes_exactly(tmp_path):
    whole = beatloop.fit(Ticking, epochs=3, seed=2, steps_per_execution=2, run_dir=tmp_path / "a")
    assert int(whole.engine.counters.step) == 15
    assert int(whole.engine.counters.examples) == 15  # one example a tick
    assert float(whole.engine.bound.state["t"].numpy()) == 15.0
    beatloop.fit(Ticking, epochs=1, seed=2, steps_per_execution=2, run_dir=tmp_path / "b")
    resumed = beatloop.fit(Ticking, epochs=3, seed=2, steps_per_execution=2, run_dir=tmp_path / "b")
    assert float(resumed.engine.bound.state["t"].numpy()) == 15.0
    assert_same_weights(all_weights(whole.models), all_weights(resumed.models))


def test_a_runs_steps_per_epoch_wins_over_the_recipes():
    result = beatloop.fit(Ticking, epochs=1, seed=2, steps_per_epoch=3)
    assert int(result.engine.counters.step) == 3


def test_loop_data_without_steps_per_epoch_is_a_config_error():
    class Endless(Ticking):
        steps_per_epoch = None

    with pytest.raises(beatloop.ConfigError, match=r"own loop.*set steps_per_epoch on the recipe"):
        beatloop.fit(Endless, epochs=1, seed=2)


def _generated(count=12):
    def rows_of_python():
        for start in range(0, count, 4):
            yield {k: v[start : start + 4] for k, v in ROWS.items()}

    spec = {k: tf.TensorSpec([None, 4 if k == "x" else 2], tf.float32) for k in ROWS}
    return tf.data.Dataset.from_generator(rows_of_python, output_signature=spec)


def resume_warnings(data, run_dir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = Engine(Counting(), as_data_split(data), run_dir=run_dir)
        before = [w for w in caught if issubclass(w.category, beatloop.ResumeWarning)]
        assert before == []  # an engine alone (restore, evaluate) does not warn
        engine.fit(1)
    return [str(w.message) for w in caught if issubclass(w.category, beatloop.ResumeWarning)]


def test_python_fed_data_warns_once_that_a_resume_cannot_be_exact(tmp_path):
    found = resume_warnings(_generated(), tmp_path)
    assert len(found) == 1
    assert "GeneratorDataset" in found[0] and "in no checkpoint" in found[0]
    assert "Recipe.build_state" in found[0] and "deterministic tf.data" in found[0]
    negative = lambda x: tf.ensure_shape(tf.numpy_function(np.negative, [x], tf.float32), x.shape)  # noqa: E731
    mapped = rows().map(lambda b: {**b, "x": negative(b["x"])})
    assert "PyFunc" in resume_warnings(mapped, tmp_path)[0]
    interleaved = tf.data.Dataset.range(2).interleave(
        tf.autograph.experimental.do_not_convert(lambda _: _generated(8))
    )
    assert "GeneratorDataset" in resume_warnings(interleaved.prefetch(2), tmp_path)[0]


def test_no_resume_warning_without_a_run_dir_or_for_tf_data(tmp_path):
    assert resume_warnings(_generated(), None) == []
    assert resume_warnings(rows().shuffle(4, seed=1).repeat(2), tmp_path) == []


def test_show_prints_the_recipe_state(capsys):
    from beatloop.cli.cmd_show import _show_state

    _show_state(Counting())
    assert capsys.readouterr().out.splitlines()[1:] == [
        "recipe state (models.state[NAME], in every checkpoint):",
        "  calls: () int64",
        "  sum: (2,) float32",
    ]


MIRRORED_LAZY = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, beatloop
from test_recipe_state import ROWS, Counting
class Reading(Counting):
    def mse(self, models, batch):  # reads its state: assigning it per replica needs a rule
        out = models["m"](batch["x"])
        return tf.reduce_mean(tf.square(out - batch["y"])) + 0.0 * models.state["sum"][0]
data = tf.data.Dataset.from_tensor_slices(ROWS).batch(4)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
result = beatloop.fit(Reading(), data=data, epochs=1, seed=0, strategy=strategy, progress=False)
print(result.steps, type(result.engine.bound.state["sum"]).__name__, result.models["m"].built)
"""


@pytest.mark.slow
def test_a_lazily_built_model_and_state_under_a_mirrored_strategy():
    """Models built by a trace in the strategy's scope are mirrored (their variables are
    made outside the trace), and so is the recipe's state."""
    from pathlib import Path

    from helpers import start_python

    process = start_python("-c", MIRRORED_LAZY, str(Path(__file__).parent))
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert out.split() == ["3", "MirroredVariable", "True"]
