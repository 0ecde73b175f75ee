"""Data that does not fit a model, labels out of range and failing callbacks: each is
named (the model, the input, both shapes, the data set; the label, its key and the
config field; the callback, its event and its line), never a TensorFlow traceback."""

from pathlib import Path

import keras
import pytest
import tensorflow as tf
from helpers import TwoModels, dict_batches, tuple_batches
from tensorflow.python.framework import config as tf_config

import beatloop
from beatloop import DataError, InputMismatchError, LabelRangeError, UserCodeError
from beatloop.core.compiled.op_errors import data_errors, largest_label
from beatloop.recipes.supervised import Supervised


def line_of(marker: str) -> int:
    """The line of this file that ends with ``marker`` (a comment naming a line)."""
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.endswith(marker))


def narrow_model(width: int = 32) -> keras.Model:
    return keras.Sequential([keras.Input((width,)), keras.layers.Dense(10)])


class Handed(Supervised):
    """The supervised recipe, its model always handed to it (test recipe): it builds
    none from the data's spec, so data of unknown width can reach the steps."""

    name = "handed_test"
    build_models = beatloop.Recipe.build_models


def unknown_width(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` with the width of its ``x`` unknown to the spec, as a pipeline that
    reshapes its data has it."""
    return dataset.map(lambda x, y: (tf.reshape(x, [tf.shape(x)[0], -1]), y))


# --- shapes and dtypes -------------------------------------------------------------------


def test_a_model_of_another_width_is_named_before_the_first_step(small_digits):
    train, _ = small_digits
    with pytest.raises(InputMismatchError) as caught:
        beatloop.fit("supervised", data=tuple_batches(train, 8), models={"model": narrow_model()})
    error = caught.value
    assert isinstance(error, DataError)
    assert (error.model, error.input, error.key, error.data_set) == ("model", 0, "x", "training")
    assert (error.expected, error.expected_dtype) == ((None, 32), "float32")
    assert (error.found, error.found_dtype) == ((None, 64), "float32")
    message = str(error)
    assert message.startswith(
        "recipe 'supervised': model 'model' expects input 0 of shape (None, 32) float32, "
        "but the training data gives (None, 64) float32 (batch key 'x') — called from "
    ), message
    assert "supervised.py:" in message and 'in cross_entropy: logits = models["model"]' in message
    assert error.__cause__ is None and error.__suppress_context__  # no traceback of Keras's


def test_only_the_validation_data_not_fitting_is_named_validation(small_digits):
    # The training pipeline leaves its width unknown (it is 32 when it runs), so
    # check_split lets the validation data's 64 through: the validation step's trace
    # finds the mismatch.
    train, validation = small_digits
    narrow = {"x": train["x"][:, :32], "y": train["y"]}
    data = (unknown_width(tuple_batches(narrow, 8)), tuple_batches(validation, 8))
    with pytest.raises(InputMismatchError) as caught:
        beatloop.fit(Handed(), data=data, models={"model": narrow_model()})
    error = caught.value
    assert (error.data_set, error.expected, error.found) == ("validation", (None, 32), (None, 64))
    assert "but the validation data gives (None, 64) float32 (batch key 'x')" in str(error)


def test_a_mismatch_found_only_when_a_debug_step_runs_names_its_data_set(small_digits):
    # Neither spec says the width: in debug mode the step runs eagerly and the check
    # sees the batch's real shape; the training data fits, the validation data does not.
    train, validation = small_digits
    narrow = {"x": train["x"][:, :32], "y": train["y"]}
    data = (unknown_width(tuple_batches(narrow, 50)), unknown_width(tuple_batches(validation, 40)))
    with pytest.raises(InputMismatchError) as caught:
        beatloop.fit(Handed(), data=data, models={"model": narrow_model()}, debug=True)
    error = caught.value
    assert (error.data_set, error.found, error.key) == ("validation", (40, 64), "x")
    assert str(error).startswith(
        "recipe 'handed_test': model 'model' expects input 0 of shape (None, 32) float32, but "
        "the validation data gives (40, 64) float32 (batch key 'x')"
    )


def test_a_mismatch_found_while_lazy_models_are_built_shows_the_datas_shape(small_digits):
    # Model "a" is built on a stand-in batch of one row; "b" declares 32 inputs. The
    # shape reported is the data's, not the stand-in's (1, 64).
    train, _ = small_digits
    models = {
        "a": keras.Sequential([keras.layers.Dense(1)]),
        "b": keras.Sequential([keras.Input((32,)), keras.layers.Dense(1)]),
    }
    with pytest.raises(InputMismatchError) as caught:
        beatloop.fit(TwoModels(), data=dict_batches(train, 50), models=models)
    error = caught.value
    assert (error.model, error.expected, error.found) == ("b", (None, 32), (None, 64))
    assert str(error).startswith(
        "recipe 'two_models_test': model 'b' expects input 0 of shape (None, 32) float32, "
        "but the training data gives (None, 64) float32 (batch key 'x') — called from "
        "tests/helpers.py:"
    ), str(error)


class Subclassed(keras.Model):
    """A model that declares no inputs: Keras finds the mismatch inside it."""

    def __init__(self, width: int):
        super().__init__()
        self.dense = keras.layers.Dense(10)
        self(tf.zeros([1, width]))

    def call(self, x):
        return self.dense(x)


def test_a_model_without_declared_inputs_is_reported_with_keras_words(small_digits):
    train, _ = small_digits
    with pytest.raises(InputMismatchError) as caught:
        beatloop.fit("supervised", data=tuple_batches(train, 8), models={"model": Subclassed(32)})
    error = caught.value
    assert (error.model, error.input, error.expected, error.found) == ("model", 0, None, (None, 64))
    assert error.data_set == "training" and isinstance(error.original, ValueError)
    message = str(error)
    assert message.startswith(
        "recipe 'supervised': model 'model' does not fit input 0 of shape (None, 64) float32 "
        "that the training data gives (batch key 'x'); it declares no input shape"
    ), message
    assert "expected axis -1 of input shape to have value 32" in message  # Keras's words
    assert "Arguments received" not in message and "\x1b" not in message
    assert "supervised.py:" in message


def test_strings_for_numbers_are_named(small_digits):
    train, _ = small_digits
    text = train["x"].astype(str)
    data = tf.data.Dataset.from_tensor_slices((text, train["y"])).batch(8)
    with pytest.raises(InputMismatchError) as caught:
        beatloop.fit("supervised", data=data)
    error = caught.value
    assert (error.expected, error.expected_dtype) == ((None, 64), "float32")
    assert (error.found, error.found_dtype) == ((None, 64), "string")
    assert "expects input 0 of shape (None, 64) float32, but the training data gives " in str(error)


def test_keras_own_rank_rules_still_hold(small_digits):
    # A trailing dimension of 1 may be added or dropped, as Keras does: no error.
    train, _ = small_digits
    model = keras.Sequential([keras.Input((64, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    result = beatloop.fit("supervised", data=tuple_batches(train, 50), models={"model": model})
    assert result.steps == 4


class ArithmeticBug(Supervised):
    """The supervised recipe with a bug of the loss's own (test recipe)."""

    name = "arithmetic_bug_test"

    def cross_entropy(self, models, batch):
        logits = models["model"](batch["x"])
        return tf.reduce_mean(logits) + "1"  # the loss's own bug


def test_a_bug_in_a_loss_stays_a_user_code_error(small_digits):
    train, _ = small_digits
    with pytest.raises(UserCodeError) as caught:
        beatloop.fit(ArithmeticBug(), data=tuple_batches(train, 8))
    assert not isinstance(caught.value, DataError)
    assert f"test_mismatch.py:{line_of('# the loss' + chr(39) + 's own bug')}" in str(caught.value)


# --- labels ---------------------------------------------------------------------------------


@pytest.fixture(params=["kernel", "deterministic"])
def label_wording(request):
    """TensorFlow's two wordings of a label out of range: its kernel's, and (op
    determinism on, as after any seeded fit) the gather that replaces it."""
    was = tf_config.is_op_determinism_enabled()
    if request.param == "deterministic":
        tf_config.enable_op_determinism()
    else:
        tf_config.disable_op_determinism()
    yield request.param
    if was:
        tf_config.enable_op_determinism()
    else:
        tf_config.disable_op_determinism()


def with_label(arrays, index: int, value: int):
    labels = arrays["y"].copy()
    labels[index] = value
    return {"x": arrays["x"], "y": labels}


@pytest.mark.parametrize("data_set", ["training", "validation"])
@pytest.mark.parametrize("label", [15, -1])
def test_a_label_out_of_range_names_the_label_the_key_and_the_classes(
    small_digits, label_wording, data_set, label
):
    train, validation = small_digits
    if data_set == "training":
        train = with_label(train, 5, label)
    else:
        validation = with_label(validation, 7, label)
    with pytest.raises(LabelRangeError) as caught:
        beatloop.fit("supervised", data=(tuple_batches(train, 50), tuple_batches(validation, 50)))
    error = caught.value
    assert isinstance(error, DataError)
    assert (error.label, error.limit, error.keys) == (label, 10, ("y",))
    assert (error.field, error.classes, error.data_set) == ("classes", 10, data_set)
    assert isinstance(error.original, tf.errors.InvalidArgumentError)
    assert error.__suppress_context__ and error.__cause__ is None
    head = (
        f"recipe 'supervised': the {data_set} data has label {label} in 'y', outside [0, 10) "
        "— the config field classes is 10; "
    )
    fix = "fix the labels or set classes (--set classes=16)"
    assert str(error) == head + (fix if label > 0 else "class labels count from 0: fix the labels")


LABEL = "recipe 'supervised'"


def test_the_advice_on_a_label_out_of_range_covers_the_whole_datas_largest_label(label_wording):
    # The first batch's bad label is 3, a later one holds 8: the advice asks for 9 classes,
    # so following it once is enough (3 -> 4 would fail again at 7, then at 8).
    labels = tf.constant([0, 1, 3, 2, 1, 7, 0, 2, 8, 1, 0, 2], tf.int32)
    data = tf.data.Dataset.from_tensor_slices({"y": labels}).batch(4)
    step = tf.function(  # compiled, as the engine's step: TensorFlow names the op
        lambda y: tf.nn.sparse_softmax_cross_entropy_with_logits(y, tf.zeros([tf.shape(y)[0], 3]))
    )
    classes = {"y": ("classes", 3)}
    with pytest.raises(LabelRangeError) as caught, data_errors("training", LABEL, classes, data):
        for batch in data:
            step(batch["y"])
    error = caught.value
    assert (error.label, error.largest, error.exit_code) == (3, 8, 3)
    assert isinstance(error.original, tf.errors.InvalidArgumentError)
    assert str(error) == (
        "recipe 'supervised': the training data has label 3 in 'y', outside [0, 3) — the "
        "config field classes is 3; its largest label is 8; fix the labels or set classes "
        "(--set classes=9)"
    )
    assert largest_label(data.repeat(), ["y", "absent"]) == 8  # bounded on endless data
    assert largest_label(tf.data.Dataset.from_tensors({"x": [1.0]}), ["y"]) is None


def test_a_label_beyond_a_supplied_models_classes_names_both(small_digits):
    train, _ = small_digits
    data = tuple_batches(with_label(train, 3, 12), 50)
    with pytest.raises(LabelRangeError) as caught:
        beatloop.fit(
            "supervised", data=data, config={"classes": 16}, models={"model": narrow_model(64)}
        )
    assert str(caught.value) == (
        "recipe 'supervised': the training data has label 12 in 'y', outside [0, 10) — the "
        "config field classes is 16, but the model gives 10 classes; fix the labels or the model"
    )


def test_a_multitask_label_out_of_range_names_the_tasks_field(small_digits):
    train, _ = small_digits
    data = dict_batches(with_label(train, 0, 11), 50)
    with pytest.raises(LabelRangeError) as caught:
        beatloop.fit("multitask", data=data)
    assert str(caught.value) == (
        "recipe 'multitask': the training data has label 11 in 'y', outside [0, 10) — its "
        "classes come from the config field tasks, which is ('digit', 'ink'); fix the labels "
        "or change tasks"
    )


def test_the_declared_label_keys():
    assert beatloop.make_recipe("supervised").label_classes() == {"y": "classes"}
    assert beatloop.make_recipe("risk_weighted").label_classes() == {"y": "classes"}
    tasks = {"tasks": ("digit", "parity=classification:2", "ink")}
    assert beatloop.make_recipe("multitask", tasks).label_classes() == {
        "y": "tasks",
        "parity": "tasks",
    }
    assert beatloop.make_recipe("gan").label_classes() == {}


# --- the data pipeline ----------------------------------------------------------------------


def test_an_exception_in_the_data_pipeline_names_its_line(small_digits):
    train, _ = small_digits

    def broken(x):
        raise ValueError("no such image")  # pipeline raises here

    def load(x, y):
        x = tf.py_function(broken, [x], tf.float32)
        x.set_shape([64])
        return x, y

    data = tf.data.Dataset.from_tensor_slices((train["x"], train["y"])).map(load).batch(8)
    with pytest.raises(DataError) as caught:
        beatloop.fit("supervised", data=data)
    message = str(caught.value)
    assert message.startswith(
        "recipe 'supervised': the training data pipeline failed: ValueError: no such image — at "
    ), message
    assert f"test_mismatch.py:{line_of('# pipeline raises here')} in broken" in message
    assert isinstance(caught.value.original, tf.errors.OpError)


# --- callbacks ------------------------------------------------------------------------------


class Exploding(beatloop.Callback):
    def on_epoch_end(self, run, epoch, logs):
        raise ValueError(f"no figure for epoch {epoch}")  # callback raises here


class Watching(beatloop.Callback):
    """Records the exception ``on_exception`` receives."""

    def __init__(self):
        self.seen = []

    def on_exception(self, run, error):
        self.seen.append(error)


class Stopping(beatloop.Callback):
    def __init__(self, error: BaseException):
        self.error = error

    def on_epoch_end(self, run, epoch, logs):
        raise self.error


def test_a_failing_callback_is_named_with_its_event_and_line(small_digits):
    train, _ = small_digits
    watching = Watching()
    with pytest.raises(UserCodeError) as caught:
        beatloop.fit("supervised", data=tuple_batches(train, 50), callbacks=[Exploding(), watching])
    error = caught.value
    line = line_of("# callback raises here")
    assert str(error).startswith(
        "callback 'Exploding' in on_epoch_end failed: ValueError: no figure for epoch 0\n"
        f"  at tests/test_mismatch.py:{line} in on_epoch_end: raise ValueError("
    ), str(error)
    assert type(error.__cause__) is ValueError and error.__cause__ is error.original
    assert watching.seen == [error]  # on_exception sees what the run raises


@pytest.mark.parametrize(
    "raised",
    [beatloop.ConfigError("stop: a beatloop error on purpose"), SystemExit(3), KeyboardInterrupt()],
    ids=["beatloop-error", "system-exit", "keyboard-interrupt"],
)
def test_beatloops_own_errors_and_exits_from_callbacks_pass_unchanged(small_digits, raised):
    train, _ = small_digits
    watching = Watching()
    with pytest.raises(type(raised)) as caught:
        beatloop.fit(
            "supervised", data=tuple_batches(train, 50), callbacks=[Stopping(raised), watching]
        )
    if isinstance(raised, KeyboardInterrupt):  # Ctrl-C: the run stops as it does for one
        assert watching.seen and isinstance(watching.seen[0], KeyboardInterrupt)
    else:
        assert caught.value is raised and watching.seen == [raised]


def test_callbacks_of_beatloops_own_pass_their_errors_unchanged():
    from beatloop.callbacks.standard import History
    from beatloop.core.events.callbacks import reported

    error = OSError("disk full")
    assert reported(error, History(), "epoch_end") is error
    assert isinstance(reported(error, Exploding(), "epoch_end"), UserCodeError)


def op_types(engine) -> list[str]:
    """Every op type in the training loop's one-step graph, its nested functions' too."""
    graph_def = engine.train_loop._one.graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return sorted(node.op for node in nodes)


def test_the_checks_add_no_op_to_the_compiled_step(small_digits, monkeypatch):
    # The label keys are read only when a step fails, and the input checks run in
    # Python when the step is traced: without either, the step's graph is the same.
    from beatloop.core.compiled import forward
    from beatloop.core.data.batches import as_data_split

    train, _ = small_digits

    class Undeclared(Supervised):
        name = "undeclared_test"

        def label_classes(self):
            return {}

    data = as_data_split(tuple_batches(train, 50))
    checked = op_types(beatloop.Engine(Supervised(), data))
    monkeypatch.setattr(forward, "check_inputs", lambda *args: None)
    unchecked = op_types(beatloop.Engine(Undeclared(), data))
    assert checked == unchecked and checked.count("MatMul") >= 2  # the model is in it
