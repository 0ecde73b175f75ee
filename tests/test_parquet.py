"""The ``parquet`` source: Parquet files the tests write with pyarrow give the very rows
and batches the ``csv`` source gives for the same table (hold-out, shuffle, dtypes), and
train to the weights the in-memory pipeline does; list, dictionary and integer columns;
every damaged or mismatched file one error naming the file and the column, before the
first step; the data's fingerprint and a resume on changed files refused; sharded by data
across workers, each row once; a run killed mid-epoch resumes bit-identical; pyarrow
imported only on load."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights
from test_csv_stream import assert_killed_run_resumes, digits_columns, write_csv

import beatloop
from beatloop import ConfigError, DataError
from beatloop.cli import main
from beatloop.core.data.batches import DataSplit
from beatloop.datasets import batches
from beatloop.named_data.load import NamedData, make_source

SIZES = (70, 50, 80)  # rows per file: 200 digits in three files of unequal length


def all_batches(dataset) -> dict[str, np.ndarray]:
    """A data set's batches, concatenated per key."""
    parts = list(dataset.as_numpy_iterator())
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


@pytest.fixture(scope="module")
def digits_table(tmp_path_factory, small_digits):
    """200 digits as one table (pixel columns p0..p63 float64, the label ``digit`` int64),
    written as three Parquet files of small row groups and as one CSV; the glob, the
    CSV's path and the arrays."""
    train, _ = small_digits
    columns = {f"p{i}": train["x"][:, i].astype(np.float64) for i in range(64)}
    columns["digit"] = train["y"].astype(np.int64)
    folder = tmp_path_factory.mktemp("parquet")
    table, start = pa.table(columns), 0
    for number, size in enumerate(SIZES):
        pq.write_table(table.slice(start, size), folder / f"part-{number}.parquet", 16)
        start += size
    write_csv(folder / "digits.csv", columns)
    arrays = {"x": train["x"].astype(np.float32), "y": train["y"].astype(np.int32)}
    return str(folder / "part-*.parquet"), str(folder / "digits.csv"), arrays


def write(path, columns: dict, row_group: int | None = None) -> str:
    pq.write_table(pa.table(columns), path, row_group)
    return str(path)


# --- the same rows as csv, the same weights as in memory -------------------------------


def test_the_batches_are_the_ones_csv_gives_for_the_same_table(digits_table):
    pattern, csv_path, _ = digits_table
    settings = ["label=digit", "validation_fraction=0.25", "shuffle_buffer=64"]
    parquet = make_source(f"parquet:{pattern}", settings).load(seed=3, batch_size=32)
    csv = make_source(f"csv:{csv_path}", settings).load(seed=3, batch_size=32)
    assert parquet.train.element_spec == csv.train.element_spec
    assert int(parquet.train.cardinality()) == int(csv.train.cardinality()) == 5
    for _ in range(2):  # two passes, each reshuffled: the same order on both sides
        for role in ("train", "validation"):
            found, wanted = all_batches(getattr(parquet, role)), all_batches(getattr(csv, role))
            np.testing.assert_array_equal(found["x"], wanted["x"])
            np.testing.assert_array_equal(found["y"], wanted["y"])


def test_training_equals_the_in_memory_pipeline_bit_for_bit(digits_table):
    pattern, _, arrays = digits_table

    def in_memory(recipe, seed):
        return DataSplit(batches(arrays, 50, shuffle_seed=seed))

    options = {"config": {"batch_size": 50, "hidden": 16}, "epochs": 2, "seed": 4}
    before = beatloop.fit("supervised", data=in_memory, **options, progress=False)
    named = NamedData(f"parquet:{pattern}", ("label=digit",))
    streamed = beatloop.fit("supervised", data=named, **options, progress=False)
    assert streamed.steps == before.steps == 8
    assert_same_weights(all_weights(streamed.models), all_weights(before.models))
    assert streamed.history == before.history


def test_a_pass_holds_one_row_group_of_the_file_at_a_time(tmp_path):
    """Memory is bounded by the shuffle buffer and one row group, whatever the file holds:
    Arrow's allocations while a pass is read stay far below the file's 3.2 MB of values."""
    columns = {f"f{i}": np.arange(100_000, dtype=np.float64) + i for i in range(4)}
    path = write(tmp_path / "t.parquet", columns, row_group=5_000)  # 20 row groups
    settings = ["label=f0", "shuffle_buffer=1000"]
    split = make_source(f"parquet:{path}", settings).load(seed=0, batch_size=1000)
    held, rows = [], 0
    for batch in split.train:
        held.append(pa.total_allocated_bytes())
        rows += int(batch["y"].shape[0])
    assert rows == 100_000 and max(held) < 1 << 20, max(held)


