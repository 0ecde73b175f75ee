"""The streamed ``csv`` source: the same rows train to the same bits as the in-memory
pipeline did; the hold-out is drawn by the seed; column types, keys, features and the
delimiter; a bad line is named; a run killed mid-epoch resumes bit-identical; the
pipeline holds none of the file's data."""

from __future__ import annotations

import json
import re
import signal

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    all_weights,
    assert_same_weights,
    finish,
    history_records,
    start_python,
    worker,
)

import beatloop
from beatloop import DataError
from beatloop import datasets as builtin_data
from beatloop.cli import main
from beatloop.core.data.batches import DataSplit
from beatloop.named_data.load import NamedData, load_data, make_source
from beatloop.recipes.supervised import Supervised


def write_csv(path, arrays: dict, order=None, delimiter: str = ",") -> None:
    """Columns ``arrays`` (name -> 1-D values) as a CSV, floats by ``repr``."""
    names = list(order or arrays)
    lines = [delimiter.join(names)]
    for row in zip(*(arrays[name] for name in names), strict=True):
        lines.append(delimiter.join(repr(v.item()) for v in row))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def digits_csv(tmp_path_factory, small_digits):
    """200 digits as a CSV: pixel columns p0..p63, then the label column ``digit``."""
    train, _ = small_digits
    columns = {f"p{i}": train["x"][:, i].astype(np.float64) for i in range(64)}
    columns["digit"] = train["y"].astype(np.int64)
    path = tmp_path_factory.mktemp("csv") / "digits.csv"
    write_csv(path, columns)
    return path


def all_batches(dataset) -> dict[str, np.ndarray]:
    """A data set's batches, concatenated per key."""
    parts = [{k: v.numpy() for k, v in batch.items()} for batch in dataset]
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


# --- the same rows, the same bits ---------------------------------------------------------


def test_the_same_rows_train_bit_identical_to_the_in_memory_pipeline(digits_csv):
    values = np.loadtxt(digits_csv, delimiter=",", skiprows=1, dtype=np.float64)
    arrays = {"x": values[:, :64].astype(np.float32), "y": values[:, 64].astype(np.int32)}

    def in_memory(recipe, seed):  # what the csv source built before it streamed
        return DataSplit(builtin_data.batches(arrays, 50, shuffle_seed=seed))

    options = {"config": {"batch_size": 50, "hidden": 16}, "epochs": 2, "seed": 4}
    before = beatloop.fit("supervised", data=in_memory, **options, progress=False)
    streamed = beatloop.fit(
        "supervised",
        data=NamedData(f"csv:{digits_csv}", ("label=digit",)),
        **options,
        progress=False,
    )
    assert streamed.steps == before.steps == 8  # 200 rows in batches of 50, 2 epochs
    assert_same_weights(all_weights(streamed.models), all_weights(before.models))
    assert streamed.history == before.history


def test_a_small_file_is_reshuffled_every_pass_as_the_in_memory_pipeline_was(tmp_path):
    rows = np.arange(40, dtype=np.int64)
    write_csv(tmp_path / "t.csv", {"row": rows, "f": rows * 0.5})
    settings = ["label=row", "batch_size=8"]
    split = load_data(f"csv:{tmp_path / 't.csv'}", settings, recipe=Supervised(), seed=7)
    reference = builtin_data.batches({"y": rows.astype(np.int32)}, 8, shuffle_seed=7)
    for _ in range(2):  # two passes: two different orders, the same as the reference's
        assert all_batches(split.train)["y"].tolist() == all_batches(reference)["y"].tolist()
    orders = [all_batches(split.train)["y"].tolist() for _ in range(2)]
    assert orders[0] != orders[1] and sorted(orders[0]) == rows.tolist()


# --- the hold-out -------------------------------------------------------------------------


def held_out_rows(path, seed: int, fraction: float = 0.3) -> tuple[list[int], list[int]]:
    settings = ["label=row", f"validation_fraction={fraction}", "batch_size=16"]
    split = load_data(f"csv:{path}", settings, recipe=Supervised(), seed=seed)
    train, validation = all_batches(split.train), all_batches(split.validation)
    return train["y"].tolist(), validation["y"].tolist()


