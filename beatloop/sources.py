"""Data sources: data named on the command line (``--data folder:PATH``) made into a
``DataSplit`` of dict batches.

A source kind is a registered class (built-ins: ``folder``, ``csv``, ``npz``; plugins add
more through the ``register_data_sources`` hook) with a ``name``, an attrs ``Config`` of
its parameters (set with ``--data-set NAME=VALUE``) and a ``load(seed, batch_size)``
method. ``load_data`` is what the ``run``, ``evaluate`` and ``compare`` commands call.
"""

from __future__ import annotations

import abc
import csv
import inspect
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs
import numpy as np

from beatloop.core.batches import DataSplit
from beatloop.core.config import make_config, parse_settings
from beatloop.core.errors import ConfigError, DataError

if TYPE_CHECKING:
    import tensorflow as tf

#: The batch size of a source that sets none, for a recipe without a ``batch_size`` field.
DEFAULT_BATCH_SIZE = 32


def _fraction(instance, attribute, value) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"{attribute.name} must be in [0, 1), got {value}")


def _positive_or_none(instance, attribute, value) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


@attrs.frozen
class SourceConfig:
    """Parameters every built-in source has.

    ``batch_size``: examples per batch (``None``: the recipe's ``batch_size`` field, else
    32). ``validation_fraction``: the share of examples held out for validation, chosen
    by the run's seed (0: no validation data unless ``--validation-data`` gives it).
    ``shuffle``: reshuffle the training examples every epoch (by the run's seed).
    """

    batch_size: int | None = attrs.field(default=None, validator=_positive_or_none)
    validation_fraction: float = attrs.field(default=0.0, validator=_fraction)
    shuffle: bool = True


class DataSource(abc.ABC):
    """Base class of data sources. One instance is one configured source on one path.

    Subclasses set ``name`` (an identifier: the ``KIND`` of ``--data KIND:PATH``) and
    ``Config`` (an attrs frozen class of parameters with defaults, usually a subclass of
    ``SourceConfig``), and implement ``load``. The first line of the class
    docstring is what ``beatloop data`` shows.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = SourceConfig

    def __init__(self, path: str, config: Any = None):
        self.path = path
        self.config = self.Config() if config is None else config

    @classmethod
    def description(cls) -> str:
        """The class docstring's first paragraph, on one line."""
        doc = (inspect.getdoc(cls) or "").strip()
        return " ".join(doc.split("\n\n")[0].split())

    @property
    def label(self) -> str:
        """``folder:PATH``: the source as it is named on the command line."""
        return f"{self.name}:{self.path}"

    @abc.abstractmethod
    def load(self, seed: int, batch_size: int) -> DataSplit:
        """The data as batched dict pipelines: training, and validation (or ``None``).
        ``seed`` is the run's: splits and shuffles drawn from it are reproducible."""

    def hint(self, missing: Sequence[str]) -> str:
        """What to do when the recipe needs the batch keys ``missing``; '' if nothing."""
        return ""


# --- the built-in sources -----------------------------------------------------------------


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
INTERPOLATIONS = ("bilinear", "nearest", "area", "bicubic")
SCALES = {"unit": (1 / 255.0, 0.0), "signed": (1 / 127.5, -1.0), "raw": (1.0, 0.0)}


def _image_size(instance, attribute, value) -> None:
    if len(value) != 2 or min(value) < 1:
        raise ValueError(f"image_size must be two positive numbers (height,width), got {value}")


