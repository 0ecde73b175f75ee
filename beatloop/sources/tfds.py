"""The ``tfds`` source kind: a TensorFlow Datasets data set already prepared in a
``data_dir`` (``--data tfds:mnist``, ``tfds:NAME/CONFIG:VERSION``), streamed through the
shared pipeline (``beatloop.sources.stream``) as ``csv`` and ``parquet`` are.

It is read with ``tfds.builder_from_directory`` from the prepared version's folder: no
builder code is needed and nothing is ever downloaded (a data set not prepared is a
``DataError`` naming ``tfds build`` to run first). Features become batch keys as table
columns do (``label``, ``keys``, ``features``: ``beatloop.sources.columns``), or as
TFDS's ``as_supervised`` pairs them (``x``, ``y``); an image feature becomes float32 in
``value_range``, as ``folder``'s images. ``facts()`` names the data set (name, config,
version, split, data_dir) for ``run.json``, so a resume on another version is refused.
``tensorflow_datasets`` is imported only here, on load: the ``tfds`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from beatloop import ConfigError, DataError, DataSource, DataSplit
from beatloop.sources.columns import batch_columns, feature_columns
from beatloop.sources.stream import StreamConfig, sharded_by_data, stream_batches, stream_split

_RANGES = ("unit", "signed", "raw")


def _value_range(instance, attribute, value) -> None:
    if value not in _RANGES:
        raise ValueError(f"value_range must be one of {', '.join(_RANGES)}, got {value!r}")


@attrs.frozen
class TfdsConfig(StreamConfig):
    """``data_dir``: the folder the data set was prepared in (TFDS's default,
    ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``, when empty); ``split``: the TFDS split
    trained on (``train``, ``train[:80%]``); ``validation_split``: a split used whole as the
    validation data (``test``); ``as_supervised``: batches of the data set's supervised
    pair as ``x`` and ``y``; ``label``, ``keys``, ``features``: the features that become
    ``y``, keys of their own, and ``x``, as csv's columns do (by default every feature a
    key of its name); ``value_range``: an image feature's pixels (``unit``: [0, 1])."""

    data_dir: str = ""
    split: str = "train"
    validation_split: str = ""
    as_supervised: bool = False
    label: str | None = None
    keys: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    value_range: str = attrs.field(default="unit", validator=_value_range)


@attrs.frozen
class Feature:
    """A top-level feature: its name, dtype and shape per example, and whether it is an
    image (``tfds.features.Image``: float32 in the value range)."""

    name: str
    dtype: object
    shape: tuple
    image: bool

    def batchable(self) -> bool:
        """Whether every example's value has one known shape (a batch can stack them)."""
        return None not in self.shape

    def number(self) -> bool:
        return self.dtype.is_integer or self.dtype.is_floating or self.dtype.is_bool


