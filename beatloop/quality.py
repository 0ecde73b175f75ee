"""A cheap, honest sample-quality figure for generated 8x8 digits.

An Inception-Score analogue without Inception: a small classifier trained on
scikit-learn's digits (pixels in [-1, 1]) labels a fixed batch of generated samples.
Three figures come out: the mean confidence of its predictions (do samples look like
*some* digit?), the number of distinct classes predicted (do they cover the digits or
collapse to a few?), and ``exp(E_x KL(p(y|x) || p(y)))`` — the Inception Score formula
(Salimans et al., 2016) with this classifier — between 1 (uninformative or collapsed)
and 10 (confident and evenly spread). They measure what the classifier can tell, not
perceptual quality: a generator could fool a 64-pixel MLP with odd images.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import keras
import numpy as np
import tensorflow as tf

CLASSIFIER_FILE = "digits_classifier.weights.h5"
_TRAINED_WEIGHTS: list[np.ndarray] | None = None  # trained once per process


@attrs.frozen
class SampleQuality:
    """The quality figures of one batch of samples."""

    confidence: float
    classes: int
    score: float

    def as_logs(self, prefix: str = "sample_") -> dict[str, float]:
        return {
            f"{prefix}confidence": self.confidence,
            f"{prefix}classes": float(self.classes),
            f"{prefix}score": self.score,
        }


def _build_classifier() -> keras.Model:
    init = keras.initializers.GlorotUniform
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu", kernel_initializer=init(seed=1)),
            keras.layers.Dense(10, kernel_initializer=init(seed=2)),
        ],
        name="digits_classifier",
    )


def _train(model: keras.Model) -> None:
    """Fit on all digits, in a fixed order, without touching the global random seeds."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x = (digits.data[order] / 8.0 - 1.0).astype(np.float32)
    y = digits.target[order].astype(np.int32)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    model.fit(data, epochs=30, shuffle=False, verbose=0)


def digits_classifier(cache_dir: str | Path | None = None) -> keras.Model:
    """The quality classifier: read from ``cache_dir`` if saved there, else trained (once
    per process) and saved there for the next run."""
    global _TRAINED_WEIGHTS
    model = _build_classifier()
    path = None if cache_dir is None else Path(cache_dir) / CLASSIFIER_FILE
    if path is not None and path.exists():
        model.load_weights(path)
        return model
    if _TRAINED_WEIGHTS is None:
        _train(model)
        _TRAINED_WEIGHTS = model.get_weights()
    else:
        model.set_weights(_TRAINED_WEIGHTS)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"partial.{path.name}")
        model.save_weights(partial)
        partial.replace(path)
    return model


def sample_quality(samples: np.ndarray, classifier: keras.Model) -> SampleQuality:
    """Quality figures for ``samples``: n digits of 64 pixels in [-1, 1]."""
    flat = np.asarray(samples, dtype=np.float32).reshape(len(samples), -1)
    if flat.shape[1] != 64:
        raise ValueError(f"the digits classifier takes 64-pixel samples, got {flat.shape[1]}")
    probabilities = tf.nn.softmax(classifier(flat, training=False)).numpy().astype(np.float64)
    marginal = probabilities.mean(axis=0)
    kl = (probabilities * (np.log(probabilities + 1e-12) - np.log(marginal + 1e-12))).sum(axis=1)
    return SampleQuality(
        confidence=float(probabilities.max(axis=1).mean()),
        classes=len(np.unique(probabilities.argmax(axis=1))),
        score=float(np.exp(kl.mean())),
    )