@attrs.frozen
class FolderConfig(SourceConfig):
    """``image_size``: (height, width) every image is resized to; ``color_mode``: the
    channels (1, 3 or 4); ``value_range``: pixels in [0, 1] (``unit``), [-1, 1]
    (``signed``, what a tanh generator makes) or [0, 255] (``raw``); ``interpolation``:
    the resizing method."""

    image_size: tuple[int, ...] = attrs.field(default=(64, 64), validator=_image_size)
    color_mode: Literal["grayscale", "rgb", "rgba"] = attrs.field(
        default="rgb", validator=attrs.validators.in_(("grayscale", "rgb", "rgba"))
    )
    value_range: Literal["unit", "signed", "raw"] = attrs.field(
        default="unit", validator=attrs.validators.in_(tuple(SCALES))
    )
    interpolation: Literal["bilinear", "nearest", "area", "bicubic"] = attrs.field(
        default="bilinear", validator=attrs.validators.in_(INTERPOLATIONS)
    )


class FolderSource(DataSource):
    """A folder of images: batches {x} (float32, (n, height, width, channels)), plus y
    (int32: the class subfolder's index, in alphabetical order) when the images are in
    one subfolder per class."""

    name = "folder"
    Config = FolderConfig

    def load(self, seed: int, batch_size: int) -> DataSplit:
        import keras

        folder = Path(self.path)
        if not folder.exists():
            raise DataError(f"data source {self.label!r}: there is no folder {self.path!r}")
        if not folder.is_dir():
            raise DataError(f"data source {self.label!r}: {self.path!r} is a file, not a folder")
        classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and _images_in(p))
        if not classes and not _images_in(folder):
            raise DataError(
                f"data source {self.label!r}: the folder {self.path!r} holds no images "
                f"({' '.join(IMAGE_SUFFIXES)}), neither in itself nor in class subfolders"
            )
        config = self.config
        try:
            dataset = keras.utils.image_dataset_from_directory(
                str(folder),
                labels="inferred" if classes else None,
                label_mode="int",
                class_names=classes or None,
                color_mode=config.color_mode,
                batch_size=256,
                image_size=tuple(config.image_size),
                shuffle=False,
                interpolation=config.interpolation,
                verbose=False,
            )
        except ValueError as error:
            raise DataError(f"data source {self.label!r}: {error}") from None
        scale, shift = SCALES[config.value_range]
        parts: dict[str, list[np.ndarray]] = {"x": [], "y": []}
        for batch in dataset.as_numpy_iterator():
            pixels, labels = batch if classes else (batch, None)
            parts["x"].append(pixels.astype(np.float32) * np.float32(scale) + np.float32(shift))
            if labels is not None:
                parts["y"].append(labels.astype(np.int32))
        arrays = {key: np.concatenate(value) for key, value in parts.items() if value}
        return split_arrays(arrays, self.config, seed, batch_size, self.label)

    def hint(self, missing: Sequence[str]) -> str:
        if "y" in missing:
            return "; a folder gives 'y' when its images are in one subfolder per class"
        return ""


def _images_in(folder: Path) -> bool:
    return any(p.suffix.lower() in IMAGE_SUFFIXES for p in folder.rglob("*") if p.is_file())


@attrs.frozen
class CsvConfig(SourceConfig):
    """``label``: the column that becomes ``y`` (none by default); ``keys``: columns that
    become batch keys of their own name (e.g. ``risk``); ``features``: the columns
    gathered into ``x`` (by default every other column); ``delimiter``: the separator."""

    label: str | None = None
    keys: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    delimiter: str = ","


