"""Losses across replicas: ``models.all_gather`` is the identity on one device and the
global batch under a strategy, where NT-Xent with the gathered negatives trains like one
device; a failed collective is a ``CollectiveError``, not a data error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import run_python

import beatloop
from beatloop.core.forward import ModelCalls
from beatloop.core.op_errors import data_errors

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


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gathered") / "mirrored.json"
    run_python(WORKER, "mirrored", out, timeout=400)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_nt_xent_with_the_gather_under_a_mirrored_strategy_equals_one_device(mirrored):
    """Global batches of 9 split 5 + 4 (and a last batch of 4 split 2 + 2): unequal
    shares, static shape (None, 64) on each replica."""
    assert mirrored["replicas"] == 2 and mirrored["steps"] == [10, 10]
    assert mirrored["moved"] > 1e-2  # training moved the weights
    assert mirrored["gathered"] < 1e-6  # float32 round-off
    # each replica's negatives only: another loss, the gap the gather closes
    assert mirrored["not_gathered"] > 1e-2
    for name, values in mirrored["one"].items():
        np.testing.assert_allclose(mirrored["two"][name], values, rtol=1e-6, err_msg=name)


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