# --- columns ---------------------------------------------------------------------------


def test_lists_dictionaries_integers_and_named_inputs(tmp_path):
    rows = 6
    columns = {
        "fixed": pa.array([[i, -i] for i in range(rows)], pa.list_(pa.float32(), 2)),
        "same": pa.array([[i * 0.5] * 3 for i in range(rows)], pa.list_(pa.float64())),
        "code": pa.array([1, 2, 1, 3, 2, 1], pa.int32()).dictionary_encode(),
        "big": pa.array([3_000_000_000, 1, 2, 3, 4, 5], pa.int64()),
        "flag": pa.array([True, False] * 3),
        "label": pa.array(range(rows), pa.int16()),
    }
    path = write(tmp_path / "t.parquet", columns, row_group=4)
    source = make_source(
        f"parquet:{path}", ["label=label", "keys=code,big,flag:x/flag,same:x/same", "shuffle=0"]
    )
    found = all_batches(source.load(seed=0, batch_size=4).train)
    assert sorted(found) == ["big", "code", "x/flag", "x/same", "y"]
    assert found["x/same"].shape == (6, 3) and found["x/same"].dtype == np.float32
    np.testing.assert_array_equal(found["x/same"][:, 0], np.arange(rows) * 0.5)
    assert found["code"].tolist() == [1, 2, 1, 3, 2, 1] and found["code"].dtype == np.int32
    assert found["big"].dtype == np.float32  # whole, but past int32: float32, as csv
    assert found["x/flag"].tolist() == [1, 0] * 3 and found["y"].dtype == np.int32
    stacked = make_source(f"parquet:{path}", ["label=label", "features=fixed,big", "shuffle=0"])
    x = all_batches(stacked.load(seed=0, batch_size=4).train)["x"]
    np.testing.assert_array_equal(x[1], np.float32([1, -1, 1]))  # a list's values in place
    default = make_source(f"parquet:{path}", ["label=label"]).load(seed=0, batch_size=4)
    assert default.train.element_spec["x"].shape.as_list() == [None, 2 + 3 + 1 + 1 + 1]


# --- damaged and mismatched files ---------------------------------------------------------


def refused(pattern: str, *settings: str) -> str:
    with pytest.raises(DataError) as caught:
        make_source(f"parquet:{pattern}", list(settings)).load(seed=0, batch_size=8)
    return str(caught.value)


