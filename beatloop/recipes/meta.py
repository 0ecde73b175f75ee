"""The meta recipe: MAML (Finn, Abbeel & Levine, ICML 2017) on sinusoid regression tasks.

A batch is whole tasks: ``support_x``/``support_y`` of shape ``(tasks, support, 1)`` and
``query_x``/``query_y`` of shape ``(tasks, query, 1)``. For each task the learner's
weights, taken as values, are adapted by ``inner_steps`` plain SGD steps on the task's
support points (``stateless_call`` on the adapted values, a ``GradientTape`` inside the
loss); the loss is the adapted learner's mean squared error on the task's query points,
averaged over the tasks, and Adam applies its gradient to the learner. Second order:
the engine's tape differentiates through the inner gradients; first order: the inner
gradients are ``stop_gradient``-ed (FOMAML).

The per-task loop is ``tf.map_fn`` over the batch's leading dimension, whose size is
read when the step runs: under a distribution strategy the replicas get unequal shares
of a batch's tasks. Validation adapts too (its loss takes the inner gradients without
an outer tape): adaptation is part of what is judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import attrs
import keras
import tensorflow as tf

from beatloop import Beat, DataSplit, ModelCalls, Recipe, Schedule, choice, setting
from beatloop.recipes.sinusoids import KEYS, sinusoid_split

_positive = attrs.validators.gt(0)
_at_least_one = attrs.validators.ge(1)


@attrs.frozen
class MetaConfig:
    """Settings of the meta recipe."""

    order: Literal["first", "second"] = choice(
        "second",
        ("first", "second"),
        "second: differentiate through the inner steps (MAML); first: their gradients "
        "held constant (first-order MAML)",
    )
    inner_steps: int = setting(
        1, "SGD steps adapting the learner to a task's support set", _at_least_one
    )
    inner_learning_rate: float = setting(0.01, "the inner SGD steps' learning rate", _positive)
    learning_rate: float = setting(1e-3, "the outer Adam's learning rate", _positive)
    hidden: int = setting(40, "width of the learner's two hidden Dense layers (relu)", _positive)
    batch_size: int = setting(
        25, "tasks in one batch (the meta-batch), of the built-in data or --data", _at_least_one
    )
    support: int = setting(10, "support points per task (K shots, adapted on)", _at_least_one)
    query: int = setting(10, "query points per task (the loss after adaptation)", _at_least_one)
    train_tasks: int = setting(10000, "training tasks of the built-in data", _at_least_one)
    validation_tasks: int = setting(
        500, "held-out validation tasks of the built-in data", _at_least_one
    )


def squared_error(predicted: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
    """The mean squared error over a task's points."""
    return tf.reduce_mean(tf.square(predicted - target))


def mean_over_tasks(values: tf.Tensor) -> tf.Tensor:
    """The mean of per-task values; 0 for a replica's share of no task."""
    return tf.math.divide_no_nan(tf.reduce_sum(values), tf.cast(tf.size(values), values.dtype))


class Meta(Recipe):
    """MAML on sinusoid regression tasks: adapt to each task's support set, learn from its query."""

    name = "meta"
    autograph = False  # no Python control flow on tensors: traced as written
    primary_model = "learner"
    quality_figure = ("val_query_loss_after", "min")
    Config = MetaConfig
    batch_keys = dict.fromkeys(KEYS, 3)
    nested_keys = frozenset()  # it computes on its batches, not only hands them to models

    def default_data(self, seed: int) -> DataSplit:
        c = self.config
        return sinusoid_split(
            seed, c.train_tasks, c.validation_tasks, c.batch_size, c.support, c.query
        )

    def build_models(self, batch_spec: Mapping[str, tf.TensorSpec]) -> dict[str, keras.Layer]:
        # Named layers: the graph's node names, which Grappler orders sums by, are then
        # the same whatever else the process built.
        hidden, dense = self.config.hidden, keras.layers.Dense
        layers = [
            keras.Input((1,)),
            dense(hidden, activation="relu", name="hidden_1"),
            dense(hidden, activation="relu", name="hidden_2"),
            dense(1, name="output"),
        ]
        return {"learner": keras.Sequential(layers, name="learner")}

    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        return {"adam": keras.optimizers.Adam(self.config.learning_rate)}

    def losses(self):
        return {"query_loss_after": self.query_loss_after}

    def schedule(self) -> Schedule:
        return Schedule(Beat(loss="query_loss_after", optimizer="adam", updates="learner"))

    def query_loss_after(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        """Every task adapted on its support set; the mean query loss after adaptation,
        with each task's query loss before and after for the figures."""
        learner, training = models.raw("learner"), models.is_training("learner")
        weights = [tf.convert_to_tensor(v) for v in learner.trainable_variables]
        fixed = list(learner.non_trainable_variables)

        def predict(values, x):  # float32 under mixed precision too, as the targets
            outputs = learner.stateless_call(values, fixed, x, training=training)[0]
            return tf.cast(outputs, tf.float32)

        def one_task(task):
            support_x, support_y, query_x, query_y = task
            adapted = self.adapt(predict, weights, support_x, support_y)
            before = squared_error(predict(weights, query_x), query_y)
            return before, squared_error(predict(adapted, query_x), query_y)

        tasks = tuple(batch[key] for key in KEYS)
        # An absolute name scope: the loop's ops are named alike wherever the engine
        # traces the step (a conditional at one step a call, a loop body at several),
        # and Grappler orders the terms of the second-order sums by those names.
        with tf.name_scope("meta/"):
            before, after = tf.map_fn(one_task, tasks, fn_output_signature=(tf.float32, tf.float32))
        return {"loss": mean_over_tasks(after), "before": before, "after": after}

    def adapt(self, predict, weights: list, x: tf.Tensor, y: tf.Tensor) -> list:
        """``inner_steps`` SGD steps from ``weights`` on one task's support points."""
        rate, adapted = self.config.inner_learning_rate, list(weights)
        for _ in range(self.config.inner_steps):
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(adapted)
                loss = squared_error(predict(adapted, x), y)
            gradients = tape.gradient(loss, adapted)
            if self.config.order == "first":
                gradients = [tf.stop_gradient(g) for g in gradients]
            adapted = [w - rate * g for w, g in zip(adapted, gradients, strict=True)]
        return adapted

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        return {"query_loss_before": keras.metrics.Mean(name="query_loss_before")}

    def update_metrics(self, metrics, batch, outputs) -> None:
        metrics["query_loss_before"].update_state(outputs["query_loss_after"]["before"])

    def inference_models(self, models):
        """The meta-learned initialisation: adapt it to a new task's points before use."""
        return {"learner": models["learner"]}
