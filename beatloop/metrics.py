"""Metrics beyond Keras's own, accumulated across batches like any Keras metric (public:
``docs/api.md``)."""

from __future__ import annotations

import keras
import tensorflow as tf

__all__ = ["KSStatistic"]


class KSStatistic(keras.metrics.Metric):
    """Kolmogorov-Smirnov statistic between the score distributions of positives and
    negatives: ``max_t |F_pos(t) - F_neg(t)|``, the separation figure credit-risk teams
    report beside AUC.

    Scores in [0, 1] are counted into ``bins`` equal bins per class, so memory is fixed
    and batches accumulate; the result is exact up to points of both classes sharing a
    bin (it can only be lower than the exact statistic, by at most the share of each
    class in one bin).
    """

    def __init__(self, bins: int = 4096, name: str = "ks", **kwargs):
        super().__init__(name=name, **kwargs)
        self.bins = bins
        self.positives = self.add_variable(shape=(bins,), initializer="zeros", name="positives")
        self.negatives = self.add_variable(shape=(bins,), initializer="zeros", name="negatives")

    def update_state(self, y_true, y_score, sample_weight=None):
        labels = tf.reshape(tf.cast(y_true, tf.bool), [-1])
        scores = tf.reshape(tf.cast(y_score, tf.float32), [-1])
        index = tf.clip_by_value(tf.cast(scores * self.bins, tf.int32), 0, self.bins - 1)
        ones = tf.ones_like(scores)
        count = lambda mask: tf.math.unsorted_segment_sum(  # noqa: E731
            tf.where(mask, ones, 0.0), index, self.bins
        )
        self.positives.assign_add(count(labels))
        self.negatives.assign_add(count(tf.logical_not(labels)))

    def result(self):
        positive_cdf = tf.cumsum(self.positives) / tf.maximum(tf.reduce_sum(self.positives), 1.0)
        negative_cdf = tf.cumsum(self.negatives) / tf.maximum(tf.reduce_sum(self.negatives), 1.0)
        return tf.reduce_max(tf.abs(positive_cdf - negative_cdf))

    def reset_state(self):
        self.positives.assign(tf.zeros_like(self.positives))
        self.negatives.assign(tf.zeros_like(self.negatives))

    def get_config(self):
        return {**super().get_config(), "bins": self.bins}