class CsvSource(DataSource):
    """A CSV file with a header row of column names: batches {x} (float32, (n, features)),
    plus y (the label column) and any columns named in keys."""

    name = "csv"
    Config = CsvConfig

    def load(self, seed: int, batch_size: int) -> DataSplit:
        columns = self._columns()
        config = self.config
        named = ([config.label] if config.label is not None else []) + list(config.keys)
        absent = [name for name in [*named, *config.features] if name not in columns]
        if absent:
            raise DataError(
                f"data source {self.label!r}: the CSV has no column(s) {absent}; its columns: "
                f"{list(columns)}"
            )
        features = list(config.features) or [name for name in columns if name not in named]
        if not features:
            raise DataError(
                f"data source {self.label!r}: no columns are left for 'x' (every column is "
                "the label or a key)"
            )
        arrays = {"x": np.stack([columns[name] for name in features], axis=1)}
        arrays["x"] = arrays["x"].astype(np.float32)
        if config.label is not None:
            arrays["y"] = _narrowest(columns[config.label])
        for name in config.keys:
            arrays[name] = _narrowest(columns[name])
        return split_arrays(arrays, config, seed, batch_size, self.label)

    def _columns(self) -> dict[str, np.ndarray]:
        path = Path(self.path)
        if not path.is_file():
            what = "a folder, not a file" if path.is_dir() else "not there"
            raise DataError(f"data source {self.label!r}: {self.path!r} is {what}")
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle, delimiter=self.config.delimiter))
        rows = [row for row in rows if row]
        if len(rows) < 2:
            raise DataError(
                f"data source {self.label!r}: the CSV needs a header row and at least one row "
                f"of values; it has {len(rows)} row(s)"
            )
        header = [name.strip() for name in rows[0]]
        values = np.empty((len(rows) - 1, len(header)), dtype=np.float64)
        for number, row in enumerate(rows[1:], start=2):
            if len(row) != len(header):
                raise DataError(
                    f"data source {self.label!r}: line {number} has {len(row)} values, the "
                    f"header {len(header)} columns"
                )
            for index, text in enumerate(row):
                try:
                    values[number - 2, index] = float(text)
                except ValueError:
                    raise DataError(
                        f"data source {self.label!r}: line {number}, column "
                        f"{header[index]!r} holds {text!r}, not a number"
                    ) from None
        return {name: values[:, index] for index, name in enumerate(header)}

    def hint(self, missing: Sequence[str]) -> str:
        if "y" in missing:
            return "; name the label column: --data-set label=COLUMN"
        return f"; name the columns: --data-set keys={','.join(missing)}"


def _narrowest(column: np.ndarray) -> np.ndarray:
    """A column as int32 when every value is a whole number, else float32."""
    if np.all(np.isfinite(column)) and np.all(column == np.round(column)):
        return column.astype(np.int32)
    return column.astype(np.float32)


@attrs.frozen
class NpzConfig(SourceConfig):
    """``keys``: the arrays to use (by default every array in the file)."""

    keys: tuple[str, ...] = ()


class NpzSource(DataSource):
    """A NumPy .npz file: every array (or those in keys) becomes the batch key of its
    name; float64 arrays become float32. All arrays have one example per row."""

    name = "npz"
    Config = NpzConfig

    def load(self, seed: int, batch_size: int) -> DataSplit:
        path = Path(self.path)
        if not path.is_file():
            what = "a folder, not a file" if path.is_dir() else "not there"
            raise DataError(f"data source {self.label!r}: {self.path!r} is {what}")
        try:
            with np.load(path, allow_pickle=False) as archive:
                names = list(self.config.keys) or list(archive.files)
                absent = [name for name in names if name not in archive.files]
                if absent:
                    raise DataError(
                        f"data source {self.label!r}: the file has no array(s) {absent}; it "
                        f"holds {archive.files}"
                    )
                arrays = {name: archive[name] for name in names}
        except DataError:
            raise
        except (OSError, ValueError) as error:
            raise DataError(
                f"data source {self.label!r}: not a readable .npz file: {error}"
            ) from None
        if not arrays:
            raise DataError(f"data source {self.label!r}: the file holds no arrays")
        arrays = {
            name: value.astype(np.float32) if value.dtype == np.float64 else value
            for name, value in arrays.items()
        }
        return split_arrays(arrays, self.config, seed, batch_size, self.label)


# --- shared: arrays into a split --------------------------------------------------------


