"""Mixed precision: models built under the policy, every optimizer loss-scaled for
float16, losses in float32; training matches float32 to a stated tolerance and an
overflowing step is skipped, not applied."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import dict_batches, gan_data, model_weights

import beatloop


def digits_data(small_digits):
    train, validation = small_digits
    return dict_batches(train, 32), dict_batches(validation, 32)


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_like_float32(small_digits, precision):
    data = digits_data(small_digits)
    full = beatloop.fit("supervised", data=data, epochs=3, seed=6)
    mixed = beatloop.fit("supervised", data=data, epochs=3, seed=6, precision=precision)
    model = mixed.models["model"]
    compute = "float16" if precision == "mixed_float16" else "bfloat16"
    assert model.layers[0].compute_dtype == compute
    assert all(w.dtype == "float32" for w in model.weights)  # variables stay float32
    assert keras.mixed_precision.global_policy().name == "float32"  # nothing leaked
    scaled = isinstance(mixed.optimizers["optimizer"], keras.optimizers.LossScaleOptimizer)
    assert scaled == (precision == "mixed_float16")  # bfloat16 has float32's range
    # Half-precision matmuls round to 11 (float16) or 8 (bfloat16) mantissa bits: over 21
    # steps the losses stay within 1% (float16) or 5% (bfloat16) of float32's.
    tolerance = 0.01 if precision == "mixed_float16" else 0.05
    for name in ("loss", "val_loss"):
        np.testing.assert_allclose(mixed.history[name], full.history[name], rtol=tolerance)
    assert mixed.history["loss"][-1] < mixed.history["loss"][0] * 0.95  # it learns


def test_every_optimizer_of_a_gan_is_loss_scaled():
    config = {"n_critic": 2, "quality_samples": 32}
    result = beatloop.fit(
        "gan", data=gan_data(128), config=config, seed=0, precision="mixed_float16"
    )
    for name, optimizer in result.optimizers.items():
        assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer), name
    # 4 steps, 2 critic applies each, 1 generator apply: all applied (no overflow here).
    assert int(result.optimizers["d_optimizer"].iterations) == 8
    assert int(result.optimizers["g_optimizer"].iterations) == 4
    assert np.isfinite(result.history["d_loss"][0]) and np.isfinite(result.history["g_loss"][0])


class FarTarget(beatloop.Recipe):
    """One float16 linear model pulled towards targets so far away that its scaled
    gradient overflows float16 at the initial scale (test recipe)."""

    name = "far_target_test"
    batch_keys = {"x": 2}

    def default_data(self, seed):
        raise NotImplementedError

    def build_models(self, batch_spec):
        return {"model": keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(1e-6)}

    def losses(self):
        # 2 * 1000 * 32768 / 8: ~8e6 reaches float16's backward pass, whose largest
        # value is 65504.
        return {
            "fit": lambda models, batch: tf.reduce_mean(
                tf.square(models["model"](batch["x"]) - 1000.0)
            )
        }

    def schedule(self):
        return beatloop.Schedule(beatloop.Beat(loss="fit", optimizer="sgd", updates="model"))


def test_an_overflowing_step_is_skipped_and_the_scale_lowered():
    from beatloop import Engine, EngineOptions
    from beatloop.core.data.batches import as_data_split

    batch = {"x": np.ones((8, 4), np.float32)}
    data = tf.data.Dataset.from_tensors(batch).repeat(12)  # 12 steps of one batch
    engine = Engine(
        FarTarget(), as_data_split(data), options=EngineOptions(precision="mixed_float16")
    )
    optimizer = engine.bound.optimizers["sgd"]
    before = model_weights(engine.bound.models["model"])
    engine.fit(1)  # no NumericsError: overflow under loss scaling is not a fault
    assert int(engine.state.step) == 12
    # Each overflowing step halves the scale and applies nothing; once the scaled
    # gradient fits in float16 the updates go through.
    skipped = 12 - int(optimizer.iterations)
    assert 1 <= skipped < 12
    assert float(optimizer.dynamic_scale) == 2.0**15 / 2**skipped
    after = model_weights(engine.bound.models["model"])
    assert not np.array_equal(after[1], before[1])
    # Replaying only the applied steps in float32 gives the same bias: skipped steps
    # left no trace.
    bias = before[1].astype(np.float64)
    kernel = before[0].astype(np.float64)
    for _ in range(12 - skipped):
        error = (np.ones((8, 4)) @ kernel + bias) - 1000.0
        grad_b = 2 * error.mean(axis=0)
        grad_k = np.ones((4, 8)) @ (2 * error / 8)
        bias, kernel = bias - 1e-6 * grad_b, kernel - 1e-6 * grad_k
    np.testing.assert_allclose(after[1], bias, rtol=1e-3)


def test_gradient_clipping_sees_true_gradients_under_loss_scaling():
    # Clipped at global norm 0.05, every step of this run is clipped. Were the scaled
    # gradients (x 32768) clipped, the updates would shrink 32768-fold and the loss
    # would barely move; unscaled first, the run follows float32's.
    config = {"clip": "global_norm", "clip_norm": 0.05, "learning_rate": 0.05}
    full = beatloop.fit("risk_weighted", config=config, epochs=2, seed=0)
    mixed = beatloop.fit(
        "risk_weighted", config=config, epochs=2, seed=0, precision="mixed_float16"
    )
    np.testing.assert_allclose(mixed.history["loss"], full.history["loss"], rtol=0.02)
    drop = lambda result: result.history["loss"][0] - result.history["loss"][-1]  # noqa: E731
    assert drop(full) > 0.1
    assert drop(mixed) == pytest.approx(drop(full), rel=0.25)
