"""Built-in callbacks: progress bar on a terminal and off one, log files in the run dir."""

import io

import pytest
from helpers import (
    assert_same_weights,
    gan_data,
    history_records,
    model_weights,
    same_weights,
    tuple_batches,
)

import beatloop


class Terminal(io.StringIO):
    """A text stream that says it is a terminal, as a console would."""

    def isatty(self):
        return True


def test_progress_bar_shows_losses_and_throughput_on_a_terminal(small_digits):
    train, _ = small_digits
    screen = Terminal()
    bar = beatloop.ProgressBar(stream=screen, refresh_seconds=0.0)
    result = beatloop.fit(
        "supervised", data=tuple_batches(train, 20), epochs=2, seed=0, callbacks=[bar]
    )
    text = screen.getvalue()
    assert "examples/s" in text and "10/10" in text  # the bar ran to the epoch's end
    loss, accuracy = result.history["loss"], result.history["accuracy"]
    for epoch in range(2):  # each epoch ends in a line of its logged figures
        summary = f"epoch {epoch + 1}/2  loss {loss[epoch]:.4g}  accuracy {accuracy[epoch]:.4g}  ("
        assert summary in text


def test_progress_bar_prints_one_line_per_epoch_elsewhere(small_digits):
    train, validation = small_digits
    log = io.StringIO()
    result = beatloop.fit(
        "supervised",
        data=(tuple_batches(train, 20), tuple_batches(validation, 20)),
        epochs=3,
        seed=0,
        callbacks=[beatloop.ProgressBar(stream=log)],
    )
    lines = log.getvalue().splitlines()
    assert len(lines) == 3
    for epoch, line in enumerate(lines):  # the epoch's logged figures, in their order
        figures = "  ".join(f"{name} {v[epoch]:.4g}" for name, v in result.history.items())
        assert line.startswith(f"epoch {epoch + 1}/3  {figures}  ("), line
        assert line.endswith(" examples/s)"), line


def test_log_files_hold_each_epoch_once(small_digits, tmp_path):
    train, _ = small_digits
    run_dir = tmp_path / "run"
    result = beatloop.fit(
        "supervised",
        data=tuple_batches(train, 50),
        epochs=2,
        seed=0,
        run_dir=run_dir,
        callbacks=[beatloop.JsonLinesLogger(run_dir / "history.jsonl"), beatloop.CsvLogger()],
    )
    records = history_records(run_dir)
    assert [r["loss"] for r in records] == result.history["loss"]
    rows = (run_dir / "history.csv").read_text().splitlines()
    assert rows[0] == "epoch,step,loss,accuracy" and len(rows) == 3
    assert rows[2].startswith("2,8,")


def test_early_stopping_stops_and_restores_the_best_weights(small_digits):
    train, _ = small_digits
    snapshots = {}

    class Snapshot(beatloop.Callback):
        def on_epoch_end(self, run, epoch, logs):
            snapshots[epoch] = model_weights(run.models["model"])

    # The training loss falls every epoch, so with mode "max" epoch 0 stays the best.
    stopper = beatloop.EarlyStopping(monitor="loss", mode="max", patience=2)
    result = beatloop.fit(
        "supervised", data=tuple_batches(train, 20), epochs=10, seed=0,
        callbacks=[Snapshot(), stopper],
    )  # fmt: skip
    assert result.epochs == 3 and len(result.history["loss"]) == 3
    assert stopper.best_epoch == 0 and stopper.stopped_epoch == 2
    assert_same_weights(snapshots[0], model_weights(result.models["model"]))
    assert not same_weights(snapshots[2], snapshots[0])


def test_early_stopping_modes_and_bad_monitor(small_digits):
    train, _ = small_digits
    assert beatloop.EarlyStopping("val_accuracy").mode == "max"
    assert beatloop.EarlyStopping("val_loss").mode == "min"
    with pytest.raises(beatloop.ConfigError, match="monitors 'val_acc', which this run does not"):
        beatloop.fit(
            "supervised", data=tuple_batches(train, 50),
            callbacks=[beatloop.EarlyStopping("val_acc")],
        )  # fmt: skip


def test_tensorboard_scalars_learning_rates_and_images_read_back(tmp_path):
    import tensorflow as tf

    from beatloop.callbacks.tensorboard import read_scalars

    result = beatloop.fit(
        "gan", data=gan_data(320), epochs=2, seed=0, run_dir=tmp_path,
        callbacks=[beatloop.TensorBoard(update_every=4)],
    )  # fmt: skip
    scalars = read_scalars(tmp_path / "tensorboard")
    for name in ("d_loss", "g_loss", "d_real", "sample_score"):
        logged = [value for _, value in scalars[f"epoch/{name}"]]
        assert logged == pytest.approx(result.history[name], rel=1e-6)
    assert [step for step, _ in scalars["epoch/d_loss"]] == [1, 2]
    assert scalars["learning_rate/d_optimizer"][0][1] == pytest.approx(1e-3)
    assert [step for step, _ in scalars["step/g_loss"]] == [4, 8, 12, 16, 20]
    images = []
    for path in (tmp_path / "tensorboard").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            images += [v.tag for v in event.summary.value if v.tag.startswith("images/")]
    assert images == ["images/samples", "images/samples"]


def test_learning_rate_schedules_drive_the_optimizer(small_digits, tmp_path):
    import keras

    from beatloop.callbacks.tensorboard import read_scalars

    train, _ = small_digits
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=10, decay_rate=0.5)
    beatloop.fit(
        "supervised", data=tuple_batches(train, 20), epochs=2, seed=0, run_dir=tmp_path,
        optimizers={"optimizer": keras.optimizers.Adam(schedule)},
        callbacks=[beatloop.TensorBoard()],
    )  # fmt: skip
    rates = [
        value for _, value in read_scalars(tmp_path / "tensorboard")["learning_rate/optimizer"]
    ]
    assert rates == pytest.approx([0.01 * 0.5**1, 0.01 * 0.5**2], rel=1e-6)  # 10, 20 steps
