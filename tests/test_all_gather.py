"""Losses across replicas: ``models.all_gather`` is the identity on one device and the
global batch under a strategy, whatever the replicas' shares and the steps per call,
where NT-Xent with the gathered negatives trains, validates and evaluates like one
device; a scalar, a ragged tensor or rows that are not the batch's are refused (on one
device too); a failed collective is a ``CollectiveError``, not a data error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_python

import beatloop
from beatloop.core.compiled.forward import ModelCalls
from beatloop.core.compiled.op_errors import data_errors
from beatloop.core.data.batches import as_dict_batches
from beatloop.core.devices.collectives import Gathering, global_batch_size

WORKER = Path(__file__).parent / "workers" / "gathered_run.py"


def calls(batch) -> ModelCalls:
    return ModelCalls({}, frozenset(), batch=batch)


def test_on_one_device_all_gather_is_the_tensor_itself_and_the_offset_zero():
    x = tf.reshape(tf.range(12.0), [4, 3])
    models = calls({"x": x})
    assert models.all_gather(x) is x
    structure = {"a": x, "b": (x[:, :1],)}
    assert models.all_gather(structure) is structure
    assert int(models.batch_offset) == 0

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def traced(x):  # a replica-sized batch of unknown static size, in a compiled step
        models = calls({"x": x})
        with tf.GradientTape() as tape:
            tape.watch(x)
            gathered = models.all_gather(x)
            loss = tf.reduce_sum(gathered[models.batch_offset :] ** 2)
        return gathered, tape.gradient(loss, x)

    gathered, gradient = traced(x)
    np.testing.assert_array_equal(gathered.numpy(), x.numpy())
    np.testing.assert_array_equal(gradient.numpy(), 2 * x.numpy())


def test_under_a_one_replica_strategy_all_gather_is_the_identity():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    x = tf.reshape(tf.range(6.0), [2, 3])
    result = strategy.run(lambda x: calls({"x": x}).all_gather(x), args=(x,))
    np.testing.assert_array_equal(strategy.experimental_local_results(result)[0].numpy(), x)


# What TensorFlow 2.21 raises when replicas gather tensors of different shapes (the
# worker below meets it for real): the node, then the aborted collective's words.
SHAPE_MISMATCH = (
    "Graph execution error:\n\nDetected at node while/allgather_1/CollectiveGatherV2_1 defined "
    'at (most recent call last):\n  File "recipe.py", line 3, in nt_xent\n\n'
    "Collective ops is aborted by: Shape mismatch in the collective instance 255. Op at "
    "device /job:localhost/replica:0/task:0/device:CPU:1 expected shape [10,4] but another "
    "member in the group expected shape [10,5]. This is likely due to different input "
    "shapes at different members of the collective op.\nThe error could be from a previous "
    "operation. Restart your program to reset.\n\t [[{{node "
    "while/allgather_1/CollectiveGatherV2_1}}]] [Op:__inference_call_971]"
)


def test_a_failed_collective_is_a_collective_error_naming_the_op_not_a_data_error():
    original = tf.errors.InvalidArgumentError(None, None, SHAPE_MISMATCH)
    errors = data_errors("training", "recipe 'simclr'")
    with pytest.raises(beatloop.CollectiveError) as caught, errors:
        raise original
    error = caught.value
    assert not isinstance(error, beatloop.DataError) and error.exit_code == 2
    assert error.original is original and error.__cause__ is original
    message = str(error)
    assert message.startswith(
        "recipe 'simclr': a cross-replica collective op failed in a training step: "
        "while/allgather_1/CollectiveGatherV2_1 (a cross-replica all-gather): Shape mismatch"
    )
    assert "expected shape [10,4] but another member in the group expected shape [10,5]" in message
    assert "the same shape but for axis 0" in message and "start a new one" in message


def test_an_invalid_argument_outside_collectives_stays_a_data_error():
    expected = pytest.raises(beatloop.DataError, match="a training step failed on its batch")
    with expected, data_errors("training", None):
        raise tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [4] vs. [3]")


class Gathers(beatloop.Recipe):
    """A mean-squared loss on a Dense layer's output, plus what ``gathered(models, z)``
    gathers (a misuse, each test its own)."""

    name = "gathers"
    batch_keys = {"x": 2}

    def __init__(self, gathered):
        super().__init__()
        self.gathered = gathered

    def build_models(self, spec):
        return {"dense": keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.1)}

    def losses(self):
        return {"loss": self.loss}

    def loss(self, models, batch):
        z = models["dense"](batch["x"])
        extra = tf.nest.flatten(self.gathered(models, z))
        return tf.add_n([tf.reduce_mean(z**2), *(tf.reduce_mean(t) for t in extra)])

    def schedule(self):
        return beatloop.Schedule(beatloop.Beat("loss", "sgd", "dense"))


def refused(gathered, drop_remainder=False) -> str:
    """The first line of the error a one-device run of ``Gathers(gathered)`` stops with."""
    rows = np.arange(40, dtype="float32").reshape(10, 4) / 40
    data = tf.data.Dataset.from_tensor_slices({"x": rows}).batch(4, drop_remainder)
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(Gathers(gathered), data=data, epochs=1, seed=0, progress=False)
    return str(caught.value).splitlines()[0]


HEAD = "recipe 'gathers': loss 'loss' of beat 'loss' failed on batches of {x: (None, 4) float32}: "


def test_a_scalar_is_refused_on_one_device_too():
    assert refused(lambda models, z: models.all_gather(tf.reduce_sum(z))[None]) == (
        HEAD + "ValueError: models.all_gather(x) gathers per-example rows, got a scalar "
        "(shape ()) of float32: gather a tensor with the replica's rows on its first axis, "
        "or reduce a scalar across replicas by gathering the rows it is made of"
    )


def test_a_ragged_tensor_is_refused_naming_its_shape():
    gather = lambda m, z: m.all_gather(tf.RaggedTensor.from_tensor(z)).flat_values  # noqa: E731
    assert refused(gather) == (
        HEAD + "TypeError: models.all_gather(x) gathers dense tensors, got a tf.RaggedTensor "
        "of shape (None, 3): gather a dense tensor of the same shape on every replica but for "
        "its first axis (a ragged tensor's x.to_tensor(shape=[None, width]))"
    )
    sparse = lambda m, z: tf.sparse.to_dense(m.all_gather(tf.sparse.from_dense(z)))  # noqa: E731
    assert "got a tf.SparseTensor of shape (None, 3)" in refused(sparse)


def test_rows_that_are_not_the_batch_s_are_refused_when_traced_where_known():
    """Batches of a fixed 4 rows, and a gathered tensor of 3."""
    first = refused(lambda models, z: models.all_gather(z[:3]), drop_remainder=True)
    assert first == (
        "recipe 'gathers': loss 'loss' of beat 'loss' failed on batches of {x: (4, 4) float32}: "
        "ValueError: models.all_gather(x) takes rows of the batch: the first axis of x must "
        "be the rows of the batch: x has shape (3, 3), the batch 4 rows"
    )


def test_rows_that_are_not_the_batch_s_are_refused_when_the_step_runs():
    """Batches of ``(None, 4)``: the check is an assertion, turned into the loss's error."""
    first = refused(lambda models, z: models.all_gather(tf.concat([z, z], axis=0)))
    words = (
        "recipe 'gathers': loss 'loss' failed: InvalidArgumentError: assertion failed: "
        "[models.all_gather(x) takes rows of the batch: the first axis of x must be the rows "
        "of the batch (x: shape (None, 3))] [Condition x == y did not hold element-wise:] "
        "[x (NODE) = ] [8] [y (NODE) = ] [4]"
    )  # a node's name is TensorFlow's
    assert re.fullmatch(re.escape(words).replace("NODE", r"\S+"), first), first


