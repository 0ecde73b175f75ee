"""Beats that update only while a condition holds (``only_if=``): a GAN whose
discriminator trains only while its loss is above a threshold and PPO's KL early stop
equal their hand-written loops bit for bit; a false condition changes nothing (no
update, no optimizer step, no slot, no tied EMA); every K, ``repeat``, ``every``, debug
mode and mixed precision; clear errors; a SIGKILL while the condition is false."""

from __future__ import annotations

import json
import signal
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from gated_recipes import (
    Classifier,
    KlStop,
    ThresholdGan,
    bright,
    digit_batches,
    hand_written_classifier,
    hand_written_kl_stop,
    hand_written_threshold_gan,
    rollout_batches,
)
from helpers import (
    all_weights,
    assert_same_weights,
    gan_data,
    history_records,
    start_python,
    worker,
)

import beatloop
from beatloop import Beat, Group, Schedule, ScheduleError

WORKERS = Path(__file__).parent / "workers"
gated_run = worker("gated_run")


def fit(recipe, data, epochs=2, **options):
    options = {"seed": 5, "progress": False, "steps_per_execution": 1, **options}
    return beatloop.fit(recipe, data=data, epochs=epochs, **options)


@pytest.mark.parametrize("spe", [1, 4])
def test_a_discriminator_trained_while_its_loss_is_high_equals_the_hand_written_loop(spe):
    data = gan_data(128, 16)
    result = fit(ThresholdGan(threshold=1.2), data, epochs=3, steps_per_execution=spe)
    theirs, updates = hand_written_threshold_gan(data, 3, seed=5, threshold=1.2)
    assert 0 < updates < 24  # the condition held on some steps and not on others
    assert sum(result.history["d_loss_updates"]) == updates
    assert int(result.bound.optimizers["d_opt"].iterations) == updates
    assert_same_weights(all_weights(result.models), all_weights(theirs))


def test_ppo_stops_its_policy_updates_once_the_kl_passes_its_target_as_keras_io_does():
    data = rollout_batches()
    result = fit(KlStop(target_kl=0.01, iterations=6), data, epochs=2)
    theirs, updates = hand_written_kl_stop(data, 2, target_kl=0.01, iterations=6)
    assert 0 < updates < 2 * 4 * 6  # it stopped early, after some updates
    assert sum(result.history["policy_updates"]) == updates
    assert int(result.bound.optimizers["policy_opt"].iterations) == updates
    assert_same_weights(all_weights(result.models), all_weights({"policy": theirs}))


def test_a_false_condition_moves_nothing_and_its_loss_is_still_logged():
    never = lambda models, batch: tf.constant(False)  # noqa: E731
    recipe = Classifier(lambda: keras.optimizers.Adam(1e-2), only_if=never, ema="loss")
    start = all_weights(recipe.build_models(None))
    words = r"beat 'loss' made no update in epoch 1: its condition '.*<lambda>' \(only_if\) he"
    with pytest.warns(beatloop.IgnoredSettingWarning, match=words) as caught:
        result = fit(recipe, digit_batches(32), epochs=2)
    assert len(caught) == 1  # once, at the first epoch's end
    assert "none of its 7 turns" in str(caught[0].message)
    optimizer = result.bound.optimizers["optimizer"]
    assert_same_weights(all_weights(result.models), start)  # the model and its EMA target
    assert int(optimizer.iterations) == 0
    assert all(not np.any(v.numpy()) for v in optimizer.variables[2:])  # Adam's moments
    assert result.history["loss_updates"] == [0.0, 0.0]
    assert result.history["loss"][0] > 1.0  # the figure of a loss that was computed


@pytest.mark.parametrize("spe", [1, 8])
def test_a_condition_of_the_batch_and_a_tied_ema_equal_the_hand_written_loop(spe):
    make = lambda: keras.optimizers.SGD(0.1)  # noqa: E731
    result = fit(Classifier(make, only_if="bright", ema="loss"), digit_batches(8),
                 steps_per_execution=spe)  # fmt: skip
    hand = hand_written_classifier(digit_batches(8), 2, optimizer=make(), condition=bright,
                                   ema=True)  # fmt: skip
    assert_same_weights(all_weights(result.models), all_weights(hand))
    assert result.history["loss_updates"] == [18.0, 18.0]  # of 25 batches


