"""The engine: compiled loop, step counter, beats' repeat/every/transform/training,
validation in inference mode, events, and debug mode."""

import gc
import subprocess
import sys
import threading
import time
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    CountExecutions,
    TwoModels,
    assert_close_weights,
    assert_same_weights,
    classifier,
    model_weights,
    tuple_batches,
)

import beatloop
from beatloop import Callback, ClipByValue, Schedule, UserCodeError
from beatloop.core.data.batches import as_data_split
from beatloop.core.running.engine import Engine, EngineOptions


def engine_for(train, validation=None, model=None, options=None, callbacks=(), lr=1e-2):
    recipe = beatloop.make_recipe("supervised", {"hidden": 16})
    return Engine(
        recipe,
        as_data_split((train, validation)),
        models={"model": model or classifier()},
        optimizers={"optimizer": keras.optimizers.Adam(lr)},
        options=options or EngineOptions(),
        callbacks=callbacks,
    )


def test_short_last_batch_does_not_retrace(small_digits):
    train, validation = small_digits
    engine = engine_for(tuple_batches(train, 64), tuple_batches(validation, 64))  # 64,64,64,8
    engine.fit(3)
    # K is 1: each loop traced its one-step function once, when it was built, and never
    # its K-step one.
    assert engine.train_loop.trace_count == 1
    assert engine.validation_loop.trace_count == 1
    assert int(engine.state.step) == 3 * 4
    assert int(engine.state.examples) == 3 * 200


@pytest.mark.parametrize("k", [3, 32])
def test_steps_per_execution_runs_k_steps_per_call_with_identical_results(small_digits, k):
    train, _ = small_digits
    counted = CountExecutions()
    one = engine_for(tuple_batches(train, 16), model=classifier(seed=1))
    one.fit(2)
    many = engine_for(
        tuple_batches(train, 16),
        model=classifier(seed=1),
        options=EngineOptions(steps_per_execution=k),
        callbacks=[counted],
    )
    many.fit(2)
    steps_per_epoch = 13  # 200 / 16, rounded up
    full, rest = divmod(steps_per_epoch, k)
    assert counted.steps == 2 * ([k] * full + [rest])
    assert int(many.state.step) == int(one.state.step) == 2 * steps_per_epoch
    assert_close_weights(
        model_weights(one.bound.models["model"]),
        model_weights(many.bound.models["model"]),
        rtol=1e-6,
        atol=1e-7,
    )


def test_validation_runs_in_inference_mode_and_touches_no_variable(small_digits):
    train, validation = small_digits
    model = classifier(extra_layers=[keras.layers.BatchNormalization(), keras.layers.Dropout(0.5)])
    engine = engine_for(tuple_batches(train, 32), tuple_batches(validation, 32), model=model)
    engine.fit(1)
    every_variable = [*model.weights, *engine.bound.optimizers["optimizer"].variables]
    every_variable += [engine.state.step, engine.state.epoch]
    before = [np.array(v.numpy()) for v in every_variable]
    logs = engine.validate(engine.run)
    for b, v in zip(before, every_variable, strict=True):
        np.testing.assert_array_equal(b, v.numpy())
    # Inference mode: dropout off, batch-norm moving statistics used.
    logits = model(validation["x"], training=False)
    expected = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(validation["y"], logits)
    assert logs["val_loss"] == pytest.approx(float(expected), rel=1e-5)
    accuracy = np.mean(np.argmax(logits, axis=1) == validation["y"])
    assert logs["val_accuracy"] == pytest.approx(accuracy)


def test_validation_metrics_reset_each_epoch(small_digits):
    train, validation = small_digits
    model = classifier()
    engine = engine_for(tuple_batches(train, 32), tuple_batches(validation, 32), model=model)
    logs = engine.fit(3)
    logits = model(validation["x"], training=False)
    expected = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(validation["y"], logits)
    # Only the last epoch's validation counts: a running mean over epochs would differ.
    assert logs["val_loss"] == pytest.approx(float(expected), rel=1e-5)