def split_arrays(
    arrays: Mapping[str, np.ndarray], config: Any, seed: int, batch_size: int, label: str
) -> DataSplit:
    """Arrays (one example per row) as a DataSplit: ``config.validation_fraction`` of the
    examples, drawn by ``seed``, held out for validation; training batches reshuffled
    every epoch by ``seed`` when ``config.shuffle`` (the built-in pipeline,
    ``beatloop.data.batches``)."""
    from beatloop import data

    counts = {name: len(value) for name, value in arrays.items() if np.ndim(value) > 0}
    if len(counts) != len(arrays) or len(set(counts.values())) != 1:
        shapes = {name: np.shape(value) for name, value in arrays.items()}
        raise DataError(
            f"data source {label!r}: every array needs one example per row, the same number "
            f"of rows; found shapes {shapes}"
        )
    count = next(iter(counts.values()))
    if count == 0:
        raise DataError(f"data source {label!r}: it holds no examples")
    fraction = getattr(config, "validation_fraction", 0.0)
    held = round(count * fraction)
    if fraction and not 0 < held < count:
        raise DataError(
            f"data source {label!r}: validation_fraction={fraction} of {count} example(s) "
            f"leaves {count - held} for training and {held} for validation; both need some"
        )
    shuffle_seed = seed if getattr(config, "shuffle", True) else None
    if not held:
        return DataSplit(data.batches(arrays, batch_size, shuffle_seed=shuffle_seed))
    order = np.random.default_rng(seed).permutation(count)
    train = {name: value[order[held:]] for name, value in arrays.items()}
    validation = {name: value[order[:held]] for name, value in arrays.items()}
    return DataSplit(
        data.batches(train, batch_size, shuffle_seed=shuffle_seed),
        data.batches(validation, batch_size),
    )


# --- naming a source on the command line ------------------------------------------------


def parse_source(text: str) -> tuple[str, str]:
    """``"folder:images/"`` -> ``("folder", "images/")``."""
    from beatloop.plugins.registry import registry

    kind, sep, path = text.partition(":")
    if not sep or not kind.strip() or not path.strip():
        known = ", ".join(registry().source_names())
        raise ConfigError(
            f"--data expects KIND:PATH (e.g. folder:images/ or csv:table.csv), got {text!r}; "
            f"kinds: {known}"
        )
    return kind.strip(), path.strip()


def make_source(
    text: str, settings: Sequence[str] | Mapping[str, Any] = (), recipe: Any = None
) -> DataSource:
    """The source ``text`` names (``KIND:PATH``), its parameters from ``settings``
    (``["image_size=28,28"]`` or ``{"image_size": (28, 28)}``) over the ``recipe``'s
    ``source_defaults`` over the source's own defaults."""
    from beatloop.plugins.registry import registry

    kind, path = parse_source(text)
    cls = registry().source(kind).cls
    owner = f"data source {kind!r}"
    for setting in () if isinstance(settings, Mapping) else settings:
        if not setting.partition("=")[0].strip() or "=" not in setting:
            raise ConfigError(f"--data-set expects NAME=VALUE, got {setting!r}")
    given = (
        dict(settings)
        if isinstance(settings, Mapping)
        else parse_settings(settings, cls.Config, owner)
    )
    fields = {field.name for field in attrs.fields(cls.Config)}
    defaults = dict(getattr(recipe, "source_defaults", {}) or {})
    values = {k: v for k, v in defaults.items() if k in fields and k not in given}
    return cls(path, make_config(cls.Config, {**values, **given}, owner))


def batch_size_for(source: DataSource, recipe: Any) -> int:
    """The source's ``batch_size``, else the recipe config's, else 32."""
    size = getattr(source.config, "batch_size", None)
    if size is None:
        size = getattr(getattr(recipe, "config", None), "batch_size", None)
    return DEFAULT_BATCH_SIZE if size is None else size