def test_the_hold_out_is_exactly_its_share_drawn_by_the_seed(tmp_path):
    rows = np.arange(101, dtype=np.int64)
    write_csv(tmp_path / "t.csv", {"row": rows, "f": rows * 0.25})
    train, validation = held_out_rows(tmp_path / "t.csv", seed=3)
    assert len(validation) == round(101 * 0.3) == 30 and len(train) == 71
    assert not set(train) & set(validation)
    assert sorted(train + validation) == rows.tolist()
    assert validation == sorted(validation)  # validation is read in file order
    again_train, again_validation = held_out_rows(tmp_path / "t.csv", seed=3)
    assert again_validation == validation and sorted(again_train) == sorted(train)
    other_train, other_validation = held_out_rows(tmp_path / "t.csv", seed=4)
    assert len(other_validation) == 30 and other_validation != validation
    assert sorted(other_train + other_validation) == rows.tolist()
    with pytest.raises(DataError, match=r"validation_fraction=0\.001 of 101 example"):
        held_out_rows(tmp_path / "t.csv", seed=3, fraction=0.001)


# --- columns ------------------------------------------------------------------------------


def test_column_types_keys_features_and_the_delimiter(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "a; b ;label;risk;whole;big\n"
        "1;2.5;3;0.25;1.0;3000000000\n"
        "\n"
        "4;-5e-1;0;1;2e3;1\r\n"
        "7; 8 ;1;2;-3;2\n"
    )
    source = make_source(
        f"csv:{path}",
        ["delimiter=;", "label=label", "keys=risk,whole,big", "features=b,a", "shuffle=false"],
    )
    split = source.load(seed=0, batch_size=2)
    spec = split.train.element_spec
    assert {key: spec[key].dtype for key in spec} == {
        "x": tf.float32, "y": tf.int32, "risk": tf.float32, "whole": tf.int32, "big": tf.float32,
    }  # fmt: skip
    assert spec["x"].shape.as_list() == [None, 2]
    batch = all_batches(split.train)
    np.testing.assert_array_equal(batch["x"], np.float32([[2.5, 1], [-0.5, 4], [8, 7]]))
    assert batch["y"].tolist() == [3, 0, 1] and batch["whole"].tolist() == [1, 2000, -3]
    assert batch["risk"].tolist() == [0.25, 1.0, 2.0]
    assert batch["big"].tolist() == [3e9, 1.0, 2.0]  # whole, but past int32: float32
    default = make_source(f"csv:{path}", ["delimiter=;", "label=label"]).load(0, 4)
    assert default.train.element_spec["x"].shape.as_list() == [None, 5]  # every other column


# --- bad files ----------------------------------------------------------------------------


def late_bad_file(path, bad_row: str) -> int:
    """A CSV of 3000 good rows (and one blank line) with ``bad_row`` at the line returned."""
    lines = ["a,b,c"] + [f"{i},{i * 0.5},{i % 3}" for i in range(3000)]
    lines.insert(10, "")
    lines.insert(2500, bad_row)
    path.write_text("\n".join(lines) + "\n")
    return 2501


def test_a_bad_value_on_a_late_line_is_named_by_line_and_column(tmp_path, capsys):
    path = tmp_path / "t.csv"
    line = late_bad_file(path, "1,2,oops")
    with pytest.raises(DataError) as refused:
        make_source(f"csv:{path}").load(0, 32)
    assert str(refused.value) == (
        f"data source 'csv:{path}': line {line}, column 'c' holds 'oops', not a number"
    )
    line = late_bad_file(path, "1,,2")
    with pytest.raises(DataError, match=f"line {line}, column 'b' holds '', not a number"):
        make_source(f"csv:{path}").load(0, 32)
    line = late_bad_file(path, "1,2,3,4")
    code = main(["run", "supervised", "--data", f"csv:{path}", "--data-set", "label=c",
                 "--run-dir", str(tmp_path / "run"), "--quiet"])  # fmt: skip
    assert code == 3
    errors = [t for t in capsys.readouterr().err.splitlines() if t.startswith("beatloop: error")]
    said = f"data source 'csv:{path}': line {line} has 4 values, the header 3 columns"
    assert errors == [f"beatloop: error: {said}"]
    assert not (tmp_path / "run").exists()


