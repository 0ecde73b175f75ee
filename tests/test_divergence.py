"""The opt-in divergence guard (``divergence=F``): a step where a beat's |loss| is above
F times the running median of its last |losses| faults like a NaN does: the compiled
loop stops at that step, the run stops naming beat, step, value and median (or rolls
back), and the window of recent losses is checkpointed with the run."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    TwoModels,
    all_finite,
    all_weights,
    assert_same_weights,
    assert_weights_within_ulps,
    dict_batches,
    gan_data,
    load_npz,
    model_weights,
    run_python,
    same_weights,
)

import beatloop
from beatloop import Engine, EngineOptions
from beatloop.core.compiled.numerics import DivergenceGuard
from beatloop.core.data.batches import as_data_split
from beatloop.core.failures.errors import ConfigError, NumericsError, RunawayLossWarning

FIXTURES = Path(__file__).parent / "fixtures"
WORKER = Path(__file__).parent / "workers" / "divergence_mirrored.py"


class LastLosses(beatloop.Callback):
    """Every step's value of every beat's loss, as ``{beat: [values]}`` (each compiled
    call's last step's, and it asks for calls of one step)."""

    max_steps_per_execution = 1

    def __init__(self):
        self.values: dict[str, list[float]] = {}

    def on_execution_end(self, run, steps, logs):
        for key in logs:
            if key.startswith("last_"):
                self.values.setdefault(key.removeprefix("last_"), []).append(logs[key])


def scaled(digits, bad_batch: int, batches: int = 10, factor: float = 1000.0):
    """The first ``batches`` batches of 32 training digits, unshuffled; batch
    ``bad_batch`` (from 1) has its pixels times ``factor``: a finite loss far above the
    others, at the same place every epoch."""
    train, validation = digits
    train = {k: np.array(v[: 32 * batches], copy=True) for k, v in train.items()}
    train["x"][32 * (bad_batch - 1) : 32 * bad_batch] *= factor
    return dict_batches(train, 32), dict_batches({k: v[:64] for k, v in validation.items()}, 32)


def supervised_engine(data, **options) -> Engine:
    """An engine for supervised on ``data``, seeded as ``fit(seed=0)`` seeds a run (so
    its model starts as theirs does), with these engine options."""
    keras.utils.set_random_seed(0)
    recipe = beatloop.make_recipe("supervised")
    return Engine(recipe, as_data_split(data), options=EngineOptions(**options), seed=0)


def words(loss: float, median: float, step: int, factor: int = 10) -> str:
    """The guard's message, from values computed here."""
    return (
        f"beat 'loss' diverged: loss {loss:.4g} is above {factor} times its running median "
        f"{median:.4g} at step {step}"
    )


def caught(call) -> str:
    with pytest.raises(NumericsError) as error:
        call()
    return str(error.value)


# --- the rule, on the guard itself --------------------------------------------------------


class FakeBeat:
    def __init__(self, name, every=1, repeat=1):
        self.name, self.every, self.repeat = name, every, repeat


def test_the_window_is_a_ring_of_absolute_losses_and_its_median_decides():
    beats = [FakeBeat("critic"), FakeBeat("slow", every=2)]
    guard = DivergenceGuard(beats, factor=10, window=4)
    np.testing.assert_array_equal(guard.medians(), [0, 0])  # empty: nothing fires
    seen = {"critic": [], "slow": []}
    # Negative critic losses compare by size; the slow beat runs at even steps only.
    for step, (critic, slow) in enumerate([(-1, 2), (-3, 0), (-2, 6), (-5, 0), (-4, 4), (-6, 0)]):
        checks = guard.watch(tf.constant([[critic, 1.0], [slow, 1.0]]), tf.constant(step, tf.int64))
        assert checks.shape == (2, 3) and not checks[:, 2].numpy().any()
        assert bool(guard.ok(checks))
        seen["critic"].append(abs(critic))
        if step % 2 == 0:
            seen["slow"].append(slow)  # no zero pushed for the steps it did not run
    np.testing.assert_array_equal(guard.counts, [6, 3])
    # The critic's last 4 values (2, 5, 4, 6: the ring wrapped) and the slow beat's 3.
    np.testing.assert_allclose(guard.medians(), [np.median(seen["critic"][-4:]), 4.0])
    np.testing.assert_array_equal(guard.values[0], [4, 6, 2, 5])  # positions 4, 5 wrapped
    # -46 is above 10 times 4.5 in size: the critic diverged; its median lands in column 2,
    # the step is not ok and pushes nothing, for either beat.
    checks = guard.watch(tf.constant([[-46.0, 1.0], [7.0, 1.0]]), tf.constant(6, tf.int64))
    np.testing.assert_allclose(checks[:, 2], [4.5, 0.0])
    assert not bool(guard.ok(checks))
    np.testing.assert_array_equal(guard.counts, [6, 3])
    # -44 is not: pushed. A non-finite step pushes nothing either.
    guard.watch(tf.constant([[-44.0, 1.0], [0.0, 1.0]]), tf.constant(7, tf.int64))
    guard.watch(tf.constant([[1.0, np.nan], [5.0, 1.0]]), tf.constant(8, tf.int64))
    np.testing.assert_array_equal(guard.counts, [7, 3])