def test_events_fire_in_order(small_digits):
    train, validation = small_digits
    seen = []

    class Recorder(Callback):
        def on_fit_start(self, run):
            seen.append("fit_start")

        def on_epoch_start(self, run, epoch):
            seen.append(f"epoch_start {epoch}")

        def on_execution_start(self, run):
            seen.append("execution_start")

        def on_execution_end(self, run, steps, logs):
            seen.append(f"execution_end {steps} {run.step}")

        def on_validation_start(self, run):
            seen.append("validation_start")

        def on_validation_end(self, run, logs):
            seen.append(f"validation_end {sorted(logs)}")

        def on_epoch_end(self, run, epoch, logs):
            seen.append(f"epoch_end {epoch} {sorted(logs)}")

        def on_fit_end(self, run, logs):
            seen.append("fit_end")

    engine = engine_for(
        tuple_batches(train, 100),
        tuple_batches(validation, 100),
        options=EngineOptions(steps_per_execution=2),
        callbacks=[Recorder()],
    )
    engine.fit(2)
    epoch = [
        "execution_start",
        "execution_end 2 {}",  # the data set's length is known: no empty call after it
        "validation_start",
        "validation_end ['val_accuracy', 'val_loss']",
    ]
    logs = "['accuracy', 'loss', 'val_accuracy', 'val_loss']"
    assert seen == [
        "fit_start",
        "epoch_start 0",
        *[e.format(2) for e in epoch],
        f"epoch_end 0 {logs}",
        "epoch_start 1",
        *[e.format(4) for e in epoch],
        f"epoch_end 1 {logs}",
        "fit_end",
    ]


def test_exception_event_fires_and_error_propagates(small_digits):
    train, _ = small_digits
    errors = []

    class Stopper(Callback):
        def on_execution_end(self, run, steps, logs):
            raise RuntimeError("stop here")

        def on_exception(self, run, error):
            errors.append(error)

    engine = engine_for(tuple_batches(train, 32), callbacks=[Stopper()])
    with pytest.raises(UserCodeError, match="callback 'Stopper' in on_execution_end failed: Run"):
        engine.fit(1)
    # on_exception sees the error the run raises; the callback's own is its cause
    assert len(errors) == 1 and isinstance(errors[0], UserCodeError)
    assert type(errors[0].__cause__) is RuntimeError and str(errors[0].__cause__) == "stop here"


def test_stop_training_ends_after_the_epoch(small_digits):
    train, _ = small_digits

    class StopAfterFirst(Callback):
        def on_epoch_end(self, run, epoch, logs):
            run.stop_training = True

    engine = engine_for(tuple_batches(train, 50), callbacks=[StopAfterFirst()])
    engine.fit(5)
    assert int(engine.state.epoch) == 1 and int(engine.state.step) == 4


def test_fit_again_on_one_engine_trains_as_one_longer_fit(small_digits):
    """A second ``fit`` continues the kept training iterator: a shuffled pipeline gives the
    same batches as one fit of all the epochs (rebuilding the iterator from the same
    ``tf.data`` object would draw later shuffle orders)."""
    train, _ = small_digits

    def shuffled():
        data = tf.data.Dataset.from_tensor_slices((train["x"], train["y"]))
        return data.shuffle(200, seed=3).batch(40)

    keras.utils.set_random_seed(0)
    twice = engine_for(shuffled())
    twice.fit(1)
    twice.fit(3)
    keras.utils.set_random_seed(0)
    once = engine_for(shuffled())
    once.fit(3)
    assert int(twice.state.step) == int(once.state.step) == 15
    assert_same_weights(
        model_weights(twice.bound.models["model"]), model_weights(once.bound.models["model"])
    )


def _destroyed_on(iterator) -> list[str]:
    """Fills with the name of the thread that destroys ``iterator``."""
    threads: list[str] = []
    weakref.finalize(iterator, lambda: threads.append(threading.current_thread().name))
    return threads


def _wait_for(threads: list[str]) -> list[str]:
    deadline = time.monotonic() + 60
    while not threads and time.monotonic() < deadline:
        time.sleep(0.05)
    return threads


def test_a_freed_engine_destroys_its_kept_iterator_on_a_thread_of_its_own(small_digits):
    """Destroying a ``tf.data`` iterator waits for its autotuning thread (up to a minute):
    a garbage collection freeing a forgotten engine must not wait for it."""
    train, _ = small_digits
    engine = engine_for(tuple_batches(train, 50))
    engine.fit(1)
    threads = _destroyed_on(engine.stream._current[0])
    engine.itself = engine  # only a collection frees it
    del engine
    gc.collect()
    assert _wait_for(threads) == ["beatloop-iterator-release"]