def test_missing_and_empty_files_and_a_bad_delimiter_are_refused(tmp_path):
    from beatloop import ConfigError

    path = tmp_path / "t.csv"
    for text, words in (("", "it has 0 row(s)"), ("\na,b\n\n", "it has 1 row(s)")):
        path.write_text(text)
        with pytest.raises(DataError, match=re.escape(words)):
            make_source(f"csv:{path}").load(0, 32)
    with pytest.raises(DataError, match="is a folder, not a file"):
        make_source(f"csv:{tmp_path}").load(0, 32)
    path.write_bytes(b"a,b\n1,2\n")
    with pytest.raises(DataError, match=r"no columns are left for 'x'"):
        make_source(f"csv:{path}", ["label=a", "keys=b"]).load(0, 32)
    with pytest.raises(ConfigError, match="delimiter must be one character"):
        make_source(f"csv:{path}", ["delimiter=;;"])


# --- the pipeline holds no data -----------------------------------------------------------


def test_the_pipeline_holds_none_of_the_files_data_and_shards_by_data(tmp_path):
    def split_of(count: int) -> tuple[DataSplit, int]:
        rows = np.arange(count, dtype=np.int64)
        path = tmp_path / f"{count}.csv"
        write_csv(path, {"row": rows, "f": rows * 0.5, "g": rows * 0.25})
        settings = ["label=row", "validation_fraction=0.1"]
        return load_data(f"csv:{path}", settings, recipe=Supervised(), seed=0), path.stat().st_size

    (small, small_size), (large, large_size) = split_of(2_000), split_of(20_000)
    assert large_size > 10 * small_size
    for role in ("train", "validation"):
        graphs = [len(getattr(s, role)._as_serialized_graph().numpy()) for s in (small, large)]
        assert abs(graphs[1] - graphs[0]) < 64, graphs  # it names the file; it holds no rows
    assert [int(large.train.cardinality()), int(large.validation.cardinality())] == [563, 63]
    for dataset in (large.train, large.validation):  # 18,000 and 2,000 rows in batches of 32
        policy = dataset.options().experimental_distribute.auto_shard_policy
        assert policy == tf.data.experimental.AutoShardPolicy.DATA


# --- SIGKILL and resume -------------------------------------------------------------------


def digits_columns(train: dict) -> dict[str, np.ndarray]:
    """The training digits as table columns: ``p0``..``p63`` (float64) and ``digit``."""
    columns = {f"p{i}": train["x"][:, i].astype(np.float64) for i in range(64)}
    return {**columns, "digit": train["y"].astype(np.int64)}


def assert_killed_run_resumes(tmp_path, source: str) -> None:
    """A ``supervised`` run on the digits table at ``source`` (1,437 rows: 287 held out,
    1,150 in 18 batches of 64 an epoch), SIGKILLed at step 27 in a process of its own,
    resumes from its step-24 checkpoint onto the whole run's weights and history: what
    every streamed source must keep across a kill (``csv`` here, ``parquet`` too)."""
    from pathlib import Path

    spec = {
        "recipe": "supervised", "config": {"batch_size": 64, "dropout": 0.3}, "epochs": 2,
        "seed": 3, "checkpoint_every": 8, "data": {
            "source": source,
            "settings": ["label=digit", "validation_fraction=0.2", "shuffle_buffer=300"],
        },
    }  # fmt: skip
    resumable_run = worker("resumable_run")
    killed_dir = tmp_path / "killed"
    # Only the killed run needs a process; the others are fitted here meanwhile.
    killed_spec = {**spec, "run_dir": str(killed_dir), "kill_at": 27, "out": "unused"}
    killed = start_python(Path(__file__).parent / "workers" / "resumable_run.py",
                          json.dumps(killed_spec))  # fmt: skip
    try:
        full = resumable_run.fit({**spec, "run_dir": str(tmp_path / "full")})
    finally:
        err = finish(killed, 300).stderr
    assert killed.returncode == -signal.SIGKILL, err
    assert len(history_records(killed_dir)) == 1  # killed in epoch 2
    resumed = resumable_run.fit({**spec, "run_dir": str(killed_dir)})
    assert resumed.steps == 36 and resumed.resumed_from.endswith("ckpt-5")
    assert_same_weights(all_weights(resumed.models), all_weights(full.models))
    assert history_records(killed_dir) == history_records(tmp_path / "full")
    assert "val_loss" in history_records(tmp_path / "full")[0]


@pytest.mark.slow
def test_a_csv_run_killed_mid_epoch_resumes_bit_identical(tmp_path, digits):
    train, _ = digits
    write_csv(tmp_path / "digits.csv", digits_columns(train))
    assert_killed_run_resumes(tmp_path, f"csv:{tmp_path / 'digits.csv'}")
