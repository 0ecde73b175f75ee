"""Data on the command line: ``--data KIND:PATH`` sources (a folder of images, a CSV file,
an ``.npz`` file, a plugin's), their parameters, and their refusals. Every file is one
the test writes."""

import importlib
import json
import math
import shutil
import sys
import textwrap
import warnings

import numpy as np
import pytest
from helpers import history_records
from PIL import Image

import beatloop
from beatloop import ConfigError, DataError, RegistrationError
from beatloop import datasets as builtin_data
from beatloop.cli import main
from beatloop.named_data.load import load_data
from beatloop.plugins import registry as registry_module
from beatloop.recipes.gan import Gan
from beatloop.recipes.supervised import Supervised

IMAGES = 40  # digits written as PNGs: 4 per class for the ten classes


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    """The first 40 of scikit-learn's 8x8 digits as grayscale PNGs in one subfolder per
    class (``0`` ... ``9``), and the pixels and labels written."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    folder = tmp_path_factory.mktemp("digits") / "images"
    pixels = np.round(digits.images[:IMAGES] * 255 / 16).astype(np.uint8)
    labels = digits.target[:IMAGES]
    for index, (picture, label) in enumerate(zip(pixels, labels, strict=True)):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(picture, mode="L").save(folder / str(label) / f"{index:03d}.png")
    return folder, pixels, labels


@pytest.fixture(scope="module")
def digits_csv(tmp_path_factory, small_digits):
    """200 training digits as a CSV: 64 pixel columns p0..p63 and the label column
    ``digit``; and the arrays written."""
    train, _ = small_digits
    path = tmp_path_factory.mktemp("csv") / "digits.csv"
    header = [f"p{i}" for i in range(64)] + ["digit"]
    rows = [
        ",".join([*(repr(float(v)) for v in x), str(int(y))])
        for x, y in zip(train["x"], train["y"], strict=True)
    ]
    path.write_text("\n".join([",".join(header), *rows]) + "\n")
    return path, train


def _run(tmp_path, *arguments):
    return main(["run", *arguments, "--seed", "0", "--run-dir", str(tmp_path / "run"), "--quiet"])


GAN_FOLDER = ["--data-set", "image_size=8,8", "--data-set", "color_mode=grayscale"]


def test_gan_trains_on_a_folder_of_pngs(tmp_path, digits_folder, capsys):
    folder, _, _ = digits_folder
    code = _run(
        tmp_path, "gan", "--data", f"folder:{folder}", *GAN_FOLDER,
        "--data-set", "batch_size=8", "--epochs", "2",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    records = history_records(tmp_path / "run")
    assert [r["step"] for r in records] == [5, 10]  # 40 images in batches of 8, twice
    for record in records:
        assert math.isfinite(record["d_loss"]) and math.isfinite(record["g_loss"])
    assert "val_d_loss" not in records[0]  # validation_fraction is 0 by default
    # 64-pixel images: the digits classifier scores the samples, as with the built-in data
    assert "sample_score" in records[-1]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert "shape=(None, 8, 8, 1)" in run["data"]["x"] and "int32" in run["data"]["y"]


def _rows(x: np.ndarray, y: np.ndarray) -> list:
    """(label, pixels) pairs in a fixed order, to compare data sets whatever their order."""
    return sorted((int(label), row.ravel().tolist()) for label, row in zip(y, x, strict=True))


def test_a_folder_gives_the_pixels_scaled_as_the_recipe_wants_and_class_labels(digits_folder):
    folder, pixels, labels = digits_folder
    settings = ["image_size=8,8", "color_mode=grayscale", f"batch_size={IMAGES}"]
    # the gan asks for pixels in [-1, 1] (source_defaults); supervised takes the default [0, 1]
    for recipe, (scale, shift) in ((Gan(), (127.5, -1.0)), (Supervised(), (255.0, 0.0))):
        split = load_data(f"folder:{folder}", settings, recipe=recipe, seed=0)
        batch = next(iter(split.train))
        assert batch["x"].shape == (IMAGES, 8, 8, 1) and split.validation is None
        assert batch["y"].dtype.name == "int32"
        x = batch["x"].numpy()
        assert x.min() == shift and x.max() == pytest.approx(1.0)  # the range's two ends
        unscaled = np.rint((x - shift) * scale).astype(int)
        np.testing.assert_allclose(x, unscaled / scale + shift, atol=1e-6)
        assert _rows(unscaled, batch["y"].numpy()) == _rows(pixels, labels)
    # the user's setting wins over the recipe's
    raw = load_data(f"folder:{folder}", [*settings, "value_range=raw"], recipe=Gan(), seed=0)
    assert float(next(iter(raw.train))["x"].numpy().max()) == 255.0


def test_validation_fraction_holds_out_examples_chosen_by_the_seed(digits_folder):
    folder, _, labels = digits_folder
    settings = ["image_size=8,8", "color_mode=grayscale", "validation_fraction=0.25"]

    def split_rows(seed):
        split = load_data(f"folder:{folder}", settings, recipe=Supervised(), seed=seed)
        train = [b for b in split.train.as_numpy_iterator()]
        validation = [b for b in split.validation.as_numpy_iterator()]
        rows = lambda batches: _rows(  # noqa: E731
            np.concatenate([b["x"] for b in batches]).round(4),
            np.concatenate([b["y"] for b in batches]),
        )
        return rows(train), rows(validation)

    train, validation = split_rows(0)
    assert len(train) == 30 and len(validation) == 10
    assert sorted(train + validation) == sorted(split_rows(0)[0] + split_rows(0)[1])
    assert [label for label, _ in sorted(train + validation)] == sorted(labels.tolist())
    assert split_rows(0) == (train, validation)  # the same seed, the same split
    assert split_rows(1)[1] != validation  # another seed, other examples held out


def _notice(folder, shown: str, chosen: str) -> str:
    return (
        f"data source 'folder:{folder}': images are {shown} (inferred: {chosen}; set "
        f"{'them' if ', ' in chosen else 'it'} with --data-set to change)"
    )


def test_a_folder_infers_the_size_and_colour_mode_its_images_share(digits_folder):
    folder, _, _ = digits_folder
    given = ["image_size=8,8", "color_mode=grayscale", f"batch_size={IMAGES}"]
    expected = next(iter(load_data(f"folder:{folder}", given, recipe=Gan(), seed=0).train))
    cases = {
        (): ("8x8 grayscale", "image_size=8,8, color_mode=grayscale"),
        ("image_size=8,8",): ("grayscale", "color_mode=grayscale"),
        ("color_mode=grayscale",): ("8x8", "image_size=8,8"),
    }
    for settings, (shown, chosen) in cases.items():
        with pytest.warns(beatloop.InferredSettingWarning) as caught:
            split = load_data(
                f"folder:{folder}", [*settings, f"batch_size={IMAGES}"], recipe=Gan(), seed=0
            )
        assert [str(w.message) for w in caught] == [_notice(folder, shown, chosen)]
        batch = next(iter(split.train))
        assert batch["x"].shape == (IMAGES, 8, 8, 1)
        np.testing.assert_array_equal(batch["x"], expected["x"])  # as if given: no resizing
        np.testing.assert_array_equal(batch["y"], expected["y"])
    # A recipe's source_defaults are given settings too: what they set is not inferred.

    class FourByFour(Gan):
        source_defaults = {**Gan.source_defaults, "image_size": (4, 4)}

    with pytest.warns(beatloop.InferredSettingWarning) as caught:
        split = load_data(f"folder:{folder}", [], recipe=FourByFour(), seed=0)
    assert [str(w.message) for w in caught] == [
        _notice(folder, "grayscale", "color_mode=grayscale")
    ]
    assert split.train.element_spec["x"].shape.as_list() == [None, 4, 4, 1]
    # A setting given wins over the images: resized and converted, no notice.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        split = load_data(
            f"folder:{folder}", ["image_size=4,6", "color_mode=rgb"], recipe=Gan(), seed=0
        )
    assert split.train.element_spec["x"].shape.as_list() == [None, 4, 6, 3]


def test_images_that_differ_are_refused_naming_two_and_what_to_set(tmp_path, digits_folder, capsys):
    folder = tmp_path / "images"
    shutil.copytree(digits_folder[0], folder)
    Image.fromarray(np.zeros((16, 12, 3), np.uint8)).save(folder / "5" / "big.png")
    first = folder / "0" / sorted(p.name for p in (folder / "0").iterdir())[0]
    line = _error(capsys, _run(tmp_path, "gan", "--data", f"folder:{folder}"), 3)
    assert line == (
        f"beatloop: error: data source 'folder:{folder}': its images are not all alike "
        f"(8x8 grayscale: 40, 16x12 rgb: 1): '{first}' is 8x8 grayscale, "
        f"'{folder / '5' / 'big.png'}' is 16x12 rgb; pass --data-set image_size=H,W and "
        "--data-set color_mode=grayscale|rgb|rgba to read every image alike"
    )
    assert not (tmp_path / "run").exists()
    code = _run(tmp_path, "gan", "--data", f"folder:{folder}", "--data-set", "image_size=8,8")
    line = _error(capsys, code, 3)
    assert "(grayscale: 40, rgb: 1)" in line and line.endswith(
        "is rgb; pass --data-set color_mode=grayscale|rgb|rgba to read every image alike"
    )
    with pytest.raises(DataError, match=r"16x12: 1\): .* pass --data-set image_size=H,W to"):
        load_data(f"folder:{folder}", ["color_mode=rgb"], recipe=Gan(), seed=0)
    split = load_data(f"folder:{folder}", GAN_FOLDER[1::2], recipe=Gan(), seed=0)
    assert split.train.element_spec["x"].shape.as_list() == [None, 8, 8, 1]  # given: read


def test_the_colour_mode_read_from_a_header_is_what_tensorflow_decodes(tmp_path):
    """Each kind of file the folder source reads: the size and channels inferred from its
    header are those TensorFlow's decoder gives it (2 channels, gray with alpha, read as
    rgba: Keras reads 1, 3 or 4)."""
    import tensorflow as tf

    from beatloop.sources.image_headers import COLOR_MODES, image_shape

    pixels = np.random.default_rng(0).integers(0, 255, (5, 7, 4), dtype=np.uint8)
    rgb, gray = Image.fromarray(pixels[..., :3], "RGB"), Image.fromarray(pixels[..., 0], "L")
    files = {
        "gray.png": (gray, {}), "gray-alpha.png": (gray.convert("LA"), {}),
        "rgb.png": (rgb, {}), "rgba.png": (Image.fromarray(pixels, "RGBA"), {}),
        "palette.png": (rgb.convert("P"), {}),
        "palette-clear.png": (rgb.convert("P"), {"transparency": 0}),
        "gray16.png": (Image.fromarray(pixels[..., 0].astype(np.uint16) * 200), {}),
        "gray.jpg": (gray, {}), "cmyk.jpg": (rgb.convert("CMYK"), {}), "rgb.jpg": (rgb, {}),
        "gray.gif": (gray, {}), "rgb.bmp": (rgb, {}), "gray.bmp": (gray, {}),
        "rgba.bmp": (Image.fromarray(pixels, "RGBA"), {}),
    }  # fmt: skip
    for name, (image, options) in files.items():
        image.save(tmp_path / name, **options)
    (tmp_path / "jpeg-named.png").write_bytes((tmp_path / "rgb.jpg").read_bytes())
    modes = {}
    for path in sorted(tmp_path.iterdir()):
        decoded = tf.io.decode_image(tf.io.read_file(str(path)), expand_animations=False)
        shape = image_shape(path)
        assert (shape.height, shape.width) == (5, 7) == tuple(decoded.shape[:2]), path.name
        assert shape.color_mode == COLOR_MODES[decoded.shape[2]], path.name
        modes[path.name] = shape.color_mode
    assert modes["gray-alpha.png"] == modes["palette-clear.png"] == modes["rgba.bmp"] == "rgba"
    assert modes["palette.png"] == modes["gray.gif"] == modes["cmyk.jpg"] == "rgb"
    assert modes["gray16.png"] == modes["gray.jpg"] == modes["gray.bmp"] == "grayscale"


def test_a_csv_run_of_supervised_matches_fit_on_the_same_arrays(tmp_path, digits_csv, capsys):
    path, train = digits_csv
    code = _run(
        tmp_path, "supervised", "--data", f"csv:{path}", "--data-set", "label=digit",
        "--set", "batch_size=50", "--set", "hidden=16", "--epochs", "2",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    records = history_records(tmp_path / "run")
    assert [r["step"] for r in records] == [4, 8]  # 200 rows in batches of 50 (the recipe's)
    expected = beatloop.fit(
        "supervised",
        data=builtin_data.batches(train, 50, shuffle_seed=0),
        config={"batch_size": 50, "hidden": 16},
        epochs=2,
        seed=0,
    )
    assert [r["loss"] for r in records] == pytest.approx(expected.history["loss"], rel=1e-6)
    assert [r["accuracy"] for r in records] == expected.history["accuracy"]
    assert records[1]["loss"] < records[0]["loss"]


def test_an_npz_run_with_validation_data_matches_fit_on_the_same_arrays(tmp_path, capsys):
    train, validation = builtin_data.breast_cancer_arrays(seed=0)
    np.savez(tmp_path / "train.npz", **train)
    np.savez(tmp_path / "validation.npz", **validation)
    code = _run(
        tmp_path, "risk_weighted", "--data", f"npz:{tmp_path / 'train.npz'}",
        "--validation-data", f"npz:{tmp_path / 'validation.npz'}", "--data-set", "batch_size=64",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    (record,) = history_records(tmp_path / "run")
    assert record["step"] == math.ceil(len(train["y"]) / 64)
    expected = beatloop.fit(
        "risk_weighted",
        data=(
            builtin_data.batches(train, 64, shuffle_seed=0),
            builtin_data.batches(validation, 64),
        ),
        seed=0,
    )
    for name in ("loss", "val_loss", "val_auc"):
        assert record[name] == pytest.approx(expected.history[name][0], rel=1e-6), name


# --- refusals -----------------------------------------------------------------------------


def _error(capsys, code: int, expected_code: int) -> str:
    err = capsys.readouterr().err
    assert code == expected_code, err
    (line,) = [line for line in err.splitlines() if line.startswith("beatloop: error:")]
    return line


def test_a_source_without_the_recipes_keys_is_refused_naming_both(tmp_path, digits_csv, capsys):
    path, _ = digits_csv
    line = _error(capsys, _run(tmp_path, "supervised", "--data", f"csv:{path}"), 3)
    assert "recipe 'supervised' expects batches with keys ['x', 'y']" in line
    assert f"csv:{path}' gives ['x'] (missing ['y'])" in line
    assert "--data-set label=COLUMN" in line
    assert not (tmp_path / "run").exists()  # refused before anything is written
    np.savez(tmp_path / "pair.npz", x=np.zeros((4, 8, 8, 3), np.float32), y=np.zeros(4))
    code = _run(tmp_path, "style_transfer", "--data", f"npz:{tmp_path / 'pair.npz'}")
    line = _error(capsys, code, 3)
    assert "expects batches with keys ['content', 'style']" in line
    assert "gives ['x', 'y'] (missing ['content', 'style'])" in line


def test_missing_files_and_columns_and_keys_are_data_errors(tmp_path, digits_csv, capsys):
    path, _ = digits_csv
    (tmp_path / "empty").mkdir()
    np.savez(tmp_path / "a.npz", x=np.zeros((4, 2), np.float32))
    cases = {
        f"folder:{tmp_path / 'nowhere'}": "there is no folder",
        f"folder:{tmp_path / 'empty'}": "holds no images (.png .jpg .jpeg .bmp .gif)",
        f"csv:{tmp_path / 'none.csv'}": "none.csv' is not there",
        f"npz:{tmp_path / 'empty'}": "is a folder, not a file",
    }
    for source, words in cases.items():
        line = _error(capsys, _run(tmp_path, "supervised", "--data", source), 3)
        assert f"data source '{source}'" in line and words in line, line
    code = _run(tmp_path, "supervised", "--data", f"csv:{path}", "--data-set", "label=label")
    line = _error(capsys, code, 3)
    assert "the CSV has no column(s) ['label']; its columns: ['p0', 'p1'," in line
    assert "'p63', 'digit']" in line
    code = _run(tmp_path, "supervised", "--data", f"npz:{tmp_path / 'a.npz'}", "--data-set",
                "keys=x,y")  # fmt: skip
    assert "the file has no array(s) ['y']; it holds ['x']" in _error(capsys, code, 3)


def test_a_file_in_a_folder_that_is_no_image_is_a_data_error_naming_it(
    tmp_path, digits_folder, capsys
):
    folder = tmp_path / "images"
    shutil.copytree(digits_folder[0], folder)
    (folder / "3" / "notes.png").write_text("not an image")
    png = (folder / "1" / sorted(p.name for p in (folder / "1").iterdir())[0]).read_bytes()
    (folder / "7" / "cut.png").write_bytes(png[: len(png) // 2])
    line = _error(capsys, _run(tmp_path, "supervised", "--data", f"folder:{folder}"), 3)
    assert line == (
        f"beatloop: error: data source 'folder:{folder}': the file "
        f"'{folder / '3' / 'notes.png'}' is not a readable image (Unknown image file format. "
        "One of JPEG, JPEG XL, PNG, GIF, BMP, WebP required.) (and 1 more unreadable "
        "file(s)); every .png .jpg .jpeg .bmp .gif file under the folder must be a PNG, "
        "JPEG, BMP or GIF image: replace or remove it"
    )
    (folder / "3" / "notes.png").unlink()
    line = _error(capsys, _run(tmp_path, "supervised", "--data", f"folder:{folder}"), 3)
    assert f"the file '{folder / '7' / 'cut.png'}' is not a readable image (" in line


def test_unknown_kinds_and_bad_parameters_are_usage_errors(tmp_path, digits_csv, capsys):
    path, _ = digits_csv
    line = _error(capsys, _run(tmp_path, "gan", "--data", "foldr:images"), 2)
    assert "no data source kind 'foldr' (did you mean 'folder'?); known kinds: csv, folder" in line
    line = _error(capsys, _run(tmp_path, "gan", "--data", "images"), 2)
    assert "--data expects KIND:PATH" in line
    code = _run(tmp_path, "gan", "--data", f"csv:{path}", "--data-set", "batch_size=many")
    assert "'batch_size' expects int | None, got str 'many'" in _error(capsys, code, 2)
    code = _run(tmp_path, "gan", "--data", f"csv:{path}", "--data-set", "lable=digit")
    assert "has no config field 'lable' (did you mean 'label'?)" in _error(capsys, code, 2)
    code = _run(tmp_path, "gan", "--data", f"csv:{path}", "--data-set", "validation_fraction=1")
    assert "validation_fraction=...) takes a number in [0, 1), got 1.0" in _error(capsys, code, 2)
    code = _run(tmp_path, "gan", "--data", f"csv:{path}", "--data-set", "batch_size")
    assert "--data-set expects NAME=VALUE, got 'batch_size'" in _error(capsys, code, 2)
    code = _run(tmp_path, "gan", "--data-set", "batch_size=8")
    assert "--data-set needs --data KIND:PATH" in _error(capsys, code, 2)
    code = _run(
        tmp_path, "supervised", "--data", f"csv:{path}", "--data-set", "label=digit",
        "--data-set", "validation_fraction=0.2", "--validation-data", f"csv:{path}",
    )  # fmt: skip
    assert "use one" in _error(capsys, code, 2)


# --- what the command line shows --------------------------------------------------------


def test_data_help_lists_every_kind_and_its_parameters(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["data", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "usage: beatloop data" in out
    for kind in ("csv", "folder", "npz"):
        assert f"\n  {kind}: " in out and f"--data {kind}:PATH" in out
    for parameter in (
        "image_size: tuple[int, ...] | None = None",
        "color_mode: 'grayscale' | 'rgb' | 'rgba' | None = None",
        "value_range: 'unit' | 'signed' | 'raw' = 'unit'",
        "label: str | None = None",
        "batch_size: int | None = None",
        "validation_fraction: float = 0.0",
    ):
        assert parameter in out, parameter
    assert main(["data", "npz"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("npz: A NumPy .npz file") and "keys: tuple[str, ...] = ()" in out
    assert "folder" not in out


def test_show_says_what_data_a_recipe_takes(capsys):
    assert main(["show", "gan"]) == 0
    out = capsys.readouterr().out
    assert "batch keys: x (at least 2 dimension(s), batch first)" in out
    assert "source parameters it sets (unless --data-set sets them): value_range=signed" in out
    assert main(["show", "supervised"]) == 0
    assert "batch keys: x (at least 2 dimension(s), batch first), y (at least 1" in (
        capsys.readouterr().out
    )


def test_compare_passes_the_source_to_each_run(tmp_path, digits_csv, monkeypatch, capsys):
    """The parent hands each child its spec as JSON; here the child runs in-process."""
    from beatloop import compare

    path, _ = digits_csv
    specs = []

    def in_process(spec, timeout):
        specs.append(spec)
        return compare.run_one(json.loads(json.dumps(spec)))

    monkeypatch.setattr(compare, "_run_isolated", in_process)
    code = main(
        [
            "compare", "supervised", "--set", "hidden=8", "--data", f"csv:{path}",
            "--data-set", "label=digit", "--data-set", "batch_size=40", "--epochs", "1",
            "--out", str(tmp_path / "out"),
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    (spec,) = specs
    assert spec["data"] == f"csv:{path}" and spec["data_settings"] == [
        "label=digit",
        "batch_size=40",
    ]
    record = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert record["rows"][0]["steps"] == 5  # 200 rows in batches of 40, not the digits' 45
    assert record["data"]["source"] == f"csv:{path}"


# --- plugins ------------------------------------------------------------------------------

RAMP_SOURCE = """
import attrs
import numpy as np

