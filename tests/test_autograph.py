"""A recipe's own code is converted by AutoGraph when traced (Python ``if`` and ``for`` on
tensors become graph control flow) while beatloop's compiled loops are traced without
it: the compiled run trains exactly as the eager (debug) run of the same code."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import dict_batches

import beatloop


class TensorControlFlow(beatloop.Recipe):
    """A loss, a group's forward and a metric update branching and looping on tensors in
    Python (test recipe)."""

    name = "tensor_control_flow_test"
    batch_keys = {"x": 2, "y": 1}

    def __init__(self, grouped: bool = False):
        super().__init__()
        self.grouped = grouped

    def default_data(self, seed):
        raise NotImplementedError("a test passes its data")

    def build_models(self, batch_spec):
        keras.utils.set_random_seed(0)
        return {"model": keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.05)}

    def losses(self):
        return {"xent": self.xent}

    def forwards(self):
        return {"logits": self.logits}

    def logits(self, models, batch):
        logits = models["model"](batch["x"])
        if tf.reduce_mean(batch["x"]) > 4.0:  # a Python if on a tensor
            logits = logits * 0.5
        return {"logits": logits}

    def xent(self, models_or_outputs, batch):
        if self.grouped:
            logits = models_or_outputs["logits"]
        else:
            logits = models_or_outputs["model"](batch["x"])
        loss = tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(batch["y"], logits, from_logits=True)
        )
        # even batches of labels weigh twice: a branch that differs between batches
        if tf.reduce_sum(batch["y"]) % 2 == 0:
            loss = 2.0 * loss
        total = tf.constant(0.0)
        for i in tf.range(3):  # a Python for over a tensor range
            total += loss * tf.cast(i + 1, tf.float32) / 6.0
        return {"loss": total, "logits": logits}

    def build_metrics(self):
        return {"big": keras.metrics.Mean()}

    def update_metrics(self, metrics, batch, outputs):
        logits = outputs["xent"]["logits"]
        if tf.reduce_max(logits) > 0.0:
            metrics["big"].update_state(1.0)
        else:
            metrics["big"].update_state(0.0)

    def schedule(self):
        beat = beatloop.Beat(loss="xent", optimizer="sgd", updates="model")
        if self.grouped:
            return beatloop.Schedule(beatloop.Group("logits", [beat]))
        return beatloop.Schedule(beat)


@pytest.mark.parametrize("grouped", [False, True])
def test_python_control_flow_on_tensors_in_recipe_code_is_converted(small_digits, grouped):
    train, validation = small_digits
    data = dict_batches(train, 25), dict_batches(validation, 50)

    def run(debug):
        result = beatloop.fit(TensorControlFlow(grouped), data=data, seed=0, debug=debug)
        return result.models["model"].get_weights(), result.history

    compiled_weights, compiled_history = run(debug=False)
    eager_weights, eager_history = run(debug=True)
    for compiled, eager in zip(compiled_weights, eager_weights, strict=True):
        np.testing.assert_allclose(compiled, eager, rtol=1e-5, atol=1e-6)
    for key in ("xent", "big", "val_xent", "val_big"):
        np.testing.assert_allclose(compiled_history[key], eager_history[key], rtol=1e-5)
    # the branches taken differ between batches: the figures are not a constant's
    assert 0.0 < compiled_history["big"][0] <= 1.0
    initial = TensorControlFlow().build_models(None)["model"].get_weights()
    assert not np.allclose(compiled_weights[0], initial[0])


class AsWritten(TensorControlFlow):
    """The same code, declared to need no conversion: traced as written."""

    name = "as_written_test"
    autograph = False


def test_a_recipe_declaring_autograph_false_is_traced_as_written(small_digits):
    # Its Python `if` on a tensor is then TensorFlow's own error, named as the recipe's.
    train, validation = small_digits
    data = dict_batches(train, 25), dict_batches(validation, 50)
    with pytest.raises(beatloop.UserCodeError, match="loss 'xent'") as raised:
        beatloop.fit(AsWritten(), data=data, seed=0)
    assert isinstance(raised.value.original, tf.errors.OperatorNotAllowedInGraphError)
    assert raised.value.at.endswith('if tf.reduce_sum(batch["y"]) % 2 == 0:')
