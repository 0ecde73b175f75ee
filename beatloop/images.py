"""Pictures a recipe or a callback writes (public: ``docs/api.md``): a grid of samples as
one PNG, written atomically."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from beatloop.core.saving.run_dir import writing

__all__ = ["grid", "save_png", "to_uint8"]


def to_uint8(images: np.ndarray, value_range: tuple[float, float] = (-1.0, 1.0)) -> np.ndarray:
    """Map pixel values from ``value_range`` to 0..255, clipping what lies outside."""
    low, high = value_range
    scaled = (np.asarray(images, dtype=np.float32) - low) / (high - low)
    return np.round(np.clip(scaled, 0.0, 1.0) * 255.0).astype(np.uint8)


def grid(images: np.ndarray, columns: int | None = None, padding: int = 1) -> np.ndarray:
    """Tile ``(n, height, width[, channels])`` uint8 images into one image, row by row."""
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    count, height, width, channels = images.shape
    columns = columns or math.ceil(math.sqrt(count))
    rows = math.ceil(count / columns)
    canvas = np.full(
        (rows * (height + padding) + padding, columns * (width + padding) + padding, channels),
        255,
        dtype=np.uint8,
    )
    for index, image in enumerate(images):
        top = padding + (index // columns) * (height + padding)
        left = padding + (index % columns) * (width + padding)
        canvas[top : top + height, left : left + width] = image
    return canvas[..., 0] if channels == 1 else canvas


def save_png(image: np.ndarray, path: str | Path, scale: int = 1) -> Path:
    """Save a uint8 image as PNG, enlarged ``scale`` times without smoothing; the file
    appears complete or not at all (written beside it, then renamed)."""
    from PIL import Image

    path = Path(path)
    picture = Image.fromarray(np.asarray(image, dtype=np.uint8))
    if scale != 1:
        picture = picture.resize(
            (picture.width * scale, picture.height * scale), Image.Resampling.NEAREST
        )
    partial = path.with_name(f".{path.name}.partial")
    with writing(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            picture.save(partial, format="PNG")
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return path
