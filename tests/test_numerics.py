"""The NaN/Inf guard in the compiled step: every beat's loss and gradient norm are
checked; a fault stops the run naming beat, step and value (the last good checkpoint
stays), or rolls back to that checkpoint and skips the offending batch."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from helpers import TwoModels, all_finite, dict_batches, model_weights, same_weights


def poisoned(digits, bad_batch: int, key: str = "x"):
    """320 training digits in 10 unshuffled batches of 32; batch ``bad_batch`` (from 1)
    holds NaN in ``key``, so it poisons every epoch at the same place. ``key="z"`` adds
    ``z``, a copy of ``x``, and poisons that instead."""
    train, validation = digits
    train = {k: np.array(v[:320], copy=True) for k, v in train.items()}
    validation = {k: v[:64] for k, v in validation.items()}
    if key == "z":
        train["z"], validation["z"] = train["x"].copy(), validation["x"]
    rows = slice(32 * (bad_batch - 1), 32 * bad_batch)
    train[key] = train[key].astype(np.float32)
    train[key][rows] = np.nan
    return dict_batches(train, 32), dict_batches(validation, 32)


def poisoned_run(digits, run_dir, **options):
    """Two epochs of supervised on data whose 7th batch is NaN, checkpointing every 4
    steps into ``run_dir``."""
    import beatloop

    data = poisoned(digits, bad_batch=7)
    return beatloop.fit(
        "supervised", data=data, epochs=2, seed=0, run_dir=run_dir, checkpoint_every=4, **options
    )


def test_a_nan_batch_stops_the_run_naming_beat_step_and_checkpoint(digits, tmp_path):
    import beatloop
    from beatloop.core.failures.errors import NumericsError

    with pytest.raises(NumericsError) as caught:
        poisoned_run(digits, tmp_path)
    message = str(caught.value)
    # Whether the loss is NaN is TensorFlow's: where oneDNN is on, its ReLU turns the NaN
    # inputs into zeros and only the gradient norm (NaN inputs times the error) is NaN;
    # without oneDNN, ReLU keeps the NaN and the loss, named first, is NaN too. The beat,
    # the value, the step, the epoch and the checkpoint are beatloop's.
    fault = r"^beat 'loss' produced a non-finite (loss|gradient global norm) \(nan\) at step 7 "
    assert re.search(fault + r"\(epoch 1\); ", message), message
    assert message.endswith(f"the last good checkpoint is {tmp_path}/checkpoints/ckpt-2")
    kept = beatloop.restore(tmp_path)  # the checkpoint of step 4 is intact and finite
    assert kept.steps == 4 and all_finite(kept.models)


def test_the_guard_watches_every_beat_and_stops_at_the_faulty_step(digits):
    from beatloop import Engine, EngineOptions
    from beatloop.core.data.batches import as_data_split
    from beatloop.core.failures.errors import NumericsError

    # Beat 'fit_a' fits model a to x (clean), beat 'fit_b' fits model b to z (NaN in
    # batch 3), each a linear model by SGD(0.01).
    engine = Engine(
        TwoModels(inputs=("x", "z"), learning_rate=0.01),
        as_data_split(poisoned(digits, bad_batch=3, key="z")),
        options=EngineOptions(steps_per_execution=8),
    )
    before = model_weights(engine.bound.models["a"])
    with pytest.raises(NumericsError, match=r"beat 'fit_b' produced a non-finite loss \(nan\)"):
        engine.fit(1)
    # The compiled call of 8 steps stopped at the faulty third step: nothing ran after it.
    assert int(engine.state.step) == 3 and int(engine.state.epoch_batches) == 3
    assert all_finite({"a": engine.bound.models["a"]})  # beat 'fit_a' saw clean data
    assert not same_weights(before, model_weights(engine.bound.models["a"]))  # a trained


def test_rollback_restores_the_last_checkpoint_and_skips_the_offending_batch(digits, tmp_path):
    with pytest.warns(RuntimeWarning) as warned:
        result = poisoned_run(digits, tmp_path, on_nan="rollback")
    messages = [str(w.message) for w in warned if "rollback" in str(w.message)]
    # Epoch 1: the fault at step 7 rolls back to step 4, skipping batches 5-7. Epoch 2
    # (10 steps after step 7): the checkpoint at step 12 is 5 batches in, so batches 6
    # and 7 are skipped. 20 batches - 5 skipped = 15 steps applied.
    assert len(messages) == 2
    assert "restored" in messages[0] and "(step 4) and skipped 3 batch(es)" in messages[0]
    assert "(step 12) and skipped 2 batch(es)" in messages[1]
    assert result.steps == 15 and result.epochs == 2
    assert all_finite(result.models)
    assert all(math.isfinite(value) for value in result.history["loss"])


def test_rollbacks_are_bounded_and_need_a_run_dir(digits, tmp_path):
    import beatloop
    from beatloop.core.failures.errors import ConfigError, NumericsError

    with (
        pytest.warns(RuntimeWarning, match="rollback 1 of at most 1"),
        pytest.raises(NumericsError, match=r"already rolled back 1 time\(s\)"),
    ):
        poisoned_run(digits, tmp_path, on_nan="rollback", max_rollbacks=1)
    with pytest.raises(ConfigError, match=r"on_nan='rollback' .* needs a run_dir"):
        beatloop.fit("supervised", data=poisoned(digits, bad_batch=7), on_nan="rollback")