import beatloop
from beatloop.datasets import split_arrays


@attrs.frozen
class RampConfig(beatloop.SourceConfig):
    count: int = 10


class Ramp(beatloop.DataSource):
    \"\"\"Made-up data: x a ramp of 4 features, y the row's parity.\"\"\"

    name = "ramp"
    Config = RampConfig

    def load(self, seed, batch_size):
        x = np.linspace(0, 1, self.config.count * 4, dtype=np.float32).reshape(-1, 4)
        y = (np.arange(self.config.count) % 2).astype(np.int32)
        return split_arrays({"x": x, "y": y}, self.config, seed, batch_size, self.label)


@beatloop.hookimpl
def register_data_sources():
    return [Ramp]
"""


@pytest.fixture
def ramp_plugin(tmp_path, monkeypatch):
    """A data source plugin installed as pip would leave it: a module and a dist-info
    folder declaring its ``beatloop`` entry point, on sys.path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(registry_module.DISABLE_AUTOLOAD, raising=False)
    (tmp_path / "bl_test_ramp.py").write_text(textwrap.dedent(RAMP_SOURCE))
    info = tmp_path / "bl_test_ramp-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bl-test-ramp\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[beatloop]\nbl_test_ramp = bl_test_ramp\n")
    importlib.invalidate_caches()
    registry_module.reset_registry()
    yield
    sys.modules.pop("bl_test_ramp", None)
    registry_module.reset_registry()