def test_a_median_of_zero_never_fires():
    guard = DivergenceGuard([FakeBeat("hinge")], factor=10, window=5)
    for step in range(3):
        guard.watch(tf.constant([[0.0, 0.0]]), tf.constant(step, tf.int64))
    checks = guard.watch(tf.constant([[1e6, 0.0]]), tf.constant(3, tf.int64))
    assert bool(guard.ok(checks)) and float(guard.medians()[0]) == 0.0


# --- stopping at the step -----------------------------------------------------------------


@pytest.fixture(scope="module")
def unguarded(digits):
    """Every step's loss of supervised on the 10 batches with batch 7 scaled, without
    the guard, over two epochs: what the guarded runs' messages must quote."""
    losses = LastLosses()
    result = beatloop.fit(
        "supervised", data=scaled(digits, 7), epochs=2, seed=0, callbacks=[losses],
        progress=False,
    )  # fmt: skip
    return result, np.array(losses.values["loss"], np.float32)


@pytest.mark.parametrize("steps_per_execution", [1, 4, 8])
def test_a_diverging_loss_stops_at_its_step_naming_beat_value_and_median(
    digits, unguarded, steps_per_execution
):
    _, losses = unguarded
    engine = supervised_engine(
        scaled(digits, 7), steps_per_execution=steps_per_execution, divergence=10
    )
    message = caught(lambda: engine.fit(2))
    assert losses[6] > 10 * np.median(losses[:6])  # the scaled batch is far above the rest
    assert message.startswith(f"{words(losses[6], np.median(losses[:6]), 7)} (epoch 1); ")
    # A call of 8 steps stopped at its 7th: nothing ran after the diverged step.
    assert int(engine.state.step) == 7 and int(engine.state.epoch_batches) == 7


def test_without_the_guard_a_finite_runaway_goes_unnoticed(unguarded):
    result, losses = unguarded
    assert result.steps == 20 and all_finite(result.models)  # the old behaviour: no fault
    assert losses[6] > 100 * losses[5]


def test_a_runaway_learning_rate_diverges_at_its_second_step(small_digits):
    """Adam at 1e9 blows the loss up at the second step and keeps it finite (~1e20):
    a window that waited for more values before judging would hold only those."""
    data = (dict_batches(small_digits[0], 32), dict_batches(small_digits[1], 32))
    losses = LastLosses()
    config = {"learning_rate": 1e9}
    with pytest.warns(RunawayLossWarning, match="ran away in epoch 1"):  # the guard is off
        off = beatloop.fit("supervised", data=data, config=config, seed=0, callbacks=[losses])
    first, second = losses.values["loss"][:2]
    assert off.history["loss"][0] > 1e15
    message = caught(lambda: beatloop.fit("supervised", data=data, config=config, seed=0,
                                          divergence=10, steps_per_execution=8))  # fmt: skip
    assert message.startswith(f"{words(second, first, 2)} (epoch 1); run with debug=True")


def test_a_normal_run_trains_bit_for_bit_as_without_the_guard(small_digits):
    data = (dict_batches(small_digits[0], 32), dict_batches(small_digits[1], 32))
    losses = LastLosses()
    plain = beatloop.fit("supervised", data=data, epochs=2, seed=0, callbacks=[losses])
    guarded = supervised_engine(data, steps_per_execution=4, divergence=10)
    history = guarded.fit(2)
    assert_same_weights(all_weights(plain.models), all_weights(guarded.bound.models))
    assert history == {name: values[-1] for name, values in plain.history.items()}
    # The guard watched every step: its window holds each step's loss, in order.
    guard = guarded.parts.divergence
    np.testing.assert_array_equal(guard.counts, [14])
    np.testing.assert_array_equal(guard.values[0, :14], np.abs(losses.values["loss"]))


