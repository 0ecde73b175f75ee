"""MAML on sinusoid tasks written as a TensorFlow user writes it, for the meta recipe's
tests (tests/test_meta.py) and its benchmark (benchmarks/meta_step.py).

One ``tf.function`` step traced for the data's element spec: an outer ``GradientTape``
around a ``tf.map_fn`` over the batch's tasks, each task's weights adapted by inner
tapes (``stateless_call`` on the adapted values; ``stop_gradient`` on the inner
gradients for first order), the mean query loss after adaptation differentiated and
applied by Adam. It shares no code with the recipe.
"""

from __future__ import annotations

import keras
import tensorflow as tf


def learner(hidden: int = 40) -> keras.Model:
    """The 1-hidden-hidden-1 relu network, its layers named as the recipe names them."""
    dense = keras.layers.Dense
    layers = [
        keras.Input((1,)),
        dense(hidden, activation="relu", name="hidden_1"),
        dense(hidden, activation="relu", name="hidden_2"),
        dense(1, name="output"),
    ]
    return keras.Sequential(layers, name="learner")


class HandWrittenMaml:
    """MAML's step on ``model``, one step a call (``step``), or ``steps_per_call``
    steps a call over an iterator (``many``)."""

    def __init__(
        self,
        model: keras.Model,
        element_spec,
        *,
        order: str = "second",
        inner_steps: int = 1,
        inner_rate: float = 0.01,
        outer_rate: float = 1e-3,
    ):
        self.model, self.order = model, order
        self.inner_steps, self.inner_rate = inner_steps, inner_rate
        self.optimizer = keras.optimizers.Adam(outer_rate)
        self.optimizer.build(model.trainable_variables)
        self.step = tf.function(self.train_step, input_signature=[element_spec])

    def task_losses(self, batch, training: bool):
        """Each task's query loss before and after adapting to its support points."""
        weights = [tf.convert_to_tensor(v) for v in self.model.trainable_variables]

        def forward(values, x):
            return self.model.stateless_call(values, [], x, training=training)[0]

        def one_task(task):
            support_x, support_y, query_x, query_y = task
            adapted = weights
            for _ in range(self.inner_steps):
                with tf.GradientTape(watch_accessed_variables=False) as inner:
                    inner.watch(adapted)
                    support_loss = tf.reduce_mean(
                        tf.square(forward(adapted, support_x) - support_y)
                    )
                gradients = inner.gradient(support_loss, adapted)
                if self.order == "first":
                    gradients = [tf.stop_gradient(g) for g in gradients]
                adapted = [w - self.inner_rate * g for w, g in zip(adapted, gradients, strict=True)]
            before = tf.reduce_mean(tf.square(forward(weights, query_x) - query_y))
            after = tf.reduce_mean(tf.square(forward(adapted, query_x) - query_y))
            return before, after

        tasks = (batch["support_x"], batch["support_y"], batch["query_x"], batch["query_y"])
        return tf.map_fn(one_task, tasks, fn_output_signature=(tf.float32, tf.float32))

    def train_step(self, batch):
        """One outer Adam step; returns the batch's mean query loss before and after."""
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            before, after = self.task_losses(batch, training=True)
            loss = tf.reduce_mean(after)
        gradients = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return tf.reduce_mean(before), loss

    def fit(self, data: tf.data.Dataset, epochs: int) -> None:
        for _ in range(epochs):
            for batch in data:
                self.step(batch)
