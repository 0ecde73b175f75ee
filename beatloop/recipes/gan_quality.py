"""A cheap, honest sample-quality figure for generated 8x8 digits.

An Inception-Score analogue without Inception: a small classifier trained on
scikit-learn's digits (pixels in [-1, 1]) labels a fixed batch of generated samples.
Three figures come out: the mean confidence of its predictions (do samples look like
*some* digit?), the number of distinct classes predicted (do they cover the digits or
collapse to a few?), and ``exp(E_x KL(p(y|x) || p(y)))`` — the Inception Score formula
(Salimans et al., 2016) with this classifier — between 1 (uninformative or collapsed)
and 10 (confident and evenly spread). They measure what the classifier can tell, not
perceptual quality: a generator could fool a 64-pixel MLP with odd images.

Training the classifier takes seconds, so its weights are kept: in the run dir (a resumed
run reads the very weights it started with), in the process, and in beatloop's cache
directory (``beatloop.files``) under a name that changes with every version its training
depends on, so each new process of the same installation loads them instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from pathlib import Path

import attrs
import keras
import numpy as np
import tensorflow as tf

from beatloop.files import cache_dir as beatloop_cache_dir

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
    """The quality classifier: read from ``cache_dir`` (a run dir) if saved there, else
    the process's (read from beatloop's cache or trained, once per process), then saved
    in ``cache_dir`` for the run's next start."""
    model = _build_classifier()
    path = None if cache_dir is None else Path(cache_dir) / CLASSIFIER_FILE
    if path is not None and path.exists():
        model.load_weights(path)
        return model
    model.set_weights(_trained_weights())
    if path is not None:
        _save(model, path)
    return model


def _trained_weights() -> list[np.ndarray]:
    """The trained classifier's weights, once per process."""
    global _TRAINED_WEIGHTS
    if _TRAINED_WEIGHTS is None:
        _TRAINED_WEIGHTS = _cached_or_trained()
    return _TRAINED_WEIGHTS


def shared_file() -> Path:
    """Where beatloop's cache keeps the trained weights: one file for each set of versions
    (TensorFlow, Keras, NumPy, scikit-learn's digits, oneDNN on or off, the CPU's kind)
    that training's result depends on."""
    import sklearn

    depends_on = {
        "classifier": 1,  # bumped when _build_classifier or _train changes
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "sklearn": sklearn.__version__,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", ""),
        "machine": platform.machine(),
    }
    digest = hashlib.sha256(json.dumps(depends_on, sort_keys=True).encode()).hexdigest()
    return beatloop_cache_dir() / "quality" / f"digits-{digest[:16]}.weights.h5"


def _cached_or_trained() -> list[np.ndarray]:
    """Weights read from beatloop's cache, else trained and written there (a cache that
    cannot be read or written is passed over: the classifier is trained)."""
    model = _build_classifier()
    shared = shared_file()
    with contextlib.suppress(OSError, ValueError):
        if shared.is_file():
            model.load_weights(shared)
            return model.get_weights()
    _train(model)
    with contextlib.suppress(OSError):
        _save(model, shared)
    return model.get_weights()


def _save(model: keras.Model, path: Path) -> None:
    """``model``'s weights to ``path``, whole: written beside it under a name of this
    process's, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"partial-{os.getpid()}.{path.name}")
    try:
        model.save_weights(partial)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


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
