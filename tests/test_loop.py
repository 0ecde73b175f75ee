"""The step, the compiled loop and the data stream as separate pieces: what each does
alone, on real TensorFlow."""

from __future__ import annotations

import itertools
import threading
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

from beatloop import Beat, Schedule, bind
from beatloop.core.compiled.counters import Counters
from beatloop.core.compiled.loop import CallResult, CompiledLoop
from beatloop.core.compiled.metrics import StepMetrics
from beatloop.core.compiled.step import TrainStep
from beatloop.core.data.batches import DataSplit
from beatloop.core.feeding.stream import DataStream

SPEC = {"x": tf.TensorSpec([None, 3], tf.float32), "y": tf.TensorSpec([None], tf.float32)}


def linear_fit(learning_rate=0.1):
    """A 3-to-1 linear model fitted by squared error with plain SGD, bound."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    def squared_error(models, batch):
        return tf.reduce_mean(tf.square(models["model"](batch["x"])[:, 0] - batch["y"]))

    schedule = Schedule(Beat(loss="mse", optimizer="sgd", updates="model"))
    optimizers = {"sgd": keras.optimizers.SGD(learning_rate)}
    return bind(schedule, {"model": model}, optimizers, {"mse": squared_error}, SPEC)


def batch(rows=4, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "x": tf.constant(rng.normal(size=(rows, 3)), tf.float32),
        "y": tf.constant(rng.normal(size=rows), tf.float32),
    }


def test_one_train_step_is_one_sgd_update_and_reports_its_checks():
    bound = linear_fit()
    model = bound.models["model"]
    kernel, bias = (v.numpy().copy() for v in model.weights)
    data = batch()
    x, y = data["x"].numpy(), data["y"].numpy()
    error = x @ kernel[:, 0] + bias[0] - y
    grad_kernel, grad_bias = 2 * x.T @ error / len(y), 2 * error.mean()

    metrics = StepMetrics(["mse"], {})
    checks, size = TrainStep(bound, metrics, lambda *_: None)(data, tf.constant(0, tf.int64))

    assert int(size) == 4
    new_kernel, new_bias = (v.numpy() for v in model.weights)
    np.testing.assert_allclose(new_kernel[:, 0], kernel[:, 0] - 0.1 * grad_kernel, rtol=1e-5)
    np.testing.assert_allclose(new_bias[0], bias[0] - 0.1 * grad_bias, rtol=1e-5)
    loss, squares = checks.numpy()[0]
    assert loss == pytest.approx(np.mean(error**2), rel=1e-5)
    assert squares == pytest.approx((grad_kernel**2).sum() + grad_bias**2, rel=1e-4)
    assert float(metrics.losses["mse"].result()) == pytest.approx(loss)


def counting_step(fault_at: int | None = None):
    """A step that only counts the batches it sees; its checks turn NaN at step
    ``fault_at`` (by the step number the loop gives it)."""
    seen = tf.Variable(0, dtype=tf.int64)

    def step(batch, number):
        seen.assign_add(1)
        bad = tf.constant(False) if fault_at is None else tf.equal(number, fault_at)
        value = tf.where(bad, float("nan"), 0.0)
        return tf.fill([1, 2], value), tf.shape(batch["x"], out_type=tf.int64)[0]

    return step, seen


def batches(count: int, rows: int = 2) -> tf.data.Dataset:
    x = np.arange(count * rows * 3, dtype=np.float32).reshape(count * rows, 3)
    return tf.data.Dataset.from_tensor_slices({"x": x}).batch(rows)


def test_the_loop_runs_k_steps_a_call_and_advances_the_counters_once_per_call():
    step, seen = counting_step()
    counters = Counters()
    loop = CompiledLoop(step, 4, batches(1).element_spec, checks=1, counters=counters)
    iterator = iter(batches(10))
    ran = [loop(iterator).ran for _ in range(4)]
    assert ran == [4, 4, 2, 0]  # the data's end is a count, not an exception
    assert int(seen) == 10 and int(counters.step) == 10 and int(counters.examples) == 20
    assert int(counters.pass_batches) == 10 and int(counters.epoch_batches) == 10
    assert loop.trace_count == 1  # the K-step loop, at construction; no one-step call yet
    assert loop(iter(batches(3)), limit=1) == CallResult(1)
    assert loop(iter(batches(3)), limit=1) == CallResult(1)
    assert loop.trace_count == 1  # a call of one step runs the same K-step graph
    one = CompiledLoop(step, 1, batches(1).element_spec, checks=1)
    assert [one(iterator).ran for iterator in [iter(batches(2))] * 3] == [1, 1, 0]
    assert one.trace_count == 1  # K=1: the one-step conditional, and only it


def test_the_loop_stops_at_the_first_faulted_step_and_says_which_checks():
    step, seen = counting_step(fault_at=5)
    counters = Counters()
    loop = CompiledLoop(step, 8, batches(1).element_spec, checks=1, counters=counters)
    result = loop(iter(batches(10)))
    # Steps are numbered from 0: step 5 is the sixth; nothing runs after it.
    assert result.ran == 6 and result.faulted and int(seen) == 6
    assert np.isnan(result.checks).all()
    assert int(counters.step) == 6


@pytest.mark.parametrize(("fetch_ahead", "next_batch"), [(True, 7), (False, 6)])
def test_a_faulted_step_leaves_the_next_batch_pulled_only_when_fetching_ahead(
    fetch_ahead, next_batch
):
    # Fetching ahead, the batch after the faulted sixth (batch 6) was asked for while the
    # step ran; a run that goes on after a fault (rollback) fetches after the check.
    step, _ = counting_step(fault_at=5)
    loop = CompiledLoop(step, 8, batches(1).element_spec, checks=1, fetch_ahead=fetch_ahead)
    iterator = iter(batches(10))
    assert loop(iterator).ran == 6
    assert int(next(iterator)["x"][0, 0]) == next_batch * 2 * 3


def test_a_call_status_is_one_integer_for_the_count_and_the_fault():
    @tf.function
    def status(ran, ok):
        return CallResult.status(ran, ok)

    assert CallResult.read(status(7, True), None) == CallResult(7)
    faulted = CallResult.read(status(3, False), tf.ones([1, 2]))
    assert faulted.ran == 3 and faulted.faulted and faulted.checks.tolist() == [[1.0, 1.0]]


def test_the_stream_lets_go_of_a_finished_pass_on_another_thread():
    step, _ = counting_step()
    counters = Counters()
    loop = CompiledLoop(step, 8, batches(1).element_spec, checks=1, counters=counters)
    unknown_length = batches(5).filter(lambda batch: True)  # so a pass has an end
    stream = DataStream(DataSplit(unknown_length), counters)
    assert stream.train(loop, 8).ran == 5
    destroyed_on = []
    record_thread = lambda: destroyed_on.append(threading.current_thread().name)  # noqa: E731
    weakref.finalize(stream._current[0], record_thread)
    stream.end_pass()
    stream.wait()
    assert destroyed_on == ["beatloop-iterator-release"]
    assert int(counters.passes) == 1 and int(counters.pass_batches) == -1


def test_the_stream_repositions_at_the_counted_batch_of_the_counted_pass():
    def reshuffled():  # a new order each pass, the same orders for each copy
        return tf.data.Dataset.range(6).shuffle(6, seed=1).map(lambda v: {"x": [v]})

    data = reshuffled()
    passes = [[int(b["x"][0]) for b in data] for _ in range(2)]
    assert passes[0] != passes[1]  # so which pass the stream is in matters
    counters = Counters()
    counters.passes.assign(2)
    counters.pass_batches.assign(3)
    stream = DataStream(DataSplit(reshuffled()), counters)
    stream.reposition()  # the 4th batch of the 2nd pass comes next
    following = [int(b["x"][0]) for b in itertools.islice(stream._current[0], 3)]
    assert following == passes[1][3:]


def test_passes_of_known_length_are_one_iterator_s_repetitions_in_the_same_order():
    def reshuffled():  # a new order each pass, the same orders for each copy
        return tf.data.Dataset.range(6).shuffle(6, seed=1).map(lambda v: {"x": [[v]]})

    data = reshuffled()
    passes = [[int(b["x"][0, 0]) for b in data] for _ in range(3)]
    seen = tf.Variable(tf.zeros([18], tf.int64))

    def recording_step(batch, number):
        seen.scatter_nd_update([[number]], [batch["x"][0, 0]])
        return tf.zeros([1, 2]), tf.constant(1, tf.int64)

    counters = Counters()
    loop = CompiledLoop(recording_step, 4, data.element_spec, checks=1, counters=counters)
    stream = DataStream(DataSplit(reshuffled()), counters)
    ran = []
    for _ in range(3):  # as the engine runs epochs without steps_per_epoch
        ran += [stream.train(loop, 4).ran, stream.train(loop, 4).ran, stream.train(loop, 4).ran]
        iterator = stream._current[0]
        stream.end_pass()
        assert stream._current[0] is iterator  # kept, not let go of
    assert ran == [4, 2, 0] * 3  # no call crosses the end of a pass
    assert seen.numpy().tolist() == passes[0] + passes[1] + passes[2]
    assert int(counters.passes) == 3 and int(counters.step) == 18