def test_rows_of_the_batch_in_a_structure_gather_on_one_device():
    result = beatloop.fit(
        Gathers(lambda models, z: models.all_gather({"z": z, "x": (z[:, :1] * 2,)})),
        data=tf.data.Dataset.from_tensor_slices({"x": np.ones((6, 4), "float32")}).batch(4),
        epochs=1, seed=0, progress=False,
    )  # fmt: skip
    assert result.steps == 2 and np.isfinite(result.history["loss"][0])


def test_the_batch_size_is_read_as_the_strategy_cuts_batches():
    rows = tf.data.Dataset.range(20)
    assert global_batch_size(rows.batch(9)) == 9
    assert global_batch_size(rows.batch(9).shuffle(3).take(2).prefetch(1)) == 9
    tuples = tf.data.Dataset.from_tensor_slices((np.zeros((20, 2), "float32"),)).batch(9)
    assert global_batch_size(as_dict_batches(tuples, "training")) == 9  # through its map
    assert global_batch_size(rows.batch(9).map(lambda x: x)) is None  # TensorFlow's -1
    assert global_batch_size(rows) is None  # no batch


def test_a_step_pads_enough_when_it_pads_at_least_the_data_s_largest_share():
    assert Gathering(5, 4).covers(Gathering(5, 4, "evaluation"))
    assert Gathering(5, 4).covers(Gathering(3, 64)) and not Gathering(5, 4).covers(Gathering(8))
    assert not Gathering(5, 4).covers(Gathering(None))  # shares unknown
    assert Gathering(None, 1).covers(Gathering(None)) and Gathering(None, 1).covers(Gathering(8))
    assert not Gathering(None, 4).covers(Gathering(5, 4)) and Gathering(5).covers(None)


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gathered") / "mirrored.json"
    run_python(WORKER, "mirrored", out, timeout=900)
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("case", ["5+4", "21+20"])
@pytest.mark.parametrize("spe", ["1", "4", "auto"])
def test_nt_xent_with_the_gather_under_a_mirrored_strategy_equals_one_device(mirrored, case, spe):
    """Replica shares of 5 + 4 (the docs' loss, ``(x,)`` tuple batches) or 21 + 20 (both
    views gathered as one dict), each pass's last batch 1 + 0 in training and 2 + 2 in
    validation, run in the same compiled calls as full batches at K=4: the weights, the
    epoch losses and the val_ figures of one device."""
    assert mirrored["replicas"] == 2
    report = mirrored["cases"][case]
    one, two = report["one"], report["two"][spe]
    assert report["steps"][spe][0] == report["steps"][spe][1] > 0
    assert report["weights"][spe] < 1e-6, report["weights"]  # float32 round-off
    assert set(two) == set(one) == {"nt_xent", "val_nt_xent"}
    for name, values in one.items():
        np.testing.assert_allclose(two[name], values, rtol=1e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["5+4", "21+20"])