def test_a_plugins_source_is_usable_by_name(tmp_path, ramp_plugin, capsys):
    code = _run(
        tmp_path, "supervised", "--data", "ramp:-", "--data-set", "count=36",
        "--data-set", "batch_size=8", "--data-set", "validation_fraction=0.25",
        "--set", "classes=2",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    (record,) = history_records(tmp_path / "run")
    assert record["step"] == 4  # 27 training rows in batches of 8
    assert "val_loss" in record
    assert main(["data", "ramp"]) == 0
    out = capsys.readouterr().out
    assert "ramp: Made-up data" in out and "[bl-test-ramp]" in out and "count: int = 10" in out


def test_a_source_class_is_checked_when_registered(monkeypatch):
    registry = registry_module.Registry(load_entry_points=False)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)

    class Nameless(beatloop.DataSource):
        name = "not a name"
        Config = dict

    with pytest.raises(RegistrationError) as refused:
        beatloop.register_data_source(Nameless)
    message = str(refused.value)
    assert "has 3 problem(s)" in message and "lacks the method(s) load" in message
    assert "Python-style identifier (found 'not a name')" in message

    class Constant(beatloop.DataSource):
        """Four zeros."""

        name = "constant"

        def load(self, seed, batch_size):
            return beatloop.DataSplit(builtin_data.batches({"x": np.zeros((4, 2))}, batch_size))

    assert beatloop.register_data_source(Constant) is Constant
    assert registry.source("constant").origin == f"registered in {__name__}"
    split = load_data("constant:x", recipe=Gan(), seed=0)
    assert next(iter(split.train))["x"].shape == (4, 2)
    with pytest.raises(ConfigError, match="known kinds: constant, csv, folder, npz"):
        load_data("ramp:x", recipe=Gan(), seed=0)
    with pytest.raises(DataError, match="gives \\['x'\\] \\(missing \\['y'\\]\\)"):
        load_data("constant:x", recipe=Supervised(), seed=0)


def test_evaluate_takes_a_source_and_equals_evaluating_its_arrays(tmp_path, digits_csv, capsys):
    from helpers import tuple_batches

    import beatloop

    path, train = digits_csv
    source = ["--data", f"csv:{path}", "--data-set", "label=digit", "--data-set", "batch_size=50"]
    assert _run(tmp_path, "supervised", *source) == 0
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run"), *source]) == 0
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines())
    expected = beatloop.evaluate(tmp_path / "run", tuple_batches(train, 50))
    assert printed == {name: f"{value:.4g}" for name, value in expected.items()}
    assert set(expected) == {"loss", "accuracy"} and 0.0 < expected["accuracy"] < 1.0
    assert main(["evaluate", str(tmp_path / "run"), "--data-set", "label=digit"]) == 2
    assert "--data-set needs --data" in capsys.readouterr().err
