"""Edges of issue 34, each ending as the BeatloopError it is: data of unknown shape, a
transform's gradients of the wrong shape, a combination's unknown reduction, misused
``all_gather``, a torn history row of the checkpoint's own epoch, a disk full before the
run starts, and callbacks' fit events on a run dir that is done already."""

from __future__ import annotations

import errno

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import history_records

import beatloop
from beatloop.core.failures.errors import ConfigError, DataError, RunDirError, ScheduleError

TINY = ["--set", "hidden=8", "--set", "batch_size=256", "--seed", "0", "--quiet"]


def cli(argv, capsys) -> tuple[int, str]:
    """``beatloop ARGV`` in this process: its exit code and standard error."""
    from beatloop.cli import main

    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


class Dense(beatloop.Recipe):
    """One Dense layer fit by a mean-squared loss, with a beat's ``transform`` or, for
    ``gathered``, what the loss also gathers (a misuse)."""

    name = "dense"
    batch_keys = {"x": 2}

    def __init__(self, transform=None, gathered=None):
        super().__init__()
        self.transform, self.gathered = transform, gathered

    def build_models(self, spec):
        return {"dense": keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.1)}

    def losses(self):
        return {"loss": self.loss}

    def loss(self, models, batch):
        z = models["dense"](batch["x"])
        extra = [] if self.gathered is None else tf.nest.flatten(self.gathered(models, z))
        return tf.add_n([tf.reduce_mean(z**2), *(tf.reduce_mean(t) for t in extra)])

    def schedule(self):
        return beatloop.Schedule(beatloop.Beat("loss", "sgd", "dense", transform=self.transform))


def rows() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices({"x": np.ones((10, 4), "float32")}).batch(4)


# --- 1. a data set of unknown shape ------------------------------------------------------


def test_a_py_function_output_of_unknown_shape_is_a_data_error_saying_to_set_it(small_digits):
    train, _ = small_digits

    def load(x, y, shape=None):
        x = tf.py_function(lambda t: t * 1.0, [x], tf.float32)
        if shape is not None:
            x.set_shape(shape)  # the advice, followed
        return x, y

    def data(shape=None):
        pairs = tf.data.Dataset.from_tensor_slices((train["x"][:64], train["y"][:64]))
        return pairs.map(lambda x, y: load(x, y, shape)).batch(32)

    with pytest.raises(DataError) as caught:
        beatloop.fit("supervised", data=data(), epochs=1, progress=False)
    assert caught.value.exit_code == 3
    assert str(caught.value).splitlines()[0] == (
        "the training data set's 'x' has an unknown shape (not even its number of dimensions: "
        "a tf.py_function or tf.numpy_function output has none); set it in the function "
        "that makes it, before .batch(): e.g. value.set_shape([64]) or value = "
        "tf.ensure_shape(value, [64]) for examples of 64 values (None for a size that varies)"
    )
    result = beatloop.fit("supervised", data=data([64]), epochs=1, progress=False)
    assert result.steps == 2


# --- 2. gradients of the wrong shape; a combination's unknown reduction -------------------


def flattened(gradients, variables):
    return [tf.reshape(g, [-1]) for g in gradients]


def test_a_transform_returning_gradients_of_the_wrong_shape_names_beat_variable_and_shapes():
    with pytest.raises(ScheduleError) as caught:
        beatloop.fit(Dense(transform=flattened), data=rows(), epochs=1, progress=False)
    assert caught.value.exit_code == 2
    assert str(caught.value).splitlines() == [
        "the schedule has 1 problem(s):",
        "  - beat 'loss': transform flattened returned a gradient of shape (12,) for variable "
        "'sequential/dense/kernel' of shape (4, 3); return each gradient in its variable's "
        "shape, in the variables' order",
    ]


def test_a_combine_returning_gradients_of_the_wrong_shape_names_group_variable_and_shapes():
    from test_combine import Shared, shared_data

    def transposed(gradients, variables):
        return [tf.transpose(g1 + g2) for g1, g2 in zip(*gradients, strict=True)]

    with pytest.raises(ScheduleError) as caught:
        beatloop.fit(Shared(transposed), data=shared_data().batch(4), seed=0, progress=False)
    assert str(caught.value).splitlines()[1] == (
        "  - group 'both': combine test_a_combine_returning_gradients_of_the_wrong_shape_names_"
        "group_variable_and_shapes.<locals>.transposed returned a gradient of shape (1, 4) for "
        "variable 'a/dense/kernel' of shape (4, 1); return each gradient in its variable's "
        "shape, in the variables' order"
    )