def test_every_repeat_and_groups_each_keep_their_own_window(digits):
    train, _ = digits
    schedule = beatloop.Schedule((TwoModels.beat("a", every=2), TwoModels.beat("b", repeat=2)))
    data = dict_batches(train, 32, 320)
    losses = LastLosses()
    engine = Engine(
        TwoModels(schedule, learning_rate=0.01),
        as_data_split(data),
        options=EngineOptions(divergence=5, divergence_window=4),
        callbacks=[losses],
    )
    engine.fit(1)
    guard = engine.parts.divergence
    # 'fit_a' ran at steps 1, 3, 5, 7, 9: five values, the last four kept (the fifth
    # in position 0); 'fit_b' at all ten, each the sum of its two repeats' losses.
    np.testing.assert_array_equal(guard.counts, [5, 10])
    ran = np.abs(losses.values["fit_a"][::2])
    np.testing.assert_array_equal(guard.values[0], [ran[4], *ran[1:4]])
    # Steps 9, 10, 7, 8 in the ring: each more than its last repeat's loss alone.
    last_repeat = np.abs(np.array(losses.values["fit_b"]))[[8, 9, 6, 7]]
    assert (guard.values[1].numpy() > last_repeat).all()
    # A group (the simultaneous GAN: two beats from one forward) and a repeated beat (the
    # alternating GAN's critic, n_critic=2) train as without the guard.
    for config in ({"update": "simultaneous"}, {"n_critic": 2, "loss": "hinge"}):
        config = {**config, "hidden": 16, "latent_dim": 4, "quality_samples": 16}
        runs = [
            beatloop.fit("gan", config=config, data=gan_data(64, 16), epochs=2, seed=3,
                         divergence=factor, progress=False)
            for factor in (None, 10)
        ]  # fmt: skip
        assert_same_weights(all_weights(runs[0].models), all_weights(runs[1].models))


def test_mixed_precision_xla_and_debug_mode(digits, unguarded):
    _, losses = unguarded
    data = scaled(digits, 7)
    for options in ({"precision": "mixed_float16"}, {"jit_compile": True}):
        message = caught(lambda o=options: beatloop.fit(
            "supervised", data=data, seed=0, divergence=10, steps_per_execution=4, **o
        ))  # fmt: skip
        assert "beat 'loss' diverged: loss " in message, options
        assert "at step 7 (epoch 1)" in message, options
    # Debug mode stops before the diverged update: the model is as six steps left it.
    engine = supervised_engine(data, debug=True, divergence=10)
    message = caught(lambda: engine.fit(1))
    assert message.startswith(words(losses[6], np.median(losses[:6]), 7))
    stopped = model_weights(engine.bound.models["model"])

    def debug_steps(count):
        train = scaled(digits, 7)[0].take(count)
        result = beatloop.fit("supervised", data=train, seed=0, debug=True)
        return model_weights(result.models["model"])

    assert same_weights(stopped, debug_steps(6))
    assert not same_weights(stopped, debug_steps(7))


# --- rollback and checkpoints --------------------------------------------------------------


def test_rollback_restores_the_last_checkpoint_and_goes_on(digits, tmp_path):
    with pytest.warns(RuntimeWarning) as warned:
        result = beatloop.fit(
            "supervised", data=scaled(digits, 7), epochs=2, seed=0, run_dir=tmp_path,
            checkpoint_every=4, divergence=10, on_nan="rollback",
        )  # fmt: skip
    messages = [str(w.message) for w in warned if "rollback" in str(w.message)]
    # As for a NaN (test_numerics): epoch 1 rolls back from step 7 to 4, skipping batches
    # 5-7; epoch 2 from step 14 to 12, skipping batches 6 and 7: 15 steps applied.
    assert len(messages) == 2
    assert messages[0].startswith("beat 'loss' diverged: loss ")
    assert "at step 7 (epoch 1); restored" in messages[0]
    assert "(step 4) and skipped 3 batch(es)" in messages[0]
    assert "at step 14 (epoch 2); restored" in messages[1]
    assert "(step 12) and skipped 2 batch(es)" in messages[1]
    assert result.steps == 15 and result.epochs == 2 and all_finite(result.models)


def twenty_batches(digits):
    """20 batches, batch 13 scaled: with steps_per_epoch=10 it comes at step 13, in the
    second epoch, so a run interrupted after the first epoch resumes before it."""
    return scaled(digits, 13, batches=20)


def run_to_divergence(digits, run_dir, epochs, divergence=10, **options):
    return beatloop.fit(
        "supervised", data=twenty_batches(digits), epochs=epochs, seed=0, run_dir=run_dir,
        steps_per_epoch=10, divergence=divergence, progress=False, **options,
    )  # fmt: skip