def test_debug_mode_mixed_precision_and_every_honour_the_condition():
    make = lambda: keras.optimizers.SGD(0.1)  # noqa: E731
    compiled = fit(Classifier(make, only_if="bright"), digit_batches(8), epochs=1)
    eager = fit(Classifier(make, only_if="bright"), digit_batches(8), epochs=1, debug=True)
    assert eager.history["loss_updates"] == compiled.history["loss_updates"] == [18.0]
    np.testing.assert_allclose(
        eager.models["model"].get_weights()[0], compiled.models["model"].get_weights()[0],
        atol=1e-6,
    )  # fmt: skip
    mixed = fit(Classifier(make, only_if="bright"), digit_batches(8), epochs=1,
                precision="mixed_float16")  # fmt: skip
    assert mixed.history["loss_updates"] == [18.0]
    assert int(mixed.bound.optimizers["optimizer"].iterations) == 18
    # every=2: asked on steps 0, 2, 4, ... only (13 of 25), updating where it holds
    every = fit(Classifier(make, only_if="bright", every=2), digit_batches(8), epochs=1)
    assert 0 < every.history["loss_updates"][0] < 13


def test_a_group_gates_all_its_beats_and_its_condition_sees_their_losses():
    seen = []

    class TwoHeads(Classifier):
        def build_models(self, batch_spec):
            return {"model": super().build_models(batch_spec)["model"]}

        def forwards(self):
            return {"logits": lambda models, batch: {"logits": models["model"](batch["x"])}}

        def losses(self):
            def ce(outputs, batch):
                return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                    batch["y"], outputs["logits"], from_logits=True))  # fmt: skip

            return {"ce": ce, "ce_twice": lambda outputs, batch: 2.0 * ce(outputs, batch)}

        def schedule(self):
            beats = [Beat("ce", "optimizer", "model:dense*/kernel"),
                     Beat("ce_twice", "optimizer", "model:dense*/bias")]  # fmt: skip
            return Schedule(Group("logits", beats, only_if=self.both))

        def both(self, models, batch, losses):
            seen.append(sorted(losses))
            return losses["ce"] > 2.0  # until the classifier has learnt something

    result = fit(TwoHeads(lambda: keras.optimizers.SGD(0.1)), digit_batches(32), epochs=2)
    assert seen == [["ce", "ce_twice"]]  # traced once, with both beats' losses
    counts = result.history["ce_updates"]
    assert counts == result.history["ce_twice_updates"] and 0 < sum(counts) < 14


def test_a_skip_policy_passes_over_non_finite_gradients_where_the_nan_guard_would_stop():
    """A condition of the gradients skips the update of a batch of NaN pixels (their
    gradients are not finite; their loss is finite where relu maps NaN to 0, as oneDNN's
    does, and NaN where it does not, the epoch's loss figure then NaN too); a skipped
    turn is not checked, so the run goes on (without it the NaN guard raises)."""
    x, y = (digit_batches(200).get_single_element()[k].numpy() for k in ("x", "y"))
    x[8 * 9 : 8 * 10] = np.nan
    data = tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(8)

    def finite(models, batch, loss, gradients):
        return tf.math.is_finite(tf.linalg.global_norm(gradients))

    make = lambda: keras.optimizers.SGD(0.1)  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(Classifier(make, only_if=finite), data, epochs=1)
    runaway = [w for w in caught if issubclass(w.category, beatloop.RunawayLossWarning)]
    # the skipped batch's loss is in the epoch's mean: NaN where relu keeps NaN, warned of
    assert len(runaway) == int(np.isnan(result.history["loss"][0]))
    assert result.history["loss_updates"] == [24.0]
    assert all(np.all(np.isfinite(w)) for w in all_weights(result.models).values())
    clean = [b for i, b in enumerate(data) if i != 9]
    hand = hand_written_classifier(clean, 1, optimizer=make())
    assert_same_weights(all_weights(result.models), all_weights(hand))
    with pytest.raises(beatloop.NumericsError):
        fit(Classifier(make), data, epochs=1)