def test_columns_a_model_cannot_take_are_named_with_what_to_do(tmp_path):
    label = f"data source 'parquet:{tmp_path}/*.parquet'"
    good = {"f": [0.5, 1.5, 2.5], "y": [0, 1, 0]}
    at = write(tmp_path / "a.parquet", good)
    cases = {
        "ragged": (
            {"f": pa.array([[1.0], [1.0, 2.0], [3.0]]), "y": [0, 1, 0]},
            "column 'f' holds lists of lengths [1, 2]; a list column must hold lists of one "
            "length (pad or cut them), or be left out with --data-set features=...",
        ),
        "strings": (
            {"f": ["a", "b", "c"], "y": [0, 1, 0]},
            "column 'f' holds string, not numbers (or lists of numbers); convert it to "
            "numbers, or leave it out with --data-set features=...",
        ),
        "categories": (
            {"f": pa.array(["a", "b", "a"]).dictionary_encode(), "y": [0, 1, 0]},
            "column 'f' is dictionary-encoded string (categories), not numbers; write its "
            "integer codes instead (pyarrow: column.indices), or leave it out with "
            "--data-set features=...",
        ),
        "nulls": (
            {"f": [0.5, 1.5, 2.5], "y": [0, None, None]},
            "column 'y' holds nulls (the first in row 1 of the file); fill them "
            "(pyarrow.compute.fill_null) or drop those rows",
        ),
        "null-in-lists": (
            {"f": pa.array([[1.0, None], [1.0, 2.0], [3.0, 4.0]]), "y": [0, 1, 0]},
            "column 'f' holds lists with null values; fill them (pyarrow.compute.fill_null) "
            "or drop those rows",
        ),
        "floats": (
            {"f": [0.5, 1.5, 2.5], "y": [0.0, 1.0, 0.0]},
            "column 'y' holds double, the first file's int64; write the files with one schema",
        ),
        "absent": (
            {"f": [0.5, 1.5, 2.5], "label": [0, 1, 0]},
            "has no column(s) ['y']; its columns: ['f', 'label']",
        ),
    }
    for name, (columns, words) in cases.items():
        bad = write(tmp_path / f"b-{name}.parquet", columns)
        said = refused(f"{tmp_path}/*.parquet", "label=y")
        assert said.startswith(f"{label}: the file {bad!r}"), said
        assert said.endswith(words) and "\n" not in said
        (tmp_path / f"b-{name}.parquet").unlink()
    assert at  # the good file alone reads
    write(tmp_path / "b-lists.parquet", {"f": pa.array([[1.0, 2.0]] * 3), "y": [0, 1, 0]})
    write(tmp_path / "c-lists.parquet", {"f": pa.array([[1.0, 2.0, 3.0]] * 3), "y": [0, 1, 0]})
    said = refused(f"{tmp_path}/*-lists.parquet", "label=y")
    assert said == (
        f"data source 'parquet:{tmp_path}/*-lists.parquet': the file "
        f"'{tmp_path}/c-lists.parquet', column 'f' holds list<double> (lists of 3), the first "
        "file's list<double> (lists of 2); write the files with one schema"
    )
    assert refused(f"{tmp_path}/a.parquet", "label=label").endswith(
        f"the file '{tmp_path}/a.parquet' has no column(s) ['label']; its columns: ['f', 'y']"
    )
    write(tmp_path / "empty.parquet", {"f": pa.array([], pa.float64())})
    assert refused(f"{tmp_path}/empty.parquet").endswith(": its files hold no rows")
    assert refused(f"{tmp_path}/none-*", "label=y") == (
        f"data source 'parquet:{tmp_path}/none-*': '{tmp_path}/none-*' matches no file; give "
        "a Parquet file, a folder of them or a glob, e.g. --data 'parquet:data/part-*.parquet'"
    )


def test_a_damaged_file_is_named_before_the_first_step(tmp_path, digits_table, capsys):
    pattern, csv_path, _ = digits_table
    folder = tmp_path / "data"
    folder.mkdir()
    whole = Path(pattern.replace("*", "1")).read_bytes()
    (folder / "a.parquet").write_bytes(Path(pattern.replace("*", "0")).read_bytes())
    (folder / "b.parquet").write_bytes(whole[:-100])  # its footer cut short
    code = main(
        ["run", "supervised", "--data", f"parquet:{folder}", "--data-set", "label=digit",
         "--run-dir", str(tmp_path / "run"), "--quiet"]
    )  # fmt: skip
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 3 and len(errors) == 1, errors
    assert errors[0].startswith(
        f"beatloop: error: data source 'parquet:{folder}': the file '{folder}/b.parquet' is "
        "not a readable Parquet file ("
    )
    assert errors[0].endswith("); write it again, or remove it")
    assert not (tmp_path / "run").exists()
    (folder / "b.parquet").write_bytes(Path(csv_path).read_bytes())
    assert "magic bytes not found" in refused(str(folder), "label=digit")
    # a damaged page inside the file: its row group named, at load
    damaged = bytearray(whole)
    chunk = pq.ParquetFile(pattern.replace("*", "1")).metadata.row_group(2).column(0)
    damaged[chunk.data_page_offset + 40 : chunk.data_page_offset + 240] = b"\xff" * 200
    (folder / "b.parquet").write_bytes(bytes(damaged))
    assert refused(str(folder), "label=digit").startswith(
        f"data source 'parquet:{folder}': the file '{folder}/b.parquet' does not read: its "
        "row group 2 (rows 32 to 47) fails ("
    )


