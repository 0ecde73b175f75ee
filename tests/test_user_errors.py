"""Mistakes in a recipe's own code: reported in that code, with its cause kept; and a
model call's explicit ``training=`` inside a loss."""

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import dict_batches

import beatloop


class NormThenHead(beatloop.Recipe):
    """A frozen batch-normalisation model ``norm`` in front of a trained ``head``; the
    loss calls ``norm`` with ``norm_call`` keywords (test recipe)."""

    name = "norm_then_head_test"
    batch_keys = {"x": 2, "y": 1}

    def __init__(self, **norm_call):
        super().__init__()
        self.norm_call = norm_call

    def default_data(self, seed):
        raise NotImplementedError("a test passes its data")

    def build_models(self, batch_spec):
        keras.utils.set_random_seed(0)
        return {
            "norm": keras.Sequential([keras.Input((64,)), keras.layers.BatchNormalization()]),
            "head": keras.Sequential([keras.Input((64,)), keras.layers.Dense(1)]),
        }

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.01)}

    def losses(self):
        return {"fit": self.fit}

    def fit(self, models, batch):
        features = models["norm"](batch["x"], **self.norm_call)
        target = tf.cast(batch["y"], tf.float32)[:, None]
        return tf.reduce_mean(tf.square(models["head"](features) - target))

    def schedule(self):
        beat = beatloop.Beat(loss="fit", optimizer="sgd", updates="head")
        return beatloop.Schedule(beat, frozen=("norm",))


@pytest.mark.parametrize("debug", [False, True])
def test_explicit_training_keyword_overrides_the_beats_mode(small_digits, debug):
    train, _ = small_digits
    data = dict_batches(train, 50)
    moving_mean = lambda result: result.models["norm"].layers[0].moving_mean.numpy()  # noqa: E731

    default = beatloop.fit(NormThenHead(), data=data, seed=0, debug=debug)
    np.testing.assert_array_equal(moving_mean(default), np.zeros(64))  # inference: unchanged

    explicit = beatloop.fit(NormThenHead(training=True), data=data, seed=0, debug=debug)
    assert np.abs(moving_mean(explicit)).max() > 0.01  # training mode: the statistics moved


def line_of(marker: str) -> int:
    """The line of this file that holds ``marker`` (a comment naming a failing line)."""
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.endswith(marker))


def fail_in_a_helper(batch):
    return batch["x"] + tf.zeros([3, 3])  # helper raises here


