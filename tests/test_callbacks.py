"""Built-in callbacks: progress bar on a terminal and off one, log files in the run dir."""

import io
import json

from conftest import tuple_batches

import beatloop


class Terminal(io.StringIO):
    """A text stream that says it is a terminal, as a console would."""

    def isatty(self):
        return True


def test_progress_bar_shows_losses_and_throughput_on_a_terminal(small_digits):
    train, _ = small_digits
    screen = Terminal()
    bar = beatloop.ProgressBar(stream=screen, refresh_seconds=0.0)
    beatloop.fit("supervised", data=tuple_batches(train, 20), epochs=2, seed=0, callbacks=[bar])
    text = screen.getvalue()
    assert "examples/s" in text and "loss " in text and "10/10" in text
    assert "epoch 2/2  loss" in text


def test_progress_bar_prints_one_line_per_epoch_elsewhere(small_digits):
    train, validation = small_digits
    log = io.StringIO()
    beatloop.fit(
        "supervised",
        data=(tuple_batches(train, 20), tuple_batches(validation, 20)),
        epochs=3,
        seed=0,
        callbacks=[beatloop.ProgressBar(stream=log)],
    )
    lines = log.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    assert all("val_accuracy" in line and "examples/s" in line for line in lines)


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
    records = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in records] == result.history["loss"]
    rows = (run_dir / "history.csv").read_text().splitlines()
    assert rows[0] == "epoch,step,loss,accuracy" and len(rows) == 3
    assert rows[2].startswith("2,8,")