def test_a_resumed_run_keeps_its_window_and_stops_where_a_whole_run_does(digits, tmp_path):
    losses = LastLosses()
    whole = caught(lambda: run_to_divergence(digits, tmp_path / "whole", 2, callbacks=[losses]))
    losses = np.array(losses.values["loss"], np.float32)  # steps 1 to 12
    assert whole.startswith("beat 'loss' diverged: loss ")
    assert f"its running median {np.median(losses):.4g} at step 13 (epoch 2)" in whole

    run_to_divergence(digits, tmp_path / "resumed", 1)  # stops after the first epoch
    resumed = caught(lambda: run_to_divergence(digits, tmp_path / "resumed", 2))
    assert resumed.split("; ")[0] == whole.split("; ")[0]
    # Its checkpoints (window included) resume with the guard off too: no fault then.
    assert run_to_divergence(digits, tmp_path / "whole", 2, divergence=None).steps == 20

    # A checkpoint written without the guard (as by earlier versions) resumes with it:
    # the window starts empty there, so the median is of steps 11 and 12 only.
    run_to_divergence(digits, tmp_path / "old", 1, divergence=None)
    fresh = caught(lambda: run_to_divergence(digits, tmp_path / "old", 2))
    assert f"its running median {np.median(losses[10:]):.4g} at step 13 (epoch 2)" in fresh
    assert np.median(losses[10:]) != np.median(losses)

    # Another window length: that checkpoint's window is left out, with a warning.
    run_to_divergence(digits, tmp_path / "other", 1, divergence_window=5)
    kept = r"divergence window of shape \[1, 5\], this run keeps \[1, 100\]"
    with pytest.warns(RuntimeWarning, match=kept):
        other = caught(lambda: run_to_divergence(digits, tmp_path / "other", 2))
    assert f"its running median {np.median(losses[10:]):.4g} at step 13" in other


def test_an_old_checkpoint_resumes_with_the_guard_on_to_that_codes_result(tmp_path):
    """With the guard on, an old checkpoint resumes to the weights it resumes to without
    it (bit for bit, both run here), within ``ULPS`` of the old code's own result (made
    on another CPU: see ``test_old_checkpoints``)."""
    sys.path.insert(0, str(FIXTURES))
    from old_runs import RUNS, ULPS, data_for

    spec = RUNS["supervised"]
    weights = {}
    for divergence in (10, None):
        run_dir = tmp_path / f"divergence_{divergence}" / "supervised"
        shutil.copytree(FIXTURES / "old_checkpoints" / "supervised", run_dir)
        result = beatloop.fit(
            spec["recipe"], data=data_for(spec), epochs=2, run_dir=run_dir, progress=False,
            divergence=divergence, **spec["fit"],
        )  # fmt: skip
        assert result.resumed_from == str(run_dir / "checkpoints" / "ckpt-4")
        weights[divergence] = all_weights(result.models)
    assert_same_weights(weights[10], weights[None])
    assert_weights_within_ulps(weights[10], load_npz(run_dir / "expected.npz"), ULPS)


# --- options --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, problem",
    [
        ({"divergence": 0.5}, "divergence=...) takes None or a finite number > 1"),
        ({"divergence": 1}, "divergence=...) takes None or a finite number > 1"),
        ({"divergence": float("inf")}, "divergence=...) takes None or a finite number > 1"),
        ({"divergence": "x"}, "divergence=...) takes None or a finite number > 1"),
        ({"divergence": True}, "divergence=...) takes None or a finite number > 1"),
        ({"divergence": 10, "divergence_window": 0}, "divergence_window=...) takes an int >= 1"),
    ],
)
def test_a_bad_factor_or_window_is_a_config_error(options, problem):
    with pytest.raises(ConfigError, match=re.escape(f"fit({problem}")):
        beatloop.fit("supervised", **options)


# --- several replicas ----------------------------------------------------------------------


@pytest.mark.slow
def test_mirrored_strategy_diverges_at_the_same_step_with_the_global_loss(tmp_path):
    import json

    out = tmp_path / "mirrored.json"
    run_python(WORKER, out)
    report = json.loads(out.read_text())
    assert report["replicas"] == 2
    one, two = report["one"], report["two"]
    assert one["step"] == two["step"] == 7
    # The loss and median named are the global batch's, not the sum of the replicas'
    # (which would be about twice as large): float32 round-off apart, the same.
    np.testing.assert_allclose(two["numbers"], one["numbers"], rtol=1e-3)
