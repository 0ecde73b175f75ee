"""The ``folder`` data source kind: a folder of images (in one subfolder per class, or
not) decoded in memory, then split by ``split_arrays``; and the ``value_range`` scales
the ``tfrecord`` kind's images share.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import attrs
import numpy as np

from beatloop import DataError, DataSource, DataSplit, InferredSettingWarning, SourceConfig
from beatloop.datasets import split_arrays
from beatloop.sources.image_headers import UnreadableImage, agreed_shape, inferred_notice

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
INTERPOLATIONS = ("bilinear", "nearest", "area", "bicubic")
SCALES = {"unit": (1 / 255.0, 0.0), "signed": (1 / 127.5, -1.0), "raw": (1.0, 0.0)}


def _image_size(instance, attribute, value) -> None:
    if value is not None and (len(value) != 2 or min(value) < 1):
        raise ValueError(f"image_size must be two positive numbers (height,width), got {value}")


@attrs.frozen
class FolderConfig(SourceConfig):
    """``image_size``: (height, width) every image is resized to (``None``: the size the
    images share, inferred from their files); ``color_mode``: the channels (grayscale,
    rgb or rgba; ``None``: those the images share); ``value_range``: pixels in [0, 1]
    (``unit``), [-1, 1] (``signed``, what a tanh generator makes) or [0, 255] (``raw``);
    ``interpolation``: the resizing method."""

    image_size: tuple[int, ...] | None = attrs.field(default=None, validator=_image_size)
    color_mode: Literal["grayscale", "rgb", "rgba"] | None = attrs.field(
        default=None, validator=attrs.validators.in_(("grayscale", "rgb", "rgba", None))
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
        import tensorflow as tf

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
        config, inferred = self._inferred(folder, classes)
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
        try:
            arrays = self._arrays(dataset, bool(classes))
        except tf.errors.OpError:  # a file that is not an image: find which
            raise self._unreadable(folder) from None
        if inferred:
            warnings.warn(inferred, InferredSettingWarning, stacklevel=3)
        return split_arrays(arrays, self.config, seed, batch_size, self.label)

    def _inferred(self, folder: Path, classes: list[str]) -> tuple[FolderConfig, str]:
        """The config with the ``image_size`` and ``color_mode`` it leaves to the images
        filled in from their headers, and the notice saying what was chosen ('' when both
        were given); a ``DataError`` when the images disagree."""
        config = self.config
        size, mode = config.image_size is None, config.color_mode is None
        if not (size or mode):
            return config, ""
        roots = [folder / name for name in classes] or [folder]
        files = [path for root in roots for path in root.rglob("*") if _is_image_file(path)]
        try:
            shape = agreed_shape(files, self.label, size=size, mode=mode)
        except UnreadableImage:
            raise self._unreadable(folder) from None
        notice = inferred_notice(shape, self.label, size=size, mode=mode)
        filled = attrs.evolve(
            config,
            image_size=(shape.height, shape.width) if size else config.image_size,
            color_mode=shape.color_mode if mode else config.color_mode,
        )
        return filled, notice

    def _arrays(self, dataset, labelled: bool) -> dict[str, np.ndarray]:
        """The decoded images (scaled to the ``value_range``) and their labels."""
        scale, shift = SCALES[self.config.value_range]
        parts: dict[str, list[np.ndarray]] = {"x": [], "y": []}
        for batch in dataset.as_numpy_iterator():
            pixels, labels = batch if labelled else (batch, None)
            parts["x"].append(pixels.astype(np.float32) * np.float32(scale) + np.float32(shift))
            if labels is not None:
                parts["y"].append(labels.astype(np.int32))
        return {key: np.concatenate(value) for key, value in parts.items() if value}

    def _unreadable(self, folder: Path) -> DataError:
        """The DataError naming the first file in ``folder`` that does not decode as an
        image (each file read again, as Keras decodes it: only on this error path)."""
        import tensorflow as tf

        bad = []
        for path in sorted(p for p in folder.rglob("*") if _is_image_file(p)):
            try:
                tf.io.decode_image(tf.io.read_file(str(path)), expand_animations=False)
            except (tf.errors.OpError, ValueError) as error:
                bad.append((path, op_reason(error)))
        if not bad:
            return DataError(f"data source {self.label!r}: its images could not be read")
        (path, reason), others = bad[0], len(bad) - 1
        more = f" (and {others} more unreadable file(s))" if others else ""
        return DataError(
            f"data source {self.label!r}: the file {str(path)!r} is not a readable image "
            f"({reason}){more}; every {' '.join(IMAGE_SUFFIXES)} file under the folder must "
            "be a PNG, JPEG, BMP or GIF image: replace or remove it"
        )

    def files(self) -> list[Path]:
        """Every file in the folder, in its subfolders too."""
        folder = Path(self.path)
        return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []

    def hint(self, missing: Sequence[str]) -> str:
        if "y" in missing:
            return "; a folder gives 'y' when its images are in one subfolder per class"
        return ""


def op_reason(error: Exception) -> str:
    """TensorFlow's words for a failed op, without the function and op names around them:
    ``Invalid PNG data, size 70``."""
    text = " ".join((getattr(error, "message", None) or str(error)).split())
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text)


def _images_in(folder: Path) -> bool:
    return any(_is_image_file(p) for p in folder.rglob("*"))


def _is_image_file(path: Path) -> bool:
    """A file the folder source reads: one with an image suffix."""
    return path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()
