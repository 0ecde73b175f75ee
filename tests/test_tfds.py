"""The ``tfds`` source: a small real TensorFlow Datasets data set, built by the test's own
``GeneratorBasedBuilder`` and prepared with TFDS's ``download_and_prepare`` (once for the
module), read back without its builder code: the rows ``tfds.load`` gives, the weights
training on the same data as ``tf.data`` gives, features as batch keys, each damaged or
mismatched data set one error naming it, a resume on another version refused unless
accepted, sharded by data across workers, tensorflow-datasets imported only on load."""

from __future__ import annotations

import runpy
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from helpers import all_weights, assert_same_weights

import beatloop
from beatloop import ConfigError, DataError
from beatloop.cli import main
from beatloop.core.data.batches import DataSplit
from beatloop.datasets import batches
from beatloop.named_data.load import NamedData, make_source

NAME = "beatloop_digits"
ROWS = {"train": 200, "test": 40}


class BeatloopDigits(tfds.core.GeneratorBasedBuilder):
    """240 of scikit-learn's digits: pixels as a vector and as an image, the digit, its
    index (an int64 id), a name (a string) and a ragged list (no one shape)."""

    VERSION = tfds.core.Version("1.0.0")
    SUPPORTED_VERSIONS = [tfds.core.Version("2.0.0")]

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "pixels": tfds.features.Tensor(shape=(64,), dtype=np.float32),
                    "image": tfds.features.Image(shape=(8, 8, 1)),
                    "digit": tfds.features.ClassLabel(num_classes=10),
                    "index": np.int64,
                    "name": tfds.features.Text(),
                    "strokes": tfds.features.Tensor(shape=(None,), dtype=np.int64),
                }
            ),
            supervised_keys=("pixels", "digit"),
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split) for split in ROWS}

    def _generate_examples(self, split):
        from sklearn.datasets import load_digits

        digits = load_digits()
        start = 0 if split == "train" else ROWS["train"]
        for index in range(start, start + ROWS[split]):
            yield (
                index,
                {
                    "pixels": (digits.data[index] / 16).astype(np.float32),
                    "image": digits.images[index].astype(np.uint8)[:, :, None],
                    "digit": int(digits.target[index]),
                    "index": index,
                    "name": f"digit-{index}",
                    "strokes": np.arange(index % 3 + 1),
                },
            )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A data_dir holding version 1.0.0, and one holding 2.0.0 beside it (to copy in)."""
    root = tmp_path_factory.mktemp("tfds")
    for version, folder in (("1.0.0", "data"), ("2.0.0", "newer")):
        builder = BeatloopDigits(data_dir=str(root / folder), version=version)
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(verify_ssl=False))
    return root


def data_dir(prepared, tmp_path) -> str:
    """A copy of the prepared 1.0.0 data_dir a test may damage."""
    shutil.copytree(prepared / "data", tmp_path / "data")
    return str(tmp_path / "data")


def all_batches(dataset) -> dict[str, np.ndarray]:
    parts = list(dataset.as_numpy_iterator())
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


def refused(path: str, *settings: str) -> str:
    with pytest.raises(DataError) as caught:
        make_source(f"tfds:{path}", settings).load(seed=0, batch_size=16)
    return str(caught.value)


# --- the rows tfds.load gives, the weights tf.data gives ------------------------------


def test_the_rows_are_the_ones_tfds_load_gives_read_without_the_builder(prepared):
    where = f"data_dir={prepared / 'data'}"
    split = make_source(
        f"tfds:{NAME}", [where, "as_supervised=true", "shuffle=false", "validation_split=test"]
    ).load(seed=0, batch_size=32)
    for role, name in (("train", "train"), ("validation", "test")):
        loaded = tfds.load(
            NAME, data_dir=str(prepared / "data"), split=name, as_supervised=True, download=False
        )
        x, y = (np.stack(part) for part in zip(*loaded.as_numpy_iterator(), strict=True))
        found = all_batches(getattr(split, role))
        np.testing.assert_array_equal(found["x"], x)
        np.testing.assert_array_equal(found["y"], y.astype(np.int32))
    # read from the prepared folder alone: no registered builder class is looked up
    source = make_source(f"tfds:{NAME}:1.0.0", [where])
    assert type(source._builder()).__name__ == "ReadOnlyBuilder"
    # the feature dict: a key per feature a batch can hold (no string, no ragged list)
    spec = source.load(seed=0, batch_size=8).train.element_spec
    assert {key: (value.dtype, value.shape.as_list()) for key, value in spec.items()} == {
        "pixels": (tf.float32, [None, 64]),
        "image": (tf.float32, [None, 8, 8, 1]),
        "digit": (tf.int32, [None]),
        "index": (tf.int32, [None]),
    }


def test_training_equals_the_same_data_as_tf_data_bit_for_bit(prepared):
    loaded = tfds.load(NAME, data_dir=str(prepared / "data"), split="train", download=False)
    rows = [(row["pixels"], row["digit"]) for row in loaded.as_numpy_iterator()]
    train = {"x": np.stack([x for x, _ in rows]), "y": np.array([y for _, y in rows], np.int32)}

    def in_memory(recipe, seed):
        return DataSplit(batches(train, 50, shuffle_seed=seed))

    options = {"config": {"batch_size": 50, "hidden": 16}, "epochs": 2, "seed": 4}
    before = beatloop.fit("supervised", data=in_memory, **options, progress=False)
    named = NamedData(f"tfds:{NAME}", (f"data_dir={prepared / 'data'}", "as_supervised=true"))
    streamed = beatloop.fit("supervised", data=named, **options, progress=False)
    assert streamed.steps == before.steps == 8
    assert_same_weights(all_weights(streamed.models), all_weights(before.models))


def test_features_chosen_as_csv_columns_are(prepared):
    where = f"data_dir={prepared / 'data'}"
    settings = [where, "label=digit", "features=image,index", "keys=name", "value_range=signed"]
    split = make_source(f"tfds:{NAME}", settings).load(seed=0, batch_size=16)
    spec = split.train.element_spec
    assert spec["x"].shape.as_list() == [None, 65] and spec["name"].dtype == tf.string
    rows = all_batches(make_source(f"tfds:{NAME}", [*settings, "shuffle=false"]).load(0, 16).train)
    np.testing.assert_allclose(rows["x"][:, :64].max(), 16 / 127.5 - 1, rtol=1e-6)
    np.testing.assert_array_equal(np.sort(rows["x"][:, 64]), np.arange(200))  # every row
    assert [name.decode() for name in rows["name"]] == [f"digit-{i:.0f}" for i in rows["x"][:, 64]]
    held = make_source(f"tfds:{NAME}", [where, "label=digit", "validation_fraction=0.25"])
    held = held.load(seed=0, batch_size=16)
    assert int(held.train.cardinality()) == 10 and int(held.validation.cardinality()) == 4


# --- errors, each before the first step -------------------------------------------------


def test_a_data_set_not_prepared_names_the_command_to_prepare_it(prepared, tmp_path, capsys):
    empty = str(tmp_path)
    code = main(
        ["run", "supervised", "--data", f"tfds:{NAME}", "--data-set", f"data_dir={empty}",
         "--run-dir", str(tmp_path / "run"), "--quiet"]
    )  # fmt: skip
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 3 and len(errors) == 1 and "is not prepared in" in errors[0], errors
    assert not (tmp_path / "run").exists()
    assert refused(NAME, f"data_dir={empty}") == (
        f"data source 'tfds:{NAME}': '{NAME}' is not prepared in '{empty}'; beatloop never "
        f"downloads: prepare it first with `tfds build {NAME} --data_dir {empty}` or "
        f"tfds.load('{NAME}', data_dir='{empty}', download=True)"
    )
    where = str(prepared / "data")
    assert refused(f"{NAME}:3.0.0", f"data_dir={where}") == (
        f"data source 'tfds:{NAME}:3.0.0': version 3.0.0 of '{NAME}' is not prepared in "
        f"'{where}' (prepared: 1.0.0); beatloop never downloads: prepare it first with "
        f"`tfds build {NAME}:3.0.0 --data_dir {where}` or tfds.load('{NAME}:3.0.0', "
        f"data_dir='{where}', download=True)"
    )


def test_a_missing_split_feature_or_file_is_one_error_naming_it(prepared, tmp_path):
    where = data_dir(prepared, tmp_path)
    label = f"data source 'tfds:{NAME}': the data set '{NAME}/1.0.0'"
    assert refused(NAME, f"data_dir={where}", "split=validation") == (
        f"{label} cannot read the split 'validation': Unknown split 'validation'. Should be "
        "one of ['train', 'test']."
    )
    assert refused(NAME, f"data_dir={where}", "label=target") == (
        f"{label} has no feature(s) ['target']; its features: ['digit', 'image', 'index', "
        "'name', 'pixels', 'strokes']"
    )
    assert refused(NAME, f"data_dir={where}", "label=digit", "features=strokes") == (
        f"{label}, feature 'strokes' has shape (None,), not one shape per example: a batch "
        "cannot stack it; leave it out (--data-set features=... or keys=...)"
    )
    assert refused(NAME, f"data_dir={where}", "label=digit", "features=pixels,name") == (
        f"{label}, feature 'name' holds string, not numbers: it cannot be stacked into x; "
        "leave it out with --data-set features=..., or make it a key of its own"
    )
    assert "as_supervised=true gives x and y itself" in refused(
        NAME, f"data_dir={where}", "as_supervised=true", "label=digit"
    )
    shard = next((tmp_path / "data" / NAME / "1.0.0").glob("*-test.tfrecord-*"))
    shard.unlink()
    assert refused(NAME, f"data_dir={where}", "validation_split=test") == (
        f"data source 'tfds:{NAME}': split 'test' of the data set '{NAME}/1.0.0' lacks its "
        f"file(s) ['{shard}']; prepare it again"
    )


def test_without_tensorflow_datasets_loading_names_the_extra(prepared, monkeypatch):
    for name in [name for name in sys.modules if name.split(".")[0] == "tensorflow_datasets"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import: ImportError
    module = runpy.run_path(beatloop.sources.tfds.__file__)  # the module needs none
    source = make_source(f"tfds:{NAME}", [f"data_dir={prepared / 'data'}"])
    assert isinstance(source, module["DataSource"])
    with pytest.raises(ConfigError) as caught:
        source.load(seed=0, batch_size=8)
    assert str(caught.value) == (
        f"data source 'tfds:{NAME}': reading TensorFlow Datasets needs tensorflow-datasets, "
        'which comes with the tfds extra: pip install "beatloop[tfds]"'
    )


# --- resume, workers ---------------------------------------------------------------------


def test_a_resume_on_another_version_is_refused_unless_accepted(prepared, tmp_path):
    from test_data_identity import _run_json

    def _fit(data, run_dir, epochs: int, **options):
        return beatloop.fit(
            "supervised", data=data, config={"hidden": 8}, epochs=epochs, seed=0,
            run_dir=run_dir, progress=False, **options,
        )  # fmt: skip

    where = data_dir(prepared, tmp_path)
    named = NamedData(f"tfds:{NAME}", (f"data_dir={where}", "label=digit", "batch_size=50"))
    _fit(named, tmp_path / "run", 1)
    (recorded,) = _run_json(tmp_path / "run")["data_files"]
    assert recorded["facts"] == {
        "name": NAME, "config": "", "version": "1.0.0", "split": "train", "data_dir": where
    }  # fmt: skip
    assert [entry["path"] for entry in recorded["files"]] == [
        "beatloop_digits-train.tfrecord-00000-of-00001", "dataset_info.json", "features.json"
    ]  # fmt: skip
    shutil.copytree(prepared / "newer" / NAME / "2.0.0", tmp_path / "data" / NAME / "2.0.0")
    with pytest.raises(DataError) as caught:  # the newest prepared version is read now
        _fit(named, tmp_path / "run", 2)
    assert f"since its run.json recorded it: tfds:{NAME}: version 1.0.0 -> 2.0.0" in str(
        caught.value
    )
    assert _fit(named, tmp_path / "run", 2, accept_changed_data=True).epochs == 2


def test_workers_shard_by_data_each_row_once_per_pass(prepared):
    from tensorflow.python.data.experimental.ops.distribute import _AutoShardDataset

    settings = [f"data_dir={prepared / 'data'}", "label=index", "validation_fraction=0.2"]

    def pipeline():
        tf.random.set_seed(0)
        return make_source(f"tfds:{NAME}", settings).load(seed=0, batch_size=16)

    policy = tf.data.experimental.AutoShardPolicy.DATA
    for dataset in (pipeline().train, pipeline().validation):
        assert dataset.options().experimental_distribute.auto_shard_policy == policy
    seen = []
    for index in range(2):
        shard = _AutoShardDataset(pipeline().train, 2, index, num_replicas=2)
        seen += all_batches(shard)["y"].tolist()
    assert len(seen) == 160 and len(set(seen)) == 160  # the training rows, once each