def _tfds(label: str):
    """``tensorflow_datasets``, or a ``ConfigError`` naming the extra that brings it."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ConfigError(
            f"data source {label!r}: reading TensorFlow Datasets needs tensorflow-datasets, "
            'which comes with the tfds extra: pip install "beatloop[tfds]"'
        ) from None
    return tfds


class TfdsSource(DataSource):
    """A TensorFlow Datasets data set prepared in a data_dir (tfds:NAME[/CONFIG][:VERSION]),
    streamed, never downloaded: batches of its features by name, or x and y
    (as_supervised, or label and features as csv's columns)."""

    name = "tfds"
    Config = TfdsConfig

    def load(self, seed: int, batch_size: int) -> DataSplit:
        builder = self._builder()
        splits = [self.config.split] + [self.config.validation_split] * bool(
            self.config.validation_split
        )
        counts = [self._count(builder, split) for split in splits]
        if self.config.validation_split and self.config.validation_fraction:
            raise DataError(
                f"data source {self.label!r}: validation_split={self.config.validation_split} "
                f"and validation_fraction={self.config.validation_fraction} both give "
                "validation data; use one"
            )
        chosen = self._chosen(builder)
        parse = _parser(chosen, self.config.value_range)
        names = sorted({feature.name for _, features in chosen for feature in features})

        def records(split: str):
            dataset = builder.as_dataset(split=split, shuffle_files=False)
            return dataset.map(lambda example: {name: example[name] for name in names})

        train = records(splits[0]).enumerate()
        split = stream_split(train, counts[0], parse, self.config, seed, batch_size, self.label)
        if self.config.validation_split:
            whole = stream_batches(records(splits[1]), counts[1], parse, batch_size)
            split = DataSplit(split.train, whole)
        return DataSplit(sharded_by_data(split.train), sharded_by_data(split.validation))

    def files(self) -> list[Path]:
        """The prepared files the splits read, with the data set's info and features."""
        builder = self._builder()
        found = {Path(builder.data_dir) / name for name in ("dataset_info.json", "features.json")}
        for split in filter(None, (self.config.split, self.config.validation_split)):
            self._count(builder, split)
            found |= {Path(str(path)) for path in _split_files(builder, split)}
        return sorted(path for path in found if path.is_file())

    def facts(self) -> dict[str, str]:
        """The data set's name, config, version, splits and data_dir, as run.json records
        them: a resume on another version or split is refused."""
        info = self._builder().info
        facts = {
            "name": info.name,
            "config": info.config_name or "",
            "version": str(info.version),
            "split": self.config.split,
            "data_dir": self._data_dir(),
        }
        if self.config.validation_split:
            facts["validation_split"] = self.config.validation_split
        return facts

    def hint(self, missing: Sequence[str]) -> str:
        if {"x", "y"} & set(missing):
            return (
                "; pass --data-set as_supervised=true (the data set's supervised pair), or "
                "name the features: --data-set label=FEATURE (and features=...)"
            )
        return f"; name the features: --data-set keys={','.join(missing)}"

    # --- the prepared data set --------------------------------------------------------

    def _data_dir(self) -> str:
        if self.config.data_dir:
            return os.path.abspath(os.path.expanduser(self.config.data_dir))
        return os.path.abspath(_tfds(self.label).core.constants.DATA_DIR)

    def _names(self) -> tuple[str, str, str]:
        """``(name, config, version)`` of ``NAME[/CONFIG][:VERSION]``, as TFDS spells them."""
        named, _, version = self.path.partition(":")
        name, _, config = named.partition("/")
        if not name or "/" in config or ":" in version:
            raise ConfigError(
                f"data source {self.label!r}: expects tfds:NAME, tfds:NAME:VERSION or "
                f"tfds:NAME/CONFIG:VERSION (e.g. tfds:mnist:3.0.1), got {self.path!r}"
            )
        return name, config, version

    def _builder(self):
        """The read-only builder of the prepared version (the newest prepared one matching
        the version named, ``*`` parts as wildcards); a ``DataError`` when none is."""
        tfds = _tfds(self.label)
        name, config, version = self._names()
        data_dir = self._data_dir()
        folder = Path(data_dir, name, config) if config else Path(data_dir, name)
        prepared = []
        for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
            try:
                found = tfds.core.Version(entry.name)
            except ValueError:
                continue  # an incomplete.* folder, or not a version
            if (entry / "dataset_info.json").is_file():
                prepared.append(found)
        matching = [found for found in prepared if not version or found.match(version)]
        if not matching:
            spelled = f"{name}/{config}" if config else name
            which = f"version {version} of {spelled!r}" if version else repr(spelled)
            there = f" (prepared: {', '.join(map(str, sorted(prepared)))})" if prepared else ""
            raise DataError(
                f"data source {self.label!r}: {which} is not prepared in {data_dir!r}{there}; "
                "beatloop never downloads: prepare it first with `tfds build "
                f"{self.path} --data_dir {data_dir}` or tfds.load({self.path!r}, "
                f"data_dir={data_dir!r}, download=True)"
            )
        directory = folder / str(max(matching))
        try:
            return tfds.builder_from_directory(str(directory))
        except Exception as error:  # TFDS raises many kinds on a folder it cannot read
            raise DataError(
                f"data source {self.label!r}: the prepared data set in {str(directory)!r} does "
                f"not read ({' '.join(str(error).split())}); prepare it again"
            ) from None

    def _count(self, builder, split: str) -> int:
        """The examples ``split`` holds; a ``DataError`` for a split the data set lacks,
        or one whose files are missing."""
        try:
            count = int(builder.info.splits[split].num_examples)
        except (KeyError, ValueError) as error:
            raise DataError(
                f"data source {self.label!r}: the data set {builder.info.full_name!r} cannot "
                f"read the split {split!r}: {' '.join(str(error).split())}"
            ) from None
        absent = [str(path) for path in _split_files(builder, split) if not Path(path).is_file()]
        if absent:
            raise DataError(
                f"data source {self.label!r}: split {split!r} of the data set "
                f"{builder.info.full_name!r} lacks its file(s) {absent}; prepare it again"
            )
        if count == 0:
            raise DataError(
                f"data source {self.label!r}: split {split!r} of the data set "
                f"{builder.info.full_name!r} holds no examples"
            )
        return count

    # --- features to batch keys -------------------------------------------------------

    def _chosen(self, builder) -> list[tuple[str, list[Feature]]]:
        """``(batch key, features)`` pairs: ``x`` with the features stacked into it (one
        kept in its shape), ``y`` and the keys one feature each."""
        import tensorflow_datasets as tfds

        info, config = builder.info, self.config
        known = {}
        for name, feature in info.features.items():
            spec = feature.get_tensor_spec() if hasattr(feature, "get_tensor_spec") else None
            if not hasattr(spec, "shape"):  # a nested dict or a sequence: no one tensor
                known[name] = Feature(name, None, (None,), False)
                continue
            image = isinstance(feature, tfds.features.Image)
            known[name] = Feature(name, spec.dtype, tuple(spec.shape), image)
        where = f"the data set {info.full_name!r}"
        if config.as_supervised:
            if config.label is not None or config.keys or config.features:
                raise DataError(
                    f"data source {self.label!r}: as_supervised=true gives x and y itself; "
                    "leave out label, keys and features (or as_supervised)"
                )
            pair = info.supervised_keys
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(map(_is_name, pair))):
                raise DataError(
                    f"data source {self.label!r}: {where} has no supervised pair of features "
                    f"(its supervised_keys: {pair}); name them: --data-set label=FEATURE "
                    "(and features=...)"
                )
            chosen = [("x", [pair[0]]), ("y", [pair[1]])]
        elif config.label is not None or config.keys or config.features:
            named = [column for _, column in batch_columns(config, self.label)]
            self._present(known, [*named, *config.features], where)
            usable = [n for n, f in known.items() if f.batchable() and f.number()]
            header = list(dict.fromkeys([*usable, *named, *config.features]))
            stacked = feature_columns(config, self.label, header, where)
            chosen = [("x", stacked)] if stacked else []
            chosen += [(key, [column]) for key, column in batch_columns(config, self.label)]
        else:
            chosen = [(n, [n]) for n, f in known.items() if f.batchable() and f.number()]
        result = []
        for key, names in chosen:
            for name in names:
                self._usable(known, name, where, stacked=key == "x" and len(names) > 1)
            result.append((key, [known[name] for name in names]))
        return result

    def _present(self, known, names: Sequence[str], where: str) -> None:
        absent = [name for name in names if name not in known]
        if absent:
            raise DataError(
                f"data source {self.label!r}: {where} has no feature(s) {absent}; its "
                f"features: {sorted(known)}"
            )

    def _usable(self, known, name: str, where: str, stacked: bool) -> None:
        """A ``DataError`` naming a feature a batch cannot hold (no one shape, or strings
        stacked into x)."""
        self._present(known, [name], where)
        feature = known[name]
        start = f"data source {self.label!r}: {where}, feature {name!r}"
        if not feature.batchable():
            shape = "nested features" if feature.dtype is None else f"shape {feature.shape}"
            raise DataError(
                f"{start} has {shape}, not one shape per example: a batch cannot stack it; "
                "leave it out (--data-set features=... or keys=...)"
            )
        if stacked and not feature.number():
            raise DataError(
                f"{start} holds {feature.dtype.name}, not numbers: it cannot be stacked into x; "
                "leave it out with --data-set features=..., or make it a key of its own"
            )