def test_evaluations_at_four_steps_a_call_equal_one_device(mirrored, case):
    """On the run's validation data (its last val_ figure) and on data of batches of 15
    (8 + 7: more rows than validation's largest share; then 1 + 0)."""
    report = mirrored["cases"][case]
    evaluations = report["evaluations"]
    last = report["two"]["4"]["val_nt_xent"][-1]
    assert evaluations["validation"] == {"nt_xent": last}
    np.testing.assert_allclose(
        evaluations["other"]["nt_xent"], report["one_evaluation"]["nt_xent"], rtol=1e-6
    )


@pytest.mark.slow
def test_without_the_gather_the_loss_is_another_and_training_moved(mirrored):
    assert mirrored["moved"] > 1e-2  # training moved the weights
    assert mirrored["not_gathered"] > 1e-3  # each replica's negatives only: far off


@pytest.mark.slow
def test_the_gather_s_values_and_gradients_are_tensorflow_s(mirrored):
    """Shares of 3 + 2 padded to 4 rows: each replica's gradient is its own rows' of
    every replica's loss, as TensorFlow's own gather gives it."""
    ours, theirs = mirrored["gradients"]["ours"], mirrored["gradients"]["tensorflow"]
    assert ours == theirs
    rows = np.arange(15.0).reshape(5, 3)
    assert ours["gathered"] == [rows.tolist()] * 2
    expected = rows / 7.0 * (1 + 2)  # both replicas' losses: factors 1 and 2
    np.testing.assert_allclose(np.concatenate(ours["gradient"]), expected, rtol=1e-6)


@pytest.mark.slow
def test_data_whose_batch_size_tensorflow_cannot_compute_is_refused_above_one_step(mirrored):
    """A map after the batch: four steps a call are a ConfigError saying what to do; one
    a call gathers each step's own shares, as one device."""
    failure = mirrored["unsized"]
    assert failure["class"] == "ConfigError"
    assert failure["message"] == (
        "models.all_gather under a distribution strategy pads each replica's rows to the "
        "largest share of a global batch, the same at every step of a compiled call (here "
        "up to 4 steps), but TensorFlow cannot compute the batch size of the training data "
        "(a map after its .batch(n), batches a generator makes): batch it with .batch(n) "
        "after its last map, or pass steps_per_execution=1"
    )
    assert mirrored["unsized_weights"] < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize(
    ("misuse", "words"),
    [
        ("scalar", "ValueError: models.all_gather(x) gathers per-example rows, got a scalar"),
        ("ragged", "TypeError: models.all_gather(x) gathers dense tensors, got a tf.RaggedTensor"),
        ("doubled", "InvalidArgumentError: assertion failed: [models.all_gather(x) takes rows"),
    ],
)
def test_misuse_under_a_strategy_is_the_loss_s_user_code_error(mirrored, misuse, words):
    """Refused as on one device; the rows' check fails on every replica at once (no
    replica left waiting in a collective)."""
    failure = mirrored["misuse"][misuse]
    assert failure["class"] == "UserCodeError" and failure["exit_code"] == 2
    first = failure["message"].splitlines()[0]
    assert first.startswith("recipe 'simclr': loss 'nt_xent' ") and words in first
    if misuse == "doubled":  # each replica's first axis, then each replica's rows
        assert re.search(r"\[x \(\S+\) = \] \[10 8\] \[y \(\S+\) = \] \[5 4\]$", first), first


@pytest.mark.slow
def test_gathering_shapes_that_differ_across_replicas_is_a_collective_error(mirrored):
    failure = mirrored["failure"]
    assert failure["class"] == "CollectiveError" and not failure["data_error"]
    assert failure["exit_code"] == 2
    message = failure["message"]
    assert message.startswith(
        "recipe 'simclr': a cross-replica collective op failed in a training step: "
    )
    assert "CollectiveGatherV2" in message and "(a cross-replica all-gather)" in message
    assert re.search(r"Shape mismatch .* expected shape \[10,[45]\] but another member", message)
    assert "gather per-example rows (embeddings)" in message
