"""How steps run: K steps per compiled call for multi-beat schedules (events every K
steps), and XLA compilation of the step, each matched against the plain run."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CountExecutions, all_weights, assert_close_weights, dict_batches, gan_data

import beatloop


def multitask_data(small_digits):
    train, validation = small_digits
    return dict_batches(train, 32), dict_batches(validation, 50)  # 7 steps (200 digits)


RUNS = {
    # Two critic applies per step (repeat), then the generator.
    "gan": ({"n_critic": 2, "quality_samples": 32}, lambda _: gan_data(224)),  # 7 steps
    # Alternating: one head per step, taken in turn, with the shared backbone.
    "multitask": ({"schedule": "alternating"}, multitask_data),
}


@pytest.mark.parametrize("recipe", sorted(RUNS))
def test_k_steps_per_call_give_the_same_training_for_multi_beat_schedules(recipe, small_digits):
    config, data = RUNS[recipe]
    one = beatloop.fit(recipe, data=data(small_digits), config=config, epochs=2, seed=4)
    counted = CountExecutions()
    four = beatloop.fit(
        recipe,
        data=data(small_digits),
        config=config,
        epochs=2,
        seed=4,
        steps_per_execution=4,
        callbacks=[counted],
    )
    assert counted.steps == [4, 3, 4, 3]  # execution events every K steps, fewer at the end
    assert four.steps == one.steps == 14
    for name in one.optimizers:  # every beat's applies, repeats included
        assert int(four.optimizers[name].iterations) == int(one.optimizers[name].iterations)
    assert_close_weights(all_weights(one.models), all_weights(four.models), rtol=1e-5, atol=1e-6)
    # Every logged figure too: the epochs' metrics gather the same steps' outputs.
    assert four.history.keys() == one.history.keys()
    for name, values in one.history.items():
        np.testing.assert_allclose(four.history[name], values, rtol=1e-5, atol=1e-6, err_msg=name)


# XLA fuses and reorders float operations, so results match to round-off, not bits:
# after 14 steps, losses agree to 1e-4 relative and weights to 1e-4 absolute here.
@pytest.mark.parametrize("recipe", ["supervised", "multitask"])
def test_xla_compiled_steps_train_like_the_plain_ones(recipe, small_digits):
    train, validation = small_digits
    data = dict_batches(train, 32), dict_batches(validation, 32)
    plain = beatloop.fit(recipe, data=data, epochs=2, seed=5)
    xla = beatloop.fit(recipe, data=data, epochs=2, seed=5, jit_compile=True)
    assert xla.steps == plain.steps == 14
    for name, values in plain.history.items():
        np.testing.assert_allclose(xla.history[name], values, rtol=1e-4, atol=1e-5, err_msg=name)
    assert_close_weights(all_weights(plain.models), all_weights(xla.models), rtol=1e-3, atol=1e-4)


def test_xla_gan_draws_from_the_same_stream_positions():
    """XLA's CPU Philox turns the same generator state into different numbers (measured:
    stateful and stateless draws both differ), so a GAN under XLA is the same training
    in distribution, not in value: the stream advances identically and it trains."""
    config = RUNS["gan"][0]
    plain = beatloop.fit("gan", data=gan_data(224), config=config, epochs=2, seed=5)
    xla = beatloop.fit("gan", data=gan_data(224), config=config, epochs=2, seed=5, jit_compile=True)
    np.testing.assert_array_equal(xla.bound.random.state.numpy(), plain.bound.random.state.numpy())
    assert xla.steps == plain.steps == 14
    for name in ("d_loss", "g_loss"):  # a NaN fails this too
        np.testing.assert_allclose(xla.history[name], plain.history[name], rtol=0.1)
