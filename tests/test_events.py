"""Callback order and event filters: who runs first at an event, and when a filtered
event method runs (every N epochs or steps, or once)."""

from __future__ import annotations

import pytest
from helpers import tuple_batches

import beatloop
from beatloop import Callback, CallbackError, Order, when
from beatloop.core.events.callbacks import CallbackList


class Named(Callback):
    """Appends its name to ``seen`` at every epoch end."""

    def __init__(self, name: str, seen: list, order: int = Order.DEFAULT):
        self.name, self.seen, self.order = name, seen, order

    def on_epoch_end(self, run, epoch, logs):
        self.seen.append(self.name)


def test_callbacks_run_by_order_then_by_position():
    seen: list[str] = []
    given = [
        Named("writer", seen, Order.WRITER),
        Named("plain 1", seen),
        Named("producer", seen, Order.PRODUCER),
        Named("figures", seen, Order.FIGURES),
        Named("plain 2", seen),
    ]
    CallbackList(given).fire("epoch_end", None, 0, {})
    assert seen == ["figures", "producer", "plain 1", "plain 2", "writer"]


def test_figures_a_callback_adds_reach_every_writer(small_digits, tmp_path):
    train, _ = small_digits

    class Doubled(Callback):
        """Adds a figure to the epoch's logs; listed after the writers it must reach."""

        def on_epoch_end(self, run, epoch, logs):
            logs["loss_doubled"] = 2 * logs["loss"]

    csv = beatloop.CsvLogger()
    result = beatloop.fit(
        "supervised", data=tuple_batches(train, 50), epochs=2, seed=0, run_dir=tmp_path,
        callbacks=[csv, Doubled()],
    )  # fmt: skip
    doubled = result.history["loss_doubled"]
    assert doubled == [2 * loss for loss in result.history["loss"]]
    header, *rows = (tmp_path / "history.csv").read_text().splitlines()
    column = header.split(",").index("loss_doubled")
    assert [float(row.split(",")[column]) for row in rows] == pytest.approx(doubled)


def test_the_gan_grid_is_made_before_tensorboard_writes_it_whatever_the_list(tmp_path):
    """TensorBoard (a writer) shows the sample grid of the epoch it writes, though the
    recipe's grid callback is added after the user's callbacks."""
    import tensorflow as tf

    from beatloop.datasets import digits_arrays

    train, _ = digits_arrays(0, signed=True)
    data = tf.data.Dataset.from_tensor_slices({"x": train["x"][:64]}).batch(32)
    beatloop.fit(
        "gan", data=data, epochs=2, seed=0, run_dir=tmp_path, callbacks=[beatloop.TensorBoard()]
    )
    written = {}
    for path in (tmp_path / "tensorboard").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "images/samples":
                    written[event.step] = tf.io.decode_png(value.tensor.string_val[2]).numpy()
    grids = {
        step: tf.io.decode_png(tf.io.read_file(str(tmp_path / "samples" / f"epoch_00{step}.png")))
        for step in (1, 2)
    }
    assert sorted(written) == [1, 2]
    for step in (1, 2):  # each epoch's image is that epoch's grid, not the one before
        assert (written[step] == grids[step].numpy()).all()
    assert not (grids[1].numpy() == grids[2].numpy()).all()


class Filtered(Callback):
    """Records when its filtered methods run."""

    def __init__(self):
        self.epochs, self.once, self.steps, self.step_once = [], [], [], []

    @when(every=2)
    def on_epoch_end(self, run, epoch, logs):
        self.epochs.append(epoch)

    @when(once=3)
    def on_epoch_start(self, run, epoch):
        self.once.append(epoch)

    @when(every=5)
    def on_execution_end(self, run, steps, logs):
        self.steps.append(run.step)


class StepOnce(Callback):
    def __init__(self):
        self.seen = []

    @when(once=7)
    def on_execution_end(self, run, steps, logs):
        self.seen.append(run.step)


def test_filters_count_epochs_and_steps(small_digits):
    train, _ = small_digits
    filtered, once = Filtered(), StepOnce()
    beatloop.fit(
        "supervised", data=tuple_batches(train, 50), epochs=5, seed=0, steps_per_execution=2,
        callbacks=[filtered, once],
    )  # fmt: skip
    # 4 steps an epoch in calls of 2: calls end at steps 2, 4, 6, ..., 20.
    assert filtered.epochs == [1, 3]  # the 2nd and 4th epochs (epoch counts from 0)
    assert filtered.once == [2]  # the 3rd epoch's start, only
    assert filtered.steps == [6, 10, 16, 20]  # the first call end at or past 5, 10, 15, 20
    assert once.seen == [8]


def test_filters_are_stateless_so_a_resumed_run_keeps_the_rhythm():
    from beatloop.core.events.callbacks import EventFilter

    every = EventFilter(every=4)

    class At:
        def __init__(self, step, epoch=0):
            self.step, self.epoch = step, epoch

    # An execution end that ran 3 steps to step 9 (6 -> 9) passes 8; 9 -> 11 passes none.
    assert every.admits("execution_end", At(9), (3,))
    assert not every.admits("execution_end", At(11), (2,))
    assert every.admits("epoch_end", At(0), (3,))  # the 4th epoch
    assert not EventFilter(once=4).admits("epoch_end", At(0), (4,))  # the 5th


def test_filters_refuse_what_they_cannot_count():
    with pytest.raises(CallbackError, match="on_fit_start, which cannot be filtered"):

        class Early(Callback):
            @when(every=2)
            def on_fit_start(self, run):
                pass

    with pytest.raises(CallbackError, match="one of every=N or once=N"):
        when(every=2, once=3)
    with pytest.raises(CallbackError, match=r"every=\.\.\.\) takes an integer >= 1, got 0"):
        when(every=0)