def test_conditions_are_printed_recorded_and_refused_clearly(tmp_path):
    beat = Beat("loss", "optimizer", "model", only_if="bright")
    assert beat.describe() == "loss: loss=loss optimizer=optimizer updates=model only_if=bright"
    assert "only_if=bright" in beatloop.EMA("a", "b", 0.9, only_if="bright").describe()
    fit(Classifier(only_if="bright"), digit_batches(32), epochs=1, run_dir=tmp_path / "r")
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert "only_if=bright" in record["schedule"][0]
    with pytest.raises(ScheduleError, match=r"only_if=dim names no method of the recipe"):
        fit(Classifier(only_if="dim"), digit_batches(32), epochs=1)
    with pytest.raises(ScheduleError, match=r"neither two, three nor four positional"):
        Beat("loss", "optimizer", "model", only_if=lambda models: True)
    with pytest.raises(ScheduleError, match=r"must be the name of a recipe method"):
        Beat("loss", "optimizer", "model", only_if=3)
    wrong = lambda models, batch: tf.reduce_mean(batch["x"], axis=1)  # noqa: E731
    with pytest.raises(ScheduleError, match=r"returned float32 of shape \(None,\)"):
        fit(Classifier(only_if=wrong), digit_batches(32), epochs=1)
    with pytest.raises(ValueError, match="set them on the Group"):
        Group("forward", [beat])
    takes_loss = lambda models, batch, loss: loss > 1  # noqa: E731
    with pytest.raises(ScheduleError, match="an update has none"):
        fit(Classifier(ema=takes_loss), digit_batches(32), epochs=1)


def test_a_condition_that_fails_names_itself_and_its_beat_and_keeps_its_cause():
    def broken(models, batch):
        raise KeyError("no such figure")

    words = "condition 'broken' of beat 'rebuild' failed"
    with pytest.raises(beatloop.UserCodeError, match=words) as caught:
        fit(Classifier(only_if=broken, name="rebuild"), digit_batches(32), epochs=1)
    assert isinstance(caught.value.__cause__, KeyError)


def test_a_condition_must_return_a_boolean_not_a_number_nor_a_python_bool():
    """An integer tensor was taken as true (a float refused); ``bool(loss > 0.05)`` got
    TensorFlow's advice about eager mode: both are refused as the step is traced,
    naming the condition, its beat and what it returned or did."""

    def as_int(models, batch):
        return tf.constant(1)

    def as_python_bool(models, batch, loss):
        return bool(loss > 0.05)

    words = r"condition '.*as_int' of beat 'rebuild' returned int32; it must return a scalar bool"
    with pytest.raises(ScheduleError, match=words):
        fit(Classifier(only_if=as_int, name="rebuild"), digit_batches(32), epochs=1)
    words = r"condition '.*as_python_bool' of beat 'loss' uses a tensor as a Python bool.*return"
    with pytest.raises(ScheduleError, match=words) as caught:
        fit(Classifier(only_if=as_python_bool), digit_batches(32), epochs=1)
    assert isinstance(caught.value.__cause__, tf.errors.OperatorNotAllowedInGraphError)
    assert fit(Classifier(only_if=lambda models, batch: True), digit_batches(32), epochs=1)


@pytest.mark.slow
def test_a_run_killed_while_a_condition_is_false_resumes_bit_identical(tmp_path):
    """The threshold GAN (threshold 1.3), 8 steps an epoch: its discriminator skips
    steps 1, 4, 8, 10 and 14. Checkpoints every 5 steps (5, 8, 10, 15, 16, ...); the
    kill right after step 14, a skipped one, loses steps 10 to 14, two of them skipped."""
    base = {"recipe": "only_if", "epochs": 3, "checkpoint_every": 5}
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    spec = {**base, "run_dir": str(killed_dir), "out": "unused", "kill_at": 15}
    killed = start_python(WORKERS / "gated_run.py", json.dumps(spec))
    try:
        full = gated_run.fit({**base, "run_dir": str(full_dir)})
    finally:
        _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    resumed = gated_run.fit({**base, "run_dir": str(killed_dir)})
    assert resumed.resumed_from is not None and resumed.steps == 24
    assert full.history["d_loss_updates"] == [6.0, 5.0, 8.0]
    assert_same_weights(all_weights(resumed.models), all_weights(full.models))
    assert history_records(killed_dir) == history_records(full_dir)
