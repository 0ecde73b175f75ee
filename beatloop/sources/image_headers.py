"""What a folder's image files say of themselves: each one's height, width and colour
mode, read from its header without decoding the pixels (a file whose header Pillow cannot
read is decoded by TensorFlow instead), so the ``folder`` source can take the size and
colour mode its images agree on.

The colour mode is the one TensorFlow's decoder gives the file (``tf.io.decode_image``
with ``channels=0``, what Keras's loader reads): 1 channel is ``grayscale``, 3 ``rgb``, 4
``rgba``; a GIF is always ``rgb``, a palette PNG ``rgb`` (``rgba`` with a transparent
colour), an 8-bit BMP ``grayscale``, a 32-bit BMP ``rgba``, and grayscale with alpha (2
channels, which Keras does not read as such) ``rgba``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import attrs

from beatloop import DataError

COLOR_MODES = {1: "grayscale", 2: "rgba", 3: "rgb", 4: "rgba"}
_ONE_CHANNEL = ("1", "L", "F", "I")  # Pillow modes of one channel ("I;16" and kin included)


@attrs.frozen
class ImageShape:
    """One image's height, width and colour mode (``grayscale``, ``rgb`` or ``rgba``)."""

    height: int
    width: int
    color_mode: str

    def describe(self, size: bool = True, mode: bool = True) -> str:
        """``16x16 grayscale`` (height x width), or the part asked for."""
        parts = [f"{self.height}x{self.width}"] if size else []
        return " ".join(parts + ([self.color_mode] if mode else []))


class UnreadableImage(Exception):
    """A file neither Pillow's header reader nor TensorFlow's decoder can read."""


def image_shape(path: Path) -> ImageShape:
    """The shape ``path`` decodes to, from its header (or, failing that, decoded);
    ``UnreadableImage`` when it is no image either can read."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            width, height = image.size
            channels = _channels(image, path)
    except Exception:  # Pillow's many ways to refuse a file: let TensorFlow try
        return _decoded_shape(path)
    return ImageShape(height, width, COLOR_MODES[channels])


def _channels(image, path: Path) -> int:
    """The channels TensorFlow's decoder gives an image Pillow has opened."""
    if image.format == "GIF":
        return 3
    if image.format == "BMP":
        return {8: 1, 32: 4}.get(_bmp_bits(path), 3)
    if image.format == "JPEG":
        return 1 if image.mode == "L" else 3
    mode = image.mode
    if mode in ("LA", "La"):
        return 2
    if mode.startswith(_ONE_CHANNEL):
        return 1
    if mode == "P":
        return 4 if "transparency" in image.info else 3
    return 4 if mode in ("RGBA", "RGBa", "PA") else 3


def _bmp_bits(path: Path) -> int:
    """A BMP's bits per pixel, from its header (Pillow reads a 32-bit BMP as RGB; TensorFlow
    keeps its fourth channel)."""
    with path.open("rb") as handle:
        header = handle.read(30)
    at = 24 if int.from_bytes(header[14:18], "little") == 12 else 28  # OS/2 header: 12 bytes
    return int.from_bytes(header[at : at + 2], "little")


def _decoded_shape(path: Path) -> ImageShape:
    import tensorflow as tf

    try:
        shape = tf.io.decode_image(tf.io.read_file(str(path)), expand_animations=False).shape
    except (tf.errors.OpError, ValueError) as error:
        raise UnreadableImage(str(path)) from error
    return ImageShape(int(shape[0]), int(shape[1]), COLOR_MODES.get(int(shape[2]), "rgb"))


def agreed_shape(paths: Sequence[Path], label: str, *, size: bool, mode: bool) -> ImageShape:
    """The shape every image in ``paths`` has, judged on its size and/or its colour mode
    (those to be inferred); a ``DataError`` naming two files that differ and what to set
    instead."""
    shapes = {path: image_shape(path) for path in sorted(paths)}
    seen = {path: shape.describe(size, mode) for path, shape in shapes.items()}
    first = next(iter(seen))
    other = next((path for path, text in seen.items() if text != seen[first]), None)
    if other is None:
        return shapes[first]
    counts = Counter(seen.values()).most_common()
    tally = ", ".join(f"{text}: {n}" for text, n in counts[:3])
    more = f", {len(counts) - 3} more kinds" if len(counts) > 3 else ""
    a, b = shapes[first], shapes[other]
    settings = []
    if size and (a.height, a.width) != (b.height, b.width):
        settings.append(" --data-set image_size=H,W")
    if mode and a.color_mode != b.color_mode:
        settings.append(" --data-set color_mode=grayscale|rgb|rgba")
    raise DataError(
        f"data source {label!r}: its images are not all alike ({tally}{more}): "
        f"{str(first)!r} is {seen[first]}, {str(other)!r} is {seen[other]}; pass"
        f"{' and'.join(settings)} to read every image alike"
    )


def inferred_notice(shape: ImageShape, label: str, *, size: bool, mode: bool) -> str:
    """The line saying which image size and/or colour mode was inferred, as settings."""
    chosen = [f"image_size={shape.height},{shape.width}"] if size else []
    chosen += [f"color_mode={shape.color_mode}"] if mode else []
    return (
        f"data source {label!r}: images are {shape.describe(size, mode)} (inferred: "
        f"{', '.join(chosen)}; set {'them' if size and mode else 'it'} with --data-set to "
        "change)"
    )
