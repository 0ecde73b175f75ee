"""The data's identity in the run record (issue 34): ``run.json`` records each data
file's size, modification time and fingerprint, for every file-backed kind; a resume on
changed files is refused (exit 3) unless accepted (and the acceptance recorded);
``evaluate`` on changed files warns in one line; data not from files records nothing,
and a run dir from before the record resumes as before. Also: a loop-data run's
evaluation asks for ``data=`` saying why, and a truncated TFRecord file is named
cleanly."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import tuple_batches
from PIL import Image

import beatloop
from beatloop import DataChangedWarning, DataError
from beatloop.cli import main
from beatloop.core.schedule.beats import Beat, Schedule
from beatloop.named_data.identity import CHUNK, fingerprint
from beatloop.named_data.load import NamedData

ROWS = 48
SETTINGS = ("batch_size=8", "validation_fraction=0.25")


def _arrays(rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(rows, 4)).astype(np.float32), (np.arange(rows) % 3).astype(np.int64)


def _write_csv(path: Path, order) -> None:
    x, y = _arrays()
    lines = ["f0,f1,f2,f3,label"]
    lines += [",".join([*(repr(float(v)) for v in x[i]), str(y[i])]) for i in order]
    path.write_text("\n".join(lines) + "\n")


def _write_records(path: Path, rows: range) -> None:
    x, y = _arrays()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in rows:
            feature = {
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i].tolist())),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])])),
            }
            writer.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )


def _png(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(path)


def _csv(folder: Path):
    path = folder / "t.csv"
    _write_csv(path, range(ROWS))

    def change():  # the case: the same rows in another order, the same size
        _write_csv(path, reversed(range(ROWS)))
        return f"{path}: content differs (same size)"

    return f"csv:{path}", ("label=label", *SETTINGS), change


def _npz(folder: Path):
    path = folder / "t.npz"
    x, y = _arrays()
    np.savez(path, x=x, y=y.astype(np.int32))

    def change():  # rows removed
        before = path.stat().st_size
        np.savez(path, x=x[:40], y=y[:40].astype(np.int32))
        return f"{path}: size {before} -> {path.stat().st_size} bytes"

    return f"npz:{path}", SETTINGS, change


def _folder(folder: Path):
    images = folder / "images"
    for i in range(24):
        _png(images / "ab"[i % 2] / f"{i}.png", i)

    def change():  # a file added
        _png(images / "b" / "new.png", 99)
        return f"file(s) added: {images / 'b' / 'new.png'}"

    settings = ("image_size=8,8", "color_mode=grayscale", *SETTINGS)
    return f"folder:{images}", settings, change


def _tfrecord(folder: Path):
    _write_records(folder / "part-0.tfrecord", range(0, 24))
    _write_records(folder / "part-1.tfrecord", range(24, ROWS))

    def change():  # a file removed
        (folder / "part-1.tfrecord").unlink()
        return f"file(s) missing: {folder / 'part-1.tfrecord'}"

    return f"tfrecord:{folder}/*.tfrecord", ("keys=label:y", *SETTINGS), change


KINDS = {"csv": _csv, "npz": _npz, "folder": _folder, "tfrecord": _tfrecord}


def _fit(data, run_dir: Path, epochs: int, **options):
    return beatloop.fit(
        "supervised", data=data, config={"hidden": 8, "classes": 3}, epochs=epochs, seed=0,
        steps_per_execution=4, run_dir=run_dir, progress=False, **options,
    )  # fmt: skip


def _run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def _changed_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, DataChangedWarning)]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_changed_files_are_refused_on_resume_accepted_with_the_flag_and_warned_on_evaluate(
    kind, tmp_path
):
    data_dir = (tmp_path / "data").resolve()
    data_dir.mkdir()
    text, settings, change = KINDS[kind](data_dir)
    named, run_dir = NamedData(text, settings), tmp_path / "run"
    _fit(named, run_dir, 1)
    (recorded,) = _run_json(run_dir)["data_files"]
    assert (recorded["source"], recorded["role"]) == (text, "training")
    for entry in recorded["files"]:  # each file's facts, as the file system has them now
        file = Path(recorded["root"]) / entry["path"]
        assert (entry["size"], entry["mtime_ns"]) == (file.stat().st_size, file.stat().st_mtime_ns)
        assert entry["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
    expected = change()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figures = beatloop.evaluate(run_dir)  # evaluated all the same
    (message,) = _changed_warnings(caught)
    assert expected in message and "\n" not in message and set(figures) == {"loss", "accuracy"}

    with pytest.raises(DataError) as raised:
        _fit(named, run_dir, 2)
    first = str(raised.value).splitlines()[0]
    assert first.startswith(f"the data the run in {run_dir} trained on has changed")
    assert expected in first and "pass accept_changed_data=True" in first
    assert _run_json(run_dir)["epochs_asked"] == [1]  # refused before anything was written

    result = _fit(named, run_dir, 2, accept_changed_data=True)
    assert result.epochs == 2 and result.resumed_from
    record = _run_json(run_dir)
    (accepted,) = record["data_changes"]
    assert accepted["changes"] == [expected] and accepted["accepted_at"].endswith("Z")
    assert record["data_files"] != [recorded]  # the data as it is now
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        beatloop.evaluate(run_dir)
    assert _changed_warnings(caught) == []


def test_a_file_rewritten_with_its_bytes_is_no_change_and_an_old_run_dir_resumes(tmp_path):
    data_dir = tmp_path.resolve()
    text, settings, change = _csv(data_dir)
    named, run_dir, path = NamedData(text, settings), tmp_path / "run", data_dir / "t.csv"
    _fit(named, run_dir, 1)
    path.write_bytes(path.read_bytes())  # same bytes, a new modification time
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    _fit(named, run_dir, 2)
    record = _run_json(run_dir)
    assert record["data_files"][0]["files"][0]["mtime_ns"] == path.stat().st_mtime_ns
    assert "data_changes" not in record
    # a run dir written before data files were recorded: no record, nothing compared
    del record["data_files"]
    (run_dir / "run.json").write_text(json.dumps(record))
    change()
    assert _fit(named, run_dir, 3).epochs == 3
    assert _run_json(run_dir)["data_files"][0]["files"][0]["size"] == path.stat().st_size


def test_data_not_from_files_records_no_files(tmp_path):
    x, y = _arrays()
    data = tuple_batches({"x": x, "y": y.astype(np.int32)}, 8)
    _fit(data, tmp_path / "run", 1)
    record = _run_json(tmp_path / "run")
    assert "data_files" not in record and "data_source" not in record


def test_the_command_line_refuses_with_exit_3_warns_on_evaluate_and_takes_the_flag(
    tmp_path, capsys
):
    data_dir = (tmp_path / "data").resolve()
    data_dir.mkdir()
    text, settings, change = _csv(data_dir)
    run_dir = tmp_path / "run"
    command = ["run", "supervised", "--data", text, "--seed", "0", "--run-dir", str(run_dir)]
    command += [f"--data-set={s}" for s in settings]
    command += ["--set", "hidden=8", "--set", "classes=3", "--quiet"]
    assert main(command) == 0, capsys.readouterr().err
    expected = change()
    capsys.readouterr()
    assert main([*command, "--epochs", "2"]) == 3
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"beatloop: error: the data the run in {run_dir} trained on has")
    assert expected in line and "pass --accept-changed-data (accept_changed_data=True" in line
    with warnings.catch_warnings():  # shown as the command shows it, not raised as in tests
        warnings.simplefilter("default", DataChangedWarning)
        assert main(["evaluate", str(run_dir)]) == 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("beatloop: warning: the data the run in") and expected in line
    assert main([*command, "--epochs", "2", "--accept-changed-data"]) == 0
    assert _run_json(run_dir)["data_changes"][0]["changes"] == [expected]


def test_the_fingerprint_reads_a_file_in_chunks_to_its_last_byte(tmp_path):
    path = tmp_path / "big.bin"
    content = np.random.default_rng(0).bytes(2 * CHUNK + 12345)
    path.write_bytes(content)
    assert fingerprint(path) == hashlib.sha256(content).hexdigest()
    path.write_bytes(content[:-1] + bytes([content[-1] ^ 1]))
    assert fingerprint(path) != hashlib.sha256(content).hexdigest()


# --- the other two points of the issue --------------------------------------------------


class Ticking(beatloop.Recipe):
    """Data its own loop makes, and no validation ticks (test recipe)."""

    name = "ticking_identity_test"
    steps_per_epoch = 3

    def default_data(self, seed):
        return beatloop.loop_data()

    def build_models(self, batch_spec):
        return {"m": keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.05)}

    def losses(self):
        return {"fit_one": self.fit_one}

    def fit_one(self, models, batch):
        return tf.reduce_mean(tf.square(models["m"](tf.ones([1, 1])) - 1.0))

    def schedule(self):
        return Schedule(Beat(loss="fit_one", optimizer="sgd", updates="m"))


def test_a_loop_data_run_is_told_to_pass_data_and_evaluates_on_ticks():
    result = beatloop.fit(Ticking, epochs=1, seed=0, progress=False)
    with pytest.raises(DataError) as raised:
        result.evaluate()
    first = str(raised.value).splitlines()[0]
    assert "has no validation data to evaluate on" in first
    assert "(beatloop.loop_data()), which hold no validation data: pass data=" in first
    assert "beatloop.loop_data().train.take(10)" in first
    assert set(result.evaluate(beatloop.loop_data().train.take(10))) == {"fit_one"}


def test_a_truncated_tfrecord_file_is_named_with_the_offset_and_what_to_do(tmp_path):
    _write_records(tmp_path / "d.tfrecord", range(ROWS))
    whole = (tmp_path / "d.tfrecord").read_bytes()
    (tmp_path / "d.tfrecord").write_bytes(whole[:-30])
    with pytest.raises(DataError) as raised:
        beatloop.load_data(
            f"tfrecord:{tmp_path}/d.tfrecord", recipe=beatloop.make_recipe("supervised"), seed=0
        )
    starts = [0]  # each record: an 8-byte length, its CRC, the data, the data's CRC
    while starts[-1] < len(whole):
        starts.append(
            starts[-1] + 16 + int.from_bytes(whole[starts[-1] : starts[-1] + 8], "little")
        )
    first = str(raised.value).splitlines()[0]
    assert first == (
        f"data source 'tfrecord:{tmp_path}/d.tfrecord': the file '{tmp_path}/d.tfrecord' is "
        f"truncated: its record at byte {starts[-2]} is cut short (the file was not "
        "written to its end); write the file again, or remove it"
    )