def test_pcgrad_with_an_unknown_reduction_says_the_ones_it_takes():
    with pytest.raises(ConfigError) as caught:
        beatloop.PCGrad(reduction="max")
    assert caught.value.exit_code == 2
    assert str(caught.value) == "PCGrad(reduction=...) takes 'sum' or 'mean'; got 'max'"
    with pytest.raises(ConfigError, match=r"^ClipByNorm\(norm=...\) takes a number above 0; got"):
        beatloop.ClipByNorm(-1.0)


# --- 3. all_gather misused ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("gathered", "words"),
    [
        (lambda m, z: m.all_gather(tf.reduce_sum(z))[None], "ValueError: models.all_gather(x) "
         "gathers per-example rows, got a scalar (shape ()) of float32"),
        (lambda m, z: m.all_gather(tf.RaggedTensor.from_tensor(z)).flat_values, "TypeError: "
         "models.all_gather(x) gathers dense tensors, got a tf.RaggedTensor of shape (None, 3)"),
    ],
)  # fmt: skip
def test_all_gather_of_a_scalar_or_a_ragged_tensor_is_the_loss_s_user_code_error(gathered, words):
    with pytest.raises(beatloop.UserCodeError) as caught:
        beatloop.fit(Dense(gathered=gathered), data=rows(), epochs=1, progress=False)
    assert not isinstance(caught.value, DataError) and caught.value.exit_code == 2
    first = str(caught.value).splitlines()[0]
    head = (
        "recipe 'dense': loss 'loss' of beat 'loss' failed on batches of {x: (None, 4) float32}: "
    )
    assert first.startswith(head + words), first
    assert isinstance(caught.value.__cause__, ValueError | TypeError)


# --- 4. a torn history row of the checkpoint's own epoch ---------------------------------


def test_a_torn_history_row_of_the_checkpoint_s_epoch_is_written_back_on_resume(
    tmp_path, small_digits
):
    train, _ = small_digits
    data = (tf.data.Dataset.from_tensor_slices((train["x"], train["y"])).batch(100), None)
    run_dir = tmp_path / "run"

    def run(epochs):
        return beatloop.fit(
            "supervised", data=data, epochs=epochs, run_dir=run_dir, seed=1,
            callbacks=[beatloop.CsvLogger()], progress=False,
        )  # fmt: skip

    run(2)  # checkpoints at each epoch's end: the latest holds epoch 2
    jsonl, table = run_dir / "history.jsonl", run_dir / "history.csv"
    rows, lines = jsonl.read_bytes(), table.read_bytes()
    # As if killed while writing epoch 2's rows, its checkpoint already written.
    jsonl.write_bytes(rows[: rows.rindex(b"\n", 0, -1) + 20])
    table.write_bytes(lines[:-5])
    with pytest.warns(RuntimeWarning) as warned:
        resumed = run(3)
    notices = sorted(str(warning.message) for warning in warned)
    assert notices == [
        f"{path}: dropped 1 torn line(s) (a run killed while writing them); epoch 2's row is "
        "written back from the checkpoint, and the rows after epoch 2, the checkpoint's, are "
        "written again"
        for path in (table, jsonl)
    ]
    assert resumed.resumed_from.endswith("ckpt-3") and resumed.epochs == 3
    assert [row["epoch"] for row in history_records(run_dir)] == [1, 2, 3]
    assert jsonl.read_bytes().startswith(rows) and table.read_bytes().startswith(lines)
    assert len(table.read_text().splitlines()) == 4  # the header, then epochs 1, 2, 3


# --- 5. a full disk before the run starts -------------------------------------------------


def no_space(*args):
    """A write to a full disk."""
    raise OSError(errno.ENOSPC, "No space left on device")