def test_without_pyarrow_loading_says_which_extra_and_importing_needs_none(
    digits_table, monkeypatch
):
    pattern, _, _ = digits_table
    for name in [name for name in sys.modules if name.split(".")[0] == "pyarrow"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow: ImportError
    module = runpy.run_path(beatloop.sources.parquet.__file__)  # the module needs none
    source = make_source(f"parquet:{pattern}", ["label=digit"])
    assert isinstance(source, module["DataSource"])
    with pytest.raises(ConfigError) as caught:
        source.load(seed=0, batch_size=8)
    assert str(caught.value) == (
        f"data source 'parquet:{pattern}': reading Parquet needs pyarrow, which comes with "
        'the parquet extra: pip install "beatloop[parquet]"'
    )


# --- workers, fingerprint, resume ----------------------------------------------------------


def test_workers_shard_by_data_each_row_once_per_pass(tmp_path):
    """tf.distribute's auto-shard, as ``experimental_distribute_dataset`` applies it under
    a multi-worker strategy, run here in one process: each worker builds the pipeline as
    its own process would (the same seeds) and keeps its part of every global batch."""
    from tensorflow.python.data.experimental.ops.distribute import _AutoShardDataset

    path = write(tmp_path / "t.parquet", {"row": np.arange(90), "f": np.ones(90)}, 20)
    settings = ["label=row", "validation_fraction=0.2"]

    def pipeline():
        tf.random.set_seed(0)  # as fit seeds each worker's process
        return make_source(f"parquet:{path}", settings).load(seed=0, batch_size=16)

    policy = tf.data.experimental.AutoShardPolicy.DATA
    for dataset in (pipeline().train, pipeline().validation):
        assert dataset.options().experimental_distribute.auto_shard_policy == policy
    for workers in (2, 3):
        seen = []
        for index in range(workers):
            shard = _AutoShardDataset(pipeline().train, workers, index, num_replicas=workers)
            seen.append(all_batches(shard)["y"].tolist())
        every = sorted(row for rows in seen for row in rows)
        assert len(every) == 72 and len(set(every)) == 72  # the training rows, once each


def test_a_resume_on_changed_files_is_refused_unless_accepted(tmp_path):
    from test_data_identity import _fit, _run_json

    rng = np.random.default_rng(0)
    columns = {"x": rng.normal(size=(48, 4)).tolist(), "label": np.arange(48) % 3}
    data = (tmp_path / "data").resolve()
    data.mkdir()
    write(data / "a.parquet", columns)
    named = NamedData(f"parquet:{data}", ("label=label", "batch_size=8"))
    _fit(named, tmp_path / "run", 1)
    resumed = _fit(named, tmp_path / "run", 2)  # unchanged: resumes, as a run never stopped
    assert_same_weights(
        all_weights(resumed.models), all_weights(_fit(named, tmp_path / "fresh", 2).models)
    )
    (recorded,) = _run_json(tmp_path / "run")["data_files"]
    assert [entry["path"] for entry in recorded["files"]] == ["a.parquet"]
    write(data / "a.parquet", {"x": columns["x"][::-1], "label": columns["label"][::-1]})
    with pytest.raises(DataError, match=r"trained on has changed since .*a\.parquet: size "):
        _fit(named, tmp_path / "run", 3)
    assert _fit(named, tmp_path / "run", 3, accept_changed_data=True).epochs == 3


def test_the_generator_is_marked_replayable_and_only_it_is_looked_past(digits_table):
    """The source's generator starts again at every pass, so the engine's warning of
    Python-fed data (``python_ops``) looks past it; an unmarked generator is still seen."""
    from beatloop.core.data.data_origin import python_ops
    from beatloop.datasets import replayable

    pattern, _, _ = digits_table
    split = make_source(f"parquet:{pattern}", ["label=digit"]).load(seed=0, batch_size=8)
    assert python_ops(split.train) == []
    spec = tf.TensorSpec([], tf.float32)
    generated = tf.data.Dataset.from_generator(lambda: iter([1.0]), output_signature=spec)
    assert "GeneratorDataset" in python_ops(generated.batch(1))
    assert python_ops(replayable(generated).batch(1)) == []


@pytest.mark.slow
def test_a_parquet_run_killed_mid_epoch_resumes_bit_identical(tmp_path, digits):
    """As the ``csv`` source's kill test (``test_csv_stream.py``), on the same table as
    two Parquet files of small row groups: SIGKILL at step 27 (epoch 2 of 18 steps), the
    resume from the step-24 checkpoint ends on the weights and history of the whole run."""
    train, _ = digits
    table = pa.table(digits_columns(train))
    pq.write_table(table.slice(0, 700), tmp_path / "part-0.parquet", 100)
    pq.write_table(table.slice(700), tmp_path / "part-1.parquet", 100)
    assert_killed_run_resumes(tmp_path, f"parquet:{tmp_path / 'part-*.parquet'}")