class FaultyModel(keras.Model):
    """A subclassed model whose ``call`` fails when traced (it runs eagerly once, to be
    built)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(10)
        self(tf.zeros([1, 64]))

    def call(self, x, training=None):
        if tf.executing_eagerly():
            return self.dense(x)
        return self.dense(x) + {}["in_call"]  # model's call raises here


class Broken(beatloop.Recipe):
    """One model fitted by one beat; the loss or the metric update fails as the test
    says (test recipe)."""

    name = "broken_test"
    batch_keys = {"x": 2, "y": 1}

    def __init__(self, loss_fails=None, metrics_fail=None):
        super().__init__()
        self.loss_fails, self.metrics_fail = loss_fails, metrics_fail

    def default_data(self, seed):
        from beatloop.datasets import digits

        return digits(seed, 50)

    def build_models(self, batch_spec):
        if self.loss_fails == "in_model":
            return {"model": FaultyModel()}
        return {"model": keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.01)}

    def losses(self):
        return {"xent": self.xent}

    def xent(self, models, batch):
        if self.loss_fails == "key":
            {}["oops"]  # loss raises here
        if self.loss_fails == "eagerly" and tf.executing_eagerly():
            raise RuntimeError("only when run")  # eager loss raises here
        if self.loss_fails == "call":
            models["model"](batch["x"], True)  # model call raises here
        if self.loss_fails == "helper":
            fail_in_a_helper(batch)
        if self.loss_fails == "assert":
            five = tf.constant(5, batch["y"].dtype)
            tf.debugging.assert_less(batch["y"], five, message="labels < 5")  # assertion fails
        if self.loss_fails == "ours":
            raise beatloop.ConfigError("a beatloop error of the recipe's own")
        logits = models["model"](batch["x"])
        return tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(batch["y"], logits, from_logits=True)
        )

    def build_metrics(self):
        return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}

    def update_metrics(self, metrics, batch, outputs):
        if self.metrics_fail == "assert":
            tf.debugging.assert_negative(batch["y"], message="no")  # metric assertion fails
        elif self.metrics_fail:
            outputs["xent"]["logits"]  # metric update raises here
        metrics["accuracy"].update_state(batch["y"], tf.zeros([tf.shape(batch["y"])[0], 10]))

    def schedule(self):
        return beatloop.Schedule(beatloop.Beat(loss="xent", optimizer="sgd", updates="model"))


@pytest.fixture
def digit_batches(small_digits):
    train, validation = small_digits
    return dict_batches(train, 50), dict_batches(validation, 50)


def assert_reported(caught, function: str, marker: str, cause: type, detail: str):
    """The UserCodeError names the recipe, the function, the line of ``marker`` in this
    file and the cause; the cause is chained."""
    error = caught.value
    message = str(error)
    assert message.startswith(f"recipe 'broken_test': {function}"), message
    assert f"test_user_errors.py:{line_of(marker)} in " in message, message
    assert f"{cause.__name__}: {detail}" in message, message
    assert type(error.__cause__) is cause


@pytest.mark.parametrize("debug", [False, True])
def test_a_failing_loss_is_reported_in_the_loss(digit_batches, debug):
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(Broken(loss_fails="key"), data=digit_batches, debug=debug)
    assert_reported(caught, "loss 'xent' of beat 'xent'", "# loss raises here", KeyError, "'oops'")
    assert caught.value.__cause__.args == ("oops",)


def test_a_loss_failing_only_when_run_eagerly_is_reported_in_the_loss(digit_batches):
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(Broken(loss_fails="eagerly"), data=digit_batches, debug=True)
    assert_reported(
        caught, "loss 'xent'", "# eager loss raises here", RuntimeError, "only when run"
    )


@pytest.mark.parametrize("debug", [False, True])
def test_a_failed_assertion_in_a_loss_is_reported_in_the_loss(digit_batches, debug):
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(Broken(loss_fails="assert"), data=digit_batches, debug=debug)
    assert caught.value.exit_code == 2
    function = "loss 'xent' of beat 'xent'" if debug else "loss 'xent'"
    assert_reported(caught, function, "# assertion fails", tf.errors.InvalidArgumentError, "")
    first = str(caught.value).splitlines()[0]
    if debug:  # raised eagerly, by tf.debugging's own Python code
        assert first.startswith(
            f"recipe 'broken_test': {function} failed: InvalidArgumentError: labels < 5 "
            "Condition x < y did not hold. First 3 elements of x: ["
        ), first
    else:  # read from the graph error: the Assert op was defined in the loss
        assert first.startswith(
            f"recipe 'broken_test': {function} failed: InvalidArgumentError: assertion "
            "failed: [labels < 5] [Condition x < y did not hold element-wise:] [x ("
        ), first
        assert isinstance(caught.value.__cause__.__cause__, tf.errors.InvalidArgumentError)
    assert 'tf.debugging.assert_less(batch["y"], five' in str(caught.value)


def test_a_failed_assertion_in_a_metric_update_is_reported_in_it(digit_batches):
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(Broken(metrics_fail="assert"), data=digit_batches)
    function = "metric update 'update_metrics'"
    assert_reported(
        caught, function, "# metric assertion fails", tf.errors.InvalidArgumentError, ""
    )


def test_the_innermost_line_of_the_recipes_own_code_is_named(digit_batches):
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(Broken(loss_fails="helper"), data=digit_batches)
    # the failing op is TensorFlow's; the line reported is the recipe's own helper
    assert_reported(caught, "loss 'xent'", "# helper raises here", ValueError, "")
    assert "in fail_in_a_helper: return batch" in str(caught.value)


def test_a_failing_model_call_method_is_named(digit_batches):
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(Broken(loss_fails="in_model"), data=digit_batches)
    # Keras rewrites the KeyError's message: it is shown as text, without its colours
    assert_reported(caught, "loss 'xent'", "# model's call raises here", KeyError, "")
    assert "KeyError: Exception encountered when calling FaultyModel.call(). in_call" in str(
        caught.value
    )


def test_a_bad_model_call_in_a_loss_names_the_call(digit_batches):
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(Broken(loss_fails="call"), data=digit_batches)
    assert_reported(caught, "loss 'xent'", "# model call raises here", ValueError, "")
    assert "failed on batches of {x: (None, 64) float32, y: (None,) int32}" in str(caught.value)
    assert "should be passed as a keyword argument: True" in str(caught.value)


@pytest.mark.parametrize("mode", ["compiled", "debug", "distributed"])
def test_a_failing_metric_update_is_reported_in_it(digit_batches, mode):
    # compiled: traced as the engine is built; debug: run eagerly by the engine;
    # distributed: a one-replica strategy, its data read plain (replicas.splits_batches),
    # the step traced inside strategy.run as the engine is built (several replicas' first
    # call traces it: tests/test_distribution.py and the workers in tests/workers)
    options = {
        "compiled": {},
        "debug": {"debug": True},
        "distributed": {"strategy": tf.distribute.MirroredStrategy(["/cpu:0"])},
    }[mode]
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(Broken(metrics_fail=True), data=digit_batches, **options)
    assert_reported(
        caught, "metric update 'update_metrics'", "# metric update raises here", KeyError, ""
    )


def test_beatloop_errors_in_recipe_code_pass_through(digit_batches):
    with pytest.raises(beatloop.ConfigError, match=r"^a beatloop error of the recipe's own$"):
        beatloop.fit(Broken(loss_fails="ours"), data=digit_batches)


def test_the_command_line_shows_the_line_and_the_cause(monkeypatch, capsys, tmp_path):
    from beatloop.cli import main
    from beatloop.plugins import registry as registry_module

    class BrokenByName(Broken):
        name = "broken_by_name_test"

        def __init__(self, config=None):
            super().__init__(loss_fails="key")

    registry = registry_module.Registry(load_entry_points=False)
    registry.register(BrokenByName)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    run_dir = tmp_path / "runs" / "first" / "broken"  # its parents made for it, by its lock
    assert main(["run", "broken_by_name_test", "--quiet", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("beatloop: error: recipe 'broken_by_name_test': loss 'xent'")
    assert f"test_user_errors.py:{line_of('# loss raises here')} in xent" in err
    assert "KeyError: 'oops'" in err
    assert not run_dir.exists()  # a run that never stepped takes its run dir back
    assert sorted(tmp_path.iterdir()) == []  # and the folders made to hold it


class PerTaskRows(beatloop.Recipe):
    """A loss that unstacks a fixed number of rows: the batch of 10 in 4s ends short."""

    name = "per_task_rows"

    def build_models(self, spec):
        return {"model": keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.1)}

    def losses(self):
        def per_task(models, batch):
            rows = tf.unstack(batch["x"], num=4)  # a fixed batch size
            return tf.add_n([tf.reduce_sum(models["model"](row[None])) for row in rows])

        return {"loss": per_task}

    def schedule(self):
        return beatloop.Schedule(beatloop.Beat("loss", "sgd", "model"))


def test_an_op_the_losss_own_line_made_failing_is_that_lines_error_not_a_data_error():
    x = np.ones((10, 2), np.float32)
    data = beatloop.DataSplit(tf.data.Dataset.from_tensor_slices({"x": x}).batch(4))
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(PerTaskRows(), data=data, epochs=1)
    assert not isinstance(caught.value, beatloop.DataError)
    message = str(caught.value)
    assert message.startswith(
        "recipe 'per_task_rows': loss 'per_task' failed: InvalidArgumentError: Input shape "
        "axis 0 must equal 4, got shape [2,2]"
    ), message
    assert "take sizes from tf.shape(x)" in message
    assert 'rows = tf.unstack(batch["x"], num=4)' in message
    assert isinstance(caught.value.__cause__.__cause__, tf.errors.InvalidArgumentError)
