"""The ``tfrecord`` source: sharded ``tf.train.Example`` files the tests write (digits as
PNG images with their labels, and as float vectors), the feature spec inferred or given,
record keys mapped to batch keys, splits by record and by file, training from the command
line and from Python on the same batches an in-memory pipeline gives, bad files named,
sharding by file, and a killed run resumed bit for bit."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    all_weights,
    assert_same_weights,
    history_records,
    model_weights,
    start_python,
)
from helpers import (
    worker as import_worker,
)

import beatloop
from beatloop import ConfigError, DataError
from beatloop.cli import main
from beatloop.core.data.batches import DataSplit
from beatloop.datasets import batches
from beatloop.named_data.load import load_data
from beatloop.sources.example_spec import FeatureSpec, infer_spec, parse_spec
from beatloop.sources.tfrecord import TfrecordConfig, TfrecordSource

SHARDS = (60, 50, 50, 40)  # records per file: 200 digits, files of unequal length


def _feature(kind: str, values) -> tf.train.Feature:
    if kind == "bytes":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def _example(**features: tuple[str, list]) -> bytes:
    feature = {name: _feature(kind, values) for name, (kind, values) in features.items()}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_shards(folder, name: str, records: list[bytes], sizes=SHARDS) -> list[str]:
    """``records`` in files ``folder/NAME-0000i.tfrecord`` of ``sizes`` records each."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    for shard, size in enumerate(sizes):
        paths.append(str(folder / f"{name}-{shard:05d}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for record in records[start : start + size]:
                writer.write(record)
        start += size
    return paths


@pytest.fixture(scope="module")
def digits_records(tmp_path_factory):
    """200 digits as PNG-encoded 8x8 grayscale images (``image``), their label (``label``)
    and their number (``id``), in four files; the glob, the files and the arrays."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images[:200] * 255 / 16).astype(np.uint8)[..., None]
    labels = digits.target[:200].astype(np.int32)
    records = [
        _example(
            image=("bytes", [tf.io.encode_png(picture).numpy()]),
            label=("int64", [int(label)]),
            id=("int64", [index]),
        )
        for index, (picture, label) in enumerate(zip(pixels, labels, strict=True))
    ]
    folder = tmp_path_factory.mktemp("tfrecord") / "digits"
    paths = write_shards(folder, "train", records)
    unit = pixels.astype(np.float32) * np.float32(1 / 255.0)  # as the folder source scales
    arrays = {"id": np.arange(200, dtype=np.int32), "x": unit}
    arrays["y"] = labels
    return str(folder / "train-*.tfrecord"), paths, arrays


@pytest.fixture(scope="module")
def vector_records(tmp_path_factory, small_digits):
    """The 200 small training digits as float vectors ``x`` (64 values) and an int64 label
    ``y``, in two files; the glob and the arrays."""
    train, _ = small_digits
    records = [
        _example(x=("float", list(x)), y=("int64", [int(y)]))
        for x, y in zip(train["x"], train["y"], strict=True)
    ]
    folder = tmp_path_factory.mktemp("tfrecord") / "vectors"
    write_shards(folder, "part", records, sizes=(120, 80))
    return str(folder / "part-*.tfrecord"), train


def source(pattern: str, **settings) -> TfrecordSource:
    return TfrecordSource(pattern, TfrecordConfig(**settings))


def every_batch(dataset) -> dict[str, np.ndarray]:
    """A data set's batches, each key's concatenated in order."""
    parts = list(dataset.as_numpy_iterator())
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


def file_ids() -> list[set[int]]:
    """The ``id``s of each file's records."""
    starts = np.cumsum([0, *SHARDS[:-1]])
    return [set(range(start, start + size)) for start, size in zip(starts, SHARDS, strict=True)]


def round_robin(sizes, cycle: int) -> list[int]:
    """The global record numbers in the order ``interleave(cycle_length=cycle,
    block_length=1)`` reads files of ``sizes`` records: a record from each open file in
    turn; a finished file's place taken by the next file when its turn comes again."""
    offsets = np.cumsum([0, *sizes])
    slots, order, following, turn = [None] * cycle, [], 0, 0
    while following < len(sizes) or any(slot is not None for slot in slots):
        if slots[turn] is None and following < len(sizes):
            slots[turn], following = [following, 0], following + 1
        elif slots[turn] is None:
            turn = (turn + 1) % cycle
        elif slots[turn][1] == sizes[slots[turn][0]]:
            slots[turn], turn = None, (turn + 1) % cycle
        else:
            order.append(offsets[slots[turn][0]] + slots[turn][1])
            slots[turn][1] += 1
            turn = (turn + 1) % cycle
    return order


# --- the spec ----------------------------------------------------------------------


def test_the_spec_is_inferred_from_the_first_record(digits_records, vector_records):
    pattern, paths, _ = digits_records
    first = next(iter(tf.data.TFRecordDataset(paths[0]))).numpy()
    spec, skipped = infer_spec(first)
    assert spec == (
        FeatureSpec("id", "int64", ()),
        FeatureSpec("image", "image", (8, 8, 1)),
        FeatureSpec("label", "int64", ()),
    )
    assert skipped == []
    split = source(pattern, shuffle=False, batch_size=32).load(seed=0, batch_size=32)
    spec = split.train.element_spec
    assert {key: (tuple(value.shape), value.dtype) for key, value in spec.items()} == {
        "id": ((None,), tf.int32),
        "x": ((None, 8, 8, 1), tf.float32),  # image -> x, decoded, in [0, 1]
        "y": ((None,), tf.int32),  # label -> y, int64 narrowed
    }
    assert split.validation is None and int(split.train.cardinality()) == 7
    vectors, train = vector_records
    split = source(vectors, shuffle=False).load(seed=0, batch_size=50)
    assert split.train.element_spec["x"].shape.as_list() == [None, 64]
    wanted = train["x"][round_robin((120, 80), 2)]
    np.testing.assert_array_equal(every_batch(split.train)["x"], wanted)


def test_the_spec_by_hand_reads_only_what_it_names():
    assert parse_spec(["x=float32:64", "label=int", "image=png", "grid=float:8x8"]) == (
        FeatureSpec("grid", "float32", (8, 8)),
        FeatureSpec("image", "image", None),  # its size: the first record's
        FeatureSpec("label", "int64", ()),
        FeatureSpec("x", "float32", (64,)),
    )
    assert parse_spec(["y=int64:1"]) == (FeatureSpec("y", "int64", ()),)
    with pytest.raises(ValueError, match=r"NAME=KIND\[:SHAPE\].*got 'image=gif'"):
        parse_spec(["image=gif"])


def test_a_spec_given_by_hand_and_keys_mapped(digits_records):
    pattern, _, arrays = digits_records
    settings = {"features": ("image=png", "label=int64"), "keys": ("label:digit",)}
    split = source(pattern, shuffle=False, **settings).load(seed=0, batch_size=64)
    found = every_batch(split.train)
    assert sorted(found) == ["digit", "x"]  # no id: the spec names two features
    np.testing.assert_array_equal(found["digit"], arrays["y"][round_robin(SHARDS, 4)])
    # values scaled as the folder source does: signed is what the gan asks for
    split = source(pattern, shuffle=False, value_range="signed").load(seed=0, batch_size=200)
    x = every_batch(split.train)["x"]
    assert x.min() == -1.0 and x.max() == 1.0
    with pytest.raises(ConfigError, match=r"--data-set features expects NAME=KIND"):
        source(pattern, features=("image=gif",)).load(seed=0, batch_size=8)
    with pytest.raises(DataError, match=r"keys names the feature 'pixels'; the records have"):
        source(pattern, keys=("pixels:x",)).load(seed=0, batch_size=8)


def test_missing_batch_keys_say_which_keys_to_map(digits_records):
    pattern, _, _ = digits_records
    recipe = beatloop.make_recipe("supervised")
    with pytest.raises(DataError) as caught:
        load_data(f"tfrecord:{pattern}", ["keys=label:digit"], recipe=recipe, seed=0)
    message = str(caught.value)
    assert "gives ['digit', 'id', 'x'] (missing ['y'])" in message
    assert "features are id=int64,image=image:8x8x1,label=int64" in message
    assert "--data-set keys=FEATURE:KEY (e.g. keys=id:y)" in message


# --- the same batches as in memory ---------------------------------------------------


def test_unshuffled_batches_are_the_records_in_reading_order(digits_records):
    pattern, _, arrays = digits_records
    files_in_turn = source(pattern, shuffle=False).load(seed=0, batch_size=32).train
    expected = batches({k: v[round_robin(SHARDS, 4)] for k, v in arrays.items()}, 32)
    for found, wanted in zip(files_in_turn, expected, strict=True):
        for key in ("id", "x", "y"):
            np.testing.assert_array_equal(found[key].numpy(), wanted[key].numpy())
    one_by_one = source(pattern, shuffle=False, cycle_length=1).load(seed=0, batch_size=32)
    found = every_batch(one_by_one.train)
    np.testing.assert_array_equal(found["id"], np.arange(200))
    np.testing.assert_array_equal(found["x"], arrays["x"])  # bit for bit


def test_shuffled_batches_are_the_in_memory_pipelines_every_pass(digits_records):
    pattern, _, arrays = digits_records
    tf.random.set_seed(5)
    streamed = source(pattern, cycle_length=1).load(seed=7, batch_size=32).train
    tf.random.set_seed(5)
    in_memory = batches(arrays, 32, shuffle_seed=7)
    orders = []
    for _ in range(2):  # a new order each pass, the same on both sides
        found, wanted = every_batch(streamed), every_batch(in_memory)
        np.testing.assert_array_equal(found["id"], wanted["id"])
        np.testing.assert_array_equal(found["x"], wanted["x"])
        orders.append(found["id"])
    assert not np.array_equal(*orders)


def test_training_from_python_equals_the_in_memory_pipeline(digits_records):
    pattern, _, arrays = digits_records
    recipe = beatloop.make_recipe("supervised", config={"batch_size": 32})
    keras.utils.set_random_seed(0)
    settings = ["cycle_length=1", "validation_fraction=0"]
    split = beatloop.load_data(f"tfrecord:{pattern}", settings, recipe=recipe, seed=0)
    streamed = beatloop.fit(recipe, data=split, epochs=2, seed=0, progress=False)
    keras.utils.set_random_seed(0)
    data = DataSplit(batches(arrays, 32, shuffle_seed=0))
    in_memory = beatloop.fit("supervised", data=data, epochs=2, seed=0, progress=False)
    assert streamed.steps == in_memory.steps == 14
    assert_same_weights(
        model_weights(streamed.models["model"]), model_weights(in_memory.models["model"])
    )


def test_the_gan_trains_from_python_on_signed_images(digits_records):
    pattern, _, _ = digits_records
    gan = beatloop.make_recipe("gan", config={"batch_size": 50, "quality_samples": 32})
    split = beatloop.load_data(f"tfrecord:{pattern}", ["shuffle_buffer=64"], recipe=gan, seed=1)
    result = beatloop.fit(gan, data=split, epochs=1, seed=1, progress=False)
    assert result.steps == 4  # 200 images in batches of 50
    assert np.isfinite(result.history["d_loss"][0]) and np.isfinite(result.history["g_loss"][0])


# --- splits ---------------------------------------------------------------------------


def test_a_fraction_of_the_records_held_out(digits_records):
    pattern, _, _ = digits_records
    split = source(pattern, validation_fraction=0.25).load(seed=3, batch_size=16)
    train, validation = every_batch(split.train)["id"], every_batch(split.validation)["id"]
    assert (len(train), len(validation)) == (150, 50)
    assert sorted([*train, *validation]) == list(range(200))
    again = source(pattern, validation_fraction=0.25).load(seed=3, batch_size=16)
    assert sorted(every_batch(again.validation)["id"]) == sorted(validation)  # by the seed
    other = source(pattern, validation_fraction=0.25).load(seed=4, batch_size=16)
    assert sorted(every_batch(other.validation)["id"]) != sorted(validation)


def test_files_held_out_by_glob_and_by_fraction(digits_records):
    pattern, paths, _ = digits_records
    held = paths[2].replace("00002", "0000[2]")
    split = source(pattern, validation_files=held).load(seed=0, batch_size=16)
    train, validation = every_batch(split.train)["id"], every_batch(split.validation)["id"]
    assert sorted(validation) == list(range(110, 160))  # the third file's records
    assert sorted(train) == [*range(110), *range(160, 200)]
    split = source(pattern, validation_files="0.25").load(seed=1, batch_size=16)
    validation = sorted(every_batch(split.validation)["id"])
    files = file_ids()
    assert set(validation) in files  # one whole file of the four
    assert sorted([*every_batch(split.train)["id"], *validation]) == list(range(200))
    with pytest.raises(DataError, match=r"validation_files=0.05 of 4 file\(s\) holds out 0"):
        source(pattern, validation_files="0.05").load(seed=0, batch_size=16)
    with pytest.raises(ConfigError, match=r"both hold out validation data; use one"):
        source(pattern, validation_files="0.25", validation_fraction=0.1).load(0, 16)


# --- training from the command line -------------------------------------------------


def _run(tmp_path, *arguments):
    return main(["run", *arguments, "--seed", "0", "--run-dir", str(tmp_path / "run"), "--quiet"])


def test_supervised_and_gan_train_from_the_command_line(tmp_path, digits_records, capsys):
    pattern, _, _ = digits_records
    code = _run(
        tmp_path / "s", "supervised", "--data", f"tfrecord:{pattern}",
        "--data-set", "validation_fraction=0.2", "--epochs", "2",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    records = history_records(tmp_path / "s" / "run")
    assert [r["step"] for r in records] == [5, 10]  # 160 training records in batches of 32
    assert "val_accuracy" in records[-1]
    code = _run(
        tmp_path / "g", "gan", "--data", f"tfrecord:{pattern}",
        "--data-set", "batch_size=40", "--epochs", "2",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    records = history_records(tmp_path / "g" / "run")
    assert [r["step"] for r in records] == [5, 10]
    assert all(np.isfinite(r["d_loss"]) and np.isfinite(r["g_loss"]) for r in records)
    gan = beatloop.make_recipe("gan")
    x = every_batch(load_data(f"tfrecord:{pattern}", [], recipe=gan, seed=0).train)["x"]
    assert x.min() == -1.0  # the gan's source_defaults: value_range=signed


def test_evaluate_without_data_uses_the_recorded_validation_files(tmp_path, digits_records, capsys):
    """``beatloop run ... --data tfrecord:GLOB --data-set validation_files=0.25``, then
    ``beatloop evaluate RUN_DIR``: the run's last val_ figures, exactly."""
    pattern, _, _ = digits_records
    code = _run(
        tmp_path, "supervised", "--data", f"tfrecord:{pattern}",
        "--data-set", "validation_files=0.25", "--epochs", "2",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    last = history_records(tmp_path / "run")[-1]
    expected = {k.removeprefix("val_"): v for k, v in last.items() if k.startswith("val_")}
    assert set(expected) == {"loss", "accuracy"}
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert dict(map(str.split, out.splitlines())) == {k: f"{v:.4g}" for k, v in expected.items()}
    assert beatloop.evaluate(tmp_path / "run") == expected


# --- bad files -------------------------------------------------------------------------


def test_a_file_that_is_not_a_tfrecord_file_is_named(tmp_path, digits_records, capsys):
    _, paths, _ = digits_records
    folder = tmp_path / "data"
    folder.mkdir()
    for path in paths[:2]:
        (folder / path.rsplit("/", 1)[1]).write_bytes(Path(path).read_bytes())
    (folder / "train-00002.tfrecord").write_text("id,label\n1,2\n")
    code = _run(tmp_path, "supervised", "--data", f"tfrecord:{folder}/*.tfrecord")
    err = capsys.readouterr().err
    assert code == 3
    assert f"the file '{folder}/train-00002.tfrecord' is not a readable TFRecord file" in err
    assert "corrupted record at 0" in err and "Traceback" not in err
    whole = (folder / "train-00001.tfrecord").read_bytes()
    (folder / "train-00002.tfrecord").write_bytes(whole[: len(whole) - 20])  # cut short
    with pytest.raises(DataError, match=r"'[^']*train-00002.tfrecord' is truncated: its record"):
        source(f"{folder}/*.tfrecord").load(seed=0, batch_size=8)


def test_a_record_that_does_not_parse_or_fit_is_named(tmp_path, digits_records):
    _, paths, _ = digits_records
    folder = tmp_path / "data"
    write_shards(folder, "a", [], sizes=(0,))  # an empty file, sorted first: no records, fine
    garbage = write_shards(folder, "b", [b"\xff\x00 not an Example"], sizes=(1,))[0]
    with pytest.raises(DataError, match=rf"the first record of the file '{garbage}'.*not a ser"):
        source(str(folder / "*.tfrecord")).load(seed=0, batch_size=8)
    first = next(iter(tf.data.TFRecordDataset(paths[0]))).numpy()
    image = tf.train.Example.FromString(first).features.feature["image"].bytes_list.value[0]
    no_label = _example(image=("bytes", [image]), id=("int64", [0]))
    write_shards(folder, "b", [first, no_label], sizes=(1, 1))
    with pytest.raises(DataError) as caught:
        source(str(folder / "*.tfrecord")).load(seed=0, batch_size=8)
    assert f"the first record of the file '{folder}/b-00001.tfrecord'" in str(caught.value)
    assert "it has no feature 'label' (it has ['id', 'image'])" in str(caught.value)
    with pytest.raises(DataError, match=r"the glob '[^']*nothing-\*' matches no file"):
        source(str(folder / "nothing-*")).load(seed=0, batch_size=8)


# --- sharding ----------------------------------------------------------------------------


def test_workers_shard_by_data_unless_asked_to_shard_by_file(digits_records):
    """By default every worker reads every file and keeps its part of each global batch
    (the batches one device takes: ``tests/test_data_order.py`` runs two workers)."""
    pattern, _, _ = digits_records
    split = source(pattern, validation_fraction=0.2).load(seed=0, batch_size=16)
    for dataset in (split.train, split.validation):
        policy = dataset.options().experimental_distribute.auto_shard_policy
        assert policy == tf.data.experimental.AutoShardPolicy.DATA


def test_with_shard_file_workers_read_whole_files_each_record_once(digits_records, monkeypatch):
    """tf.distribute's auto-shard (what ``experimental_distribute_dataset`` applies under
    a multi-worker strategy), run here in one process for two workers."""
    from tensorflow.python.data.experimental.ops.distribute import _AutoShardDataset

    pattern, _, _ = digits_records
    split = source(pattern, validation_fraction=0.2, shard="file").load(seed=0, batch_size=16)
    policy = split.train.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.FILE
    files = file_ids()
    seen = []
    for worker in range(2):
        shard = _AutoShardDataset(split.train, num_workers=2, index=worker, num_replicas=2)
        ids = set(every_batch(shard)["id"])
        assert not ids - files[worker].union(files[worker + 2])  # files 0, 2 and 1, 3
        seen.append(ids)
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 160  # every training record once
    # more workers than files: sharded by data instead (FILE would fail)
    cluster = {"cluster": {"worker": [f"127.0.0.1:{port}" for port in range(5000, 5005)]}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    split = source(pattern, shard="file").load(seed=0, batch_size=16)
    policy = split.train.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.DATA


# --- resume --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_bit_identical(tmp_path, digits_records):
    from test_checkpoints import WORKER

    pattern, _, _ = digits_records
    data = {"source": f"tfrecord:{pattern}", "settings": ["validation_fraction=0.2"]}
    spec = {"recipe": "supervised", "config": {"batch_size": 16, "dropout": 0.3}, "data": data}
    spec.update(epochs=2, seed=3, checkpoint_every=4)  # 10 steps an epoch; kill at 13
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"

    resumable_run = import_worker("resumable_run")
    # Only the killed run needs a process; the others are fitted here meanwhile.
    killed_spec = {**spec, "run_dir": str(killed_dir), "kill_at": 13, "out": "unused"}
    killed = start_python(str(WORKER), json.dumps(killed_spec))
    try:
        full = resumable_run.fit({**spec, "run_dir": str(full_dir)})
    finally:
        _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    assert len(history_records(killed_dir)) == 1  # epoch 1 finished, epoch 2 cut short
    resumed = resumable_run.fit({**spec, "run_dir": str(killed_dir)})
    assert resumed.resumed_from.endswith("ckpt-5") and resumed.steps == 20  # 0 4 8 10 12
    assert_same_weights(all_weights(resumed.models), all_weights(full.models))
    assert history_records(killed_dir) == history_records(full_dir)