def _is_name(value) -> bool:
    return isinstance(value, str)


def _width(feature: Feature) -> int:
    """Values per example of a feature of known shape."""
    width = 1
    for size in feature.shape:
        width *= size
    return width


def _split_files(builder, split: str) -> list[str]:
    """The files a split (or a slice of one) reads."""
    instructions = builder.info.splits[split].file_instructions
    return [str(instruction.filename) for instruction in instructions]


def _parser(chosen, value_range: str):
    """``parse(examples) -> batch``: one feature per key kept in its shape, several
    flattened and stacked as float32 (``x``); integers and booleans int32, floats float32,
    images float32 in ``value_range``, strings kept."""
    import tensorflow as tf

    def value(feature: Feature, tensor):
        if feature.image:
            pixels = tf.cast(tensor, tf.float32)
            return {"unit": pixels / 255.0, "signed": pixels / 127.5 - 1.0}.get(value_range, pixels)
        if feature.dtype.is_integer or feature.dtype.is_bool:
            return tf.cast(tensor, tf.int32)
        if feature.dtype.is_floating:
            return tf.cast(tensor, tf.float32)
        return tensor

    def parse(examples):
        batch = {}
        for key, features in chosen:
            if len(features) == 1:
                batch[key] = value(features[0], examples[features[0].name])
                continue
            flat = [
                tf.reshape(tf.cast(value(f, examples[f.name]), tf.float32), [-1, _width(f)])
                for f in features
            ]
            batch[key] = tf.concat(flat, axis=1)
        return batch

    return parse