def test_a_process_exiting_waits_for_the_iterators_being_destroyed_apart(tmp_path):
    """A thread still inside a destructor when the interpreter shuts down would be unwound
    through it (an abort in TensorFlow's): exit waits for them. A slow destructor stands in
    for the iterator's."""
    done = tmp_path / "destroyed"
    code = f"""
import time
from beatloop.core.feeding.letting_go import APART, release_apart

class Slow:
    def __del__(self):
        time.sleep(1.5)
        open({str(done)!r}, "w").write("yes")

APART.start()  # as a data stream does when it is made
release_apart([Slow()])
"""
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    assert done.read_text() == "yes"


def test_a_forked_child_starts_its_own_releasing_thread():
    code = """
import os
from beatloop.core.feeding.letting_go import APART

APART.start()
pid = os.fork()
if pid == 0:
    os._exit(10 + APART.started)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), APART.started)
"""
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert finished.stdout.split() == ["10", "True"], finished.stderr


@pytest.mark.slow  # a fresh interpreter that forks
def test_a_forked_child_never_destroys_the_iterators_its_parent_had_queued():
    """An iterator queued for release when the process forks (a ``subprocess`` with a
    ``preexec_fn`` forks) is the parent's to destroy: destroyed in the child, it waits
    for threads the child does not have, and the child hangs before its ``exec``."""
    code = """
import os, threading, time
import tensorflow as tf
from beatloop.core.feeding.letting_go import ProcessReleaser

releaser = ProcessReleaser()
releaser.start()
gate = threading.Event()

class Held(list):
    def clear(self):  # the releasing thread still busy with an earlier iterator
        gate.wait()
        super().clear()

releaser.release(Held([object()]))
iterator = iter(tf.data.Dataset.range(100).map(lambda x: x + 1).prefetch(4))
next(iterator)
releaser.release([iterator])  # queued behind it when the process forks
del iterator
pid = os.fork()
if pid == 0:
    os._exit(7)
deadline = time.monotonic() + 60
while not (done := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
    time.sleep(0.05)
if not done[0]:
    os.kill(pid, 9)
print(os.waitstatus_to_exitcode(done[1]) if done[0] else "hung")
gate.set()
releaser.wait()
"""
    finished = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180
    )
    assert finished.stdout.split() == ["7"], finished.stderr[-2000:]


def test_a_kept_error_holds_no_iterator_and_the_caller_s_frames_keep_their_locals(small_digits):
    """An error kept after a failed fit (in a notebook, by ``pytest.raises``) must not keep
    the iterator alive in its traceback's frames, for a later collection to wait on."""
    train, _ = small_digits
    engine = engine_for(tuple_batches(dict(train, y=np.full_like(train["y"], 99)), 50))
    with pytest.raises(beatloop.DataError, match="99") as caught:
        engine.fit(1)
    assert caught.tb.tb_frame.f_locals["engine"] is engine  # the caller's frame is untouched
    iterator = engine.stream._current.pop()
    threads = _destroyed_on(iterator)
    del iterator  # the stream let go of it: nothing in the kept error holds it
    assert threads == [threading.current_thread().name]
    assert isinstance(caught.value.__context__, tf.errors.InvalidArgumentError)  # kept whole


def test_misspelled_event_method_is_an_error():
    with pytest.raises(
        beatloop.CallbackError, match=r"on_epoch_ends .*did you mean 'on_epoch_end'"
    ):

        class Typo(Callback):
            def on_epoch_ends(self, run, epoch, logs):
                pass


def test_debug_mode_runs_eagerly_and_stops_on_non_finite_loss(small_digits):
    train, _ = small_digits
    eager = engine_for(
        tuple_batches(train, 50), options=EngineOptions(debug=True), model=classifier(seed=2)
    )
    eager.fit(1)
    compiled = engine_for(tuple_batches(train, 50), model=classifier(seed=2))
    compiled.fit(1)
    assert_close_weights(
        model_weights(eager.bound.models["model"]),
        model_weights(compiled.bound.models["model"]),
        rtol=1e-5,
        atol=1e-6,
    )

    poisoned = dict(train)
    poisoned["x"] = train["x"].copy()
    poisoned["x"][70, 3] = np.inf  # in the second batch of 50
    engine = engine_for(tuple_batches(poisoned, 50), options=EngineOptions(debug=True))
    with pytest.raises(
        beatloop.NumericsError,
        match=r"beat 'loss' produced a non-finite loss \(nan\) at step 2, before its update",
    ):  # the second batch: step 2, numbered from 1 as in compiled runs
        engine.fit(1)