def load_data(
    source: str,
    settings: Sequence[str] | Mapping[str, Any] = (),
    *,
    recipe: Any,
    seed: int,
    validation: str | None = None,
) -> DataSplit:
    """The data ``--data SOURCE --data-set ...`` names, for ``recipe`` (a configured
    ``Recipe``), split and shuffled by ``seed``.

    ``validation`` (``--validation-data``) names a second source, read with the same
    settings, used whole and unshuffled as the validation data (the first source's
    ``validation_fraction`` must then be 0). Batches lacking keys the recipe's
    ``batch_keys`` needs are refused with a ``DataError`` naming both."""
    train_source = make_source(source, settings, recipe)
    size = batch_size_for(train_source, recipe)
    split = train_source.load(seed, size)
    _check_keys(split, train_source, recipe, "training")
    if validation is None:
        return split
    if split.validation is not None:
        raise ConfigError(
            f"--validation-data {validation} is given and data source {source!r} also holds "
            f"out validation_fraction={train_source.config.validation_fraction}; use one"
        )
    return DataSplit(split.train, load_whole(validation, settings, recipe=recipe, seed=seed))


def load_whole(
    source: str,
    settings: Sequence[str] | Mapping[str, Any] = (),
    *,
    recipe: Any,
    seed: int,
    role: str = "validation",
) -> tf.data.Dataset:
    """Every example ``source`` holds, unshuffled and none held out, in batches the size
    ``recipe`` trains with: validation data (``--validation-data``), or the data
    ``beatloop evaluate --data`` evaluates on (``role`` names it in errors)."""
    held = make_source(source, settings, recipe)
    fields = {field.name for field in attrs.fields(type(held.config))}
    whole = {k: v for k, v in (("validation_fraction", 0.0), ("shuffle", False)) if k in fields}
    held = type(held)(held.path, attrs.evolve(held.config, **whole))
    split = held.load(seed, batch_size_for(held, recipe))
    _check_keys(split, held, recipe, role)
    return split.train


def _check_keys(split: DataSplit, source: DataSource, recipe: Any, role: str) -> None:
    required = dict(getattr(recipe, "batch_keys", {}) or {})
    spec = split.train.element_spec
    missing = [key for key in required if key not in spec]
    if missing:
        raise DataError(
            f"recipe {recipe.name!r} expects batches with keys {sorted(required)}; the "
            f"{role} data source {source.label!r} gives {sorted(spec)} (missing {missing})"
            f"{source.hint(missing)}"
        )


def describe_source(cls: type[DataSource]) -> list[str]:
    """``beatloop data``'s lines for one source kind: its description, then each
    parameter with its type and default."""
    from beatloop.core.config import config_fields, type_name

    lines = [f"{cls.name}: {cls.description()}", f"  --data {cls.name}:PATH"]
    docs = [inspect.getdoc(c) for c in (SourceConfig, cls.Config) if issubclass(cls.Config, c)]
    for doc in dict.fromkeys(d for d in docs if d):
        paragraph = " ".join(doc.replace("``", "").split())
        lines += textwrap.wrap(paragraph, 88, initial_indent="  ", subsequent_indent="  ")
    for field in config_fields(cls.Config):
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        lines.append(f"  {field.name}: {type_name(field.type)} = {default!r}")
    return lines


@attrs.frozen
class NamedData:
    """The data ``--data SOURCE --data-set ... --validation-data ...`` names, as ``fit``'s
    ``data=``: called with the recipe and the seed once both are known, and recorded in
    ``run.json`` (``data_source``) so ``run --config RUN_DIR/run.json`` reads it again."""

    source: str
    settings: tuple[str, ...] = ()
    validation: str | None = None

    def __call__(self, recipe: Any, seed: int) -> DataSplit:
        return load_data(
            self.source, self.settings, recipe=recipe, seed=seed, validation=self.validation
        )

    def to_json(self) -> dict[str, Any]:
        """The ``run`` command's options that name this data, as ``run.json`` keeps them."""
        return {
            "data": self.source,
            "data_set": list(self.settings),
            "validation_data": self.validation,
        }