def full(path, text):
    """``replace_file`` on a full disk: what beatloop's own write of ``path`` raises."""
    from beatloop.core.saving.run_dir import writing

    with writing(path):
        no_space()


def test_a_full_disk_at_the_lock_leaves_no_run_dir_and_does_not_say_resume(
    tmp_path, monkeypatch, capsys
):
    import beatloop.core.saving.run_lock as run_lock

    monkeypatch.setattr(run_lock, "_overwrite", no_space)
    run_dir = tmp_path / "new" / "run"
    code, err = cli(["run", "supervised", "--epochs", "1", "--run-dir", run_dir, *TINY], capsys)
    assert code == 5 and RunDirError.exit_code == 5
    first = err.splitlines()[0]
    assert first.startswith(
        f"beatloop: error: could not write {run_dir / '.lock'}: the disk is "
    ), first
    assert "left, so the run did not start (the run dir is left as it was): free some space and " \
        "run the same command again" in first  # fmt: skip
    assert "resume" not in err
    assert not (tmp_path / "new").exists()  # the folders made for the lock went with it


def test_a_full_disk_at_run_json_puts_the_run_dir_back_and_does_not_say_resume(
    tmp_path, monkeypatch, small_digits
):
    import beatloop.core.saving.record as record

    monkeypatch.setattr(record, "replace_file", full)
    train, _ = small_digits
    data = (tf.data.Dataset.from_tensor_slices((train["x"], train["y"])).batch(100), None)
    run_dir = tmp_path / "run"
    with pytest.raises(RunDirError) as caught:
        beatloop.fit("supervised", data=data, epochs=1, run_dir=run_dir, progress=False)
    message = str(caught.value)
    assert message.startswith(f"could not write {run_dir / 'run.json'}: the disk is full, "), (
        message
    )
    assert message.endswith("free some space and run the same command again")
    assert (
        isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC
    )
    assert not run_dir.exists()

    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")  # the user's: kept
    with pytest.raises(RunDirError, match="so the run did not start"):
        beatloop.fit("supervised", data=data, epochs=1, run_dir=run_dir, progress=False)
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]
    monkeypatch.undo()  # space freed: the same call runs
    result = beatloop.fit("supervised", data=data, epochs=1, run_dir=run_dir, progress=False)
    assert result.resumed_from is None and (run_dir / "run.json").is_file()


# --- 6. a run dir that holds the epochs asked for -----------------------------------------


def snapshot(path) -> dict:
    """Every file and folder under ``path`` with its bytes."""
    return {
        str(p.relative_to(path)): (p.read_bytes() if p.is_file() else "folder")
        for p in sorted(path.rglob("*"))
    }


class Events(beatloop.Callback):
    """Records each event with what the run holds then."""

    def __init__(self):
        self.seen = []

    def on_fit_start(self, run):
        self.seen.append(("fit_start", run.epoch, run.step))

    def on_epoch_start(self, run, epoch):
        self.seen.append(("epoch_start", epoch, run.step))

    def on_fit_end(self, run, logs):
        self.seen.append(("fit_end", run.epoch, run.step, dict(logs)))


def test_a_run_dir_holding_the_epochs_asked_for_fires_fit_start_and_fit_end(tmp_path, small_digits):
    train, validation = small_digits
    data = (
        tf.data.Dataset.from_tensor_slices((train["x"], train["y"])).batch(100),
        tf.data.Dataset.from_tensor_slices((validation["x"], validation["y"])).batch(100),
    )
    run_dir = tmp_path / "run"
    first = beatloop.fit("supervised", data=data, epochs=1, run_dir=run_dir, progress=False)
    before = snapshot(run_dir)
    events = Events()
    with pytest.warns(UserWarning, match="nothing to train"):
        again = beatloop.fit(
            "supervised", data=data, epochs=1, run_dir=run_dir, callbacks=[events], progress=False
        )
    assert [event[:3] for event in events.seen] == [("fit_start", 1, 2), ("fit_end", 1, 2)]
    logs = events.seen[1][3]
    assert sorted(logs) == sorted(first.history) and "val_loss" in logs
    assert logs["loss"] == first.history["loss"][-1] == again.history["loss"][-1]
    assert snapshot(run_dir) == before  # nothing written