# --- two models, each fitted by its own beat: repeat, every, transforms and training modes


def two_heads(schedule):
    """Two linear models fitted to the digit label from the same pixels, through dropout,
    so whether a model runs in training mode changes what it computes."""
    return TwoModels(schedule, inputs=("x", "x"), dropout=0.5, learning_rate=0.1)


def test_repeat_every_and_the_step_counter(small_digits):
    train, _ = small_digits
    schedule = Schedule((TwoModels.beat("a", repeat=3), TwoModels.beat("b", every=2)))
    engine = Engine(two_heads(schedule), as_data_split(tuple_batches(train, 40)))  # 5 steps/epoch
    engine.fit(2)
    optimizers = engine.bound.optimizers
    assert int(engine.state.step) == 10
    assert int(optimizers["opt_a"].iterations) == 30  # applies, not steps
    assert int(optimizers["opt_b"].iterations) == 5  # steps 0, 2, 4, 6, 8


def test_each_beat_updates_only_its_variables_with_its_transform(small_digits):
    train, _ = small_digits
    schedule = Schedule(TwoModels.beat("a", transform=ClipByValue(1e-3)), frozen="b")
    engine = Engine(two_heads(schedule), as_data_split(tuple_batches(train, 40)))
    models = engine.bound.models
    a_before, b_before = model_weights(models["a"]), model_weights(models["b"])
    engine.fit(1)
    assert_same_weights(b_before, model_weights(models["b"]))
    # SGD(0.1) applied 5 times to gradients clipped to ±1e-3 moves each weight ≤ 5e-4.
    moved = [
        np.abs(after - before).max()
        for before, after in zip(a_before, model_weights(models["a"]), strict=True)
    ]
    assert max(moved) == pytest.approx(5 * 0.1 * 1e-3, rel=1e-3)


def test_training_mode_defaults_to_updated_models_and_can_be_declared(small_digits):
    train, validation = small_digits
    schedule = Schedule((TwoModels.beat("a"), TwoModels.beat("b", training=("a", "b"))))
    recipe = two_heads(schedule)
    engine = Engine(
        recipe, as_data_split((tuple_batches(train, 100), tuple_batches(validation, 100)))
    )
    engine.fit(1)  # the modes are recorded when the steps are traced
    assert ("a", True, False) in recipe.modes and ("b", True, True) in recipe.modes
    assert ("a", False, False) in recipe.modes and ("b", False, False) in recipe.modes  # validation
    assert len(set(recipe.modes)) == 4


@pytest.mark.parametrize("known_length", [True, False], ids=["known", "unknown-length"])
def test_an_epoch_starting_where_a_pass_ended_reads_the_next_pass(
    small_digits, tmp_path, known_length
):
    """12 batches a pass, 4 steps an epoch: epoch 3 ends with the first pass, and epoch 4
    reads the second from its start (it was "no batches"); resumed there, the same."""
    train, validation = small_digits  # 200 examples: 12 batches of 17 (the last 13)
    data = tuple_batches(train, 17)
    if not known_length:
        data = data.filter(lambda x, y: True)  # TensorFlow can no longer count it
    assert (int(data.cardinality()) == 12) == known_length
    passes = []

    class Passes(Callback):
        def on_epoch_end(self, run, epoch, logs):
            passes.append(int(run.state.passes))

    def fit(epochs, run_dir=None, callbacks=()):
        return beatloop.fit(
            "supervised", data=(data, tuple_batches(validation, 50)),
            models={"model": classifier()}, steps_per_epoch=4, epochs=epochs, seed=0,
            run_dir=run_dir, progress=False, callbacks=list(callbacks),
        )  # fmt: skip

    whole = fit(5, callbacks=[Passes()])
    assert whole.steps == 20 and passes == [1, 1, 1, 2, 2]
    fit(3, tmp_path / "run")
    resumed = fit(5, tmp_path / "run")
    assert resumed.history["loss"] == whole.history["loss"]
    mine, theirs = resumed.models["model"], whole.models["model"]
    assert_same_weights(model_weights(mine), model_weights(theirs))
