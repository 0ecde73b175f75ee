"""The built-in data sets, for recipe and data source authors (public: ``docs/api.md``):
small real data that ships inside installed packages (nothing is downloaded), as batched
``tf.data`` pipelines of dicts: scikit-learn's digits (what most recipes and the docs
train on), its breast-cancer cases and sample photos; ``batches``, the in-memory
pipeline, and ``split_arrays``, arrays made into a ``DataSplit`` as the in-memory kinds
(``folder``, ``npz``) and plugins' kinds make theirs; ``replayable``, a source's
generator-fed pipeline marked as starting again the same at every pass (``parquet``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from beatloop.core.data.batches import DataSplit
from beatloop.core.data.data_origin import replayable
from beatloop.core.failures.errors import DataError

__all__ = [
    "batches",
    "breast_cancer_arrays",
    "digits",
    "digits_arrays",
    "load_image",
    "replayable",
    "sample_photo",
    "split_arrays",
    "with_outliers",
]


def digits_arrays(
    seed: int, validation_fraction: float = 0.2, signed: bool = False
) -> tuple[dict, dict]:
    """scikit-learn's 1,797 8x8 handwritten digits as ``({"x", "y"}, {"x", "y"})``.

    ``x`` is float32 of shape (n, 64) scaled to [0, 1] (to [-1, 1] when ``signed``, as
    generators with a tanh output want); ``y`` the digit (int32). The split is
    stratified and fixed by ``seed``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 8.0 - 1.0 if signed else digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    x_train, x_val, y_train, y_val = train_test_split(
        x, y, test_size=validation_fraction, random_state=seed, stratify=y
    )
    return {"x": x_train, "y": y_train}, {"x": x_val, "y": y_val}


def batches(
    arrays: Mapping[str, np.ndarray], batch_size: int, shuffle_seed: int | None = None
) -> tf.data.Dataset:
    """The built-in input pipeline: examples cached, shuffled each epoch by a seed (if
    given), batched with the short last batch kept, prefetched (``AUTOTUNE``).
    ``benchmarks/input_pipeline.py`` shows it keeps up with training."""
    dataset = tf.data.Dataset.from_tensor_slices(dict(arrays)).cache()
    if shuffle_seed is not None:
        count = len(next(iter(arrays.values())))
        dataset = dataset.shuffle(count, seed=shuffle_seed, reshuffle_each_iteration=True)
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def digits(
    seed: int, batch_size: int, validation_fraction: float = 0.2, signed: bool = False
) -> DataSplit:
    """The digits split as batched pipelines; training data reshuffled every epoch."""
    train, validation = digits_arrays(seed, validation_fraction, signed)
    return DataSplit(batches(train, batch_size, shuffle_seed=seed), batches(validation, batch_size))


def sample_photo(name: str, size: tuple[int, int]) -> np.ndarray:
    """One of the two photographs scikit-learn ships (``"china"``, ``"flower"``), as
    float32 RGB in [0, 1] resized to ``size`` (height, width)."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images()
    names = [path.rsplit("/", 1)[-1].removesuffix(".jpg") for path in photos.filenames]
    if name not in names:
        raise ValueError(f"no sample photo {name!r}; scikit-learn ships {names}")
    return _resized(photos.images[names.index(name)], size)


def load_image(path: str, size: tuple[int, int]) -> np.ndarray:
    """An image file as float32 RGB in [0, 1] resized to ``size`` (height, width)."""
    from PIL import Image

    with Image.open(path) as picture:
        return _resized(np.asarray(picture.convert("RGB")), size)


def _resized(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    image = tf.image.resize(tf.convert_to_tensor(pixels, tf.float32) / 255.0, size, "area")
    return np.clip(image.numpy(), 0.0, 1.0)


def breast_cancer_arrays(seed: int, validation_fraction: float = 0.25) -> tuple[dict, dict]:
    """scikit-learn's 569 breast-cancer cases as ``({"x", "y", "risk"}, ...)``.

    ``x``: the 30 features, standardised with the training split's mean and deviation;
    ``y``: 1 for malignant, 0 for benign (scikit-learn codes malignant as 0, so it is
    flipped: the positive class is the one to catch). ``risk``: a per-case weight from
    1 to 10, linear in the case's "worst area" (the largest tumour cross-section),
    ``1 + 9 * (area - min) / (max - min)`` over all 569 cases — larger tumours cost more
    to get wrong, as larger loans do in the credit-risk case. Stratified split by ``seed``.
    """
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    cases = load_breast_cancer()
    area = cases.data[:, list(cases.feature_names).index("worst area")]
    risk = (1.0 + 9.0 * (area - area.min()) / (area.max() - area.min())).astype(np.float32)
    y = (1 - cases.target).astype(np.int32)
    parts = train_test_split(
        cases.data, y, risk, test_size=validation_fraction, random_state=seed, stratify=y
    )
    x_train, x_val, y_train, y_val, risk_train, risk_val = parts
    mean, deviation = x_train.mean(axis=0), x_train.std(axis=0) + 1e-8
    standard = lambda x: ((x - mean) / deviation).astype(np.float32)  # noqa: E731
    return (
        {"x": standard(x_train), "y": y_train, "risk": risk_train},
        {"x": standard(x_val), "y": y_val, "risk": risk_val},
    )


def with_outliers(
    arrays: Mapping[str, np.ndarray], count: int, weight: float, scale: float, seed: int
) -> dict[str, np.ndarray]:
    """A copy of ``arrays`` where ``count`` random samples become extreme, mislabelled and
    heavily weighted: features times ``scale``, binary label flipped, ``risk = weight``.
    The stress case for gradient clipping: a few such samples make updates explode."""
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(arrays["y"]), size=count, replace=False)
    noisy = {key: np.array(value, copy=True) for key, value in arrays.items()}
    noisy["x"][chosen] *= scale
    noisy["y"][chosen] = 1 - noisy["y"][chosen]
    noisy["risk"][chosen] = weight
    return noisy


def split_arrays(
    arrays: Mapping[str, np.ndarray], config: Any, seed: int, batch_size: int, label: str
) -> DataSplit:
    """Arrays (one example per row) as a DataSplit: ``config.validation_fraction`` of the
    examples, drawn by ``seed``, held out for validation; training batches reshuffled
    every epoch by ``seed`` when ``config.shuffle`` (the built-in pipeline,
    ``batches``)."""
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
        return DataSplit(batches(arrays, batch_size, shuffle_seed=shuffle_seed))
    order = np.random.default_rng(seed).permutation(count)
    train = {name: value[order[held:]] for name, value in arrays.items()}
    validation = {name: value[order[:held]] for name, value in arrays.items()}
    return DataSplit(
        batches(train, batch_size, shuffle_seed=shuffle_seed),
        batches(validation, batch_size),
    )
