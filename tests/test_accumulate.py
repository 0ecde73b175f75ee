"""Gradient accumulation (``accumulate=N``): N batches' gradients, weighted by their rows,
applied once, equal one update on the N batches together (to float32 round-off) and a
hand-written accumulation loop (bit for bit), for SGD, Adam, AdamW with weight decay, a
learning-rate schedule, a clip and mixed precision; a partial sum at an epoch's end is
applied then; the sums survive a SIGKILL."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import attrs
import keras
import numpy as np
import pytest
from gated_recipes import (
    Classifier,
    ThresholdGan,
    digit_batches,
    hand_written_classifier,
    hand_written_threshold_gan,
)
from helpers import (
    all_weights,
    assert_same_weights,
    finish_all,
    gan_data,
    history_records,
    largest_difference,
    load_npz,
    run_python,
    start_python,
    worker,
)

import beatloop
from beatloop.cli.workers import free_ports

WORKERS = Path(__file__).parent / "workers"
gated_run = worker("gated_run")

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "adam": lambda: keras.optimizers.Adam(1e-3),
    "adamw": lambda: keras.optimizers.AdamW(1e-3, weight_decay=0.05),
    "schedule": lambda: keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=5, decay_rate=0.5)
    ),
}


def fit(recipe, data, epochs=4, **options):
    options = {"seed": 0, "progress": False, "steps_per_execution": 1, **options}
    return beatloop.fit(recipe, data=data, epochs=epochs, **options)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_four_batches_of_8_equal_one_of_32_and_the_hand_written_loop(name):
    """200 rows: 25 batches of 8 make 7 updates an epoch (6 of four batches, one of the
    last batch alone), as 7 batches of 32 (the last of 8 rows) do; 28 updates in all."""
    make = OPTIMIZERS[name]
    big = fit(Classifier(make), digit_batches(32))
    accumulated = fit(Classifier(make, accumulate=4), digit_batches(8))
    ours, theirs = all_weights(accumulated.models), all_weights(big.models)
    start = all_weights({"model": Classifier(make).build_models(None)["model"]})
    assert largest_difference(theirs, start) > 1e-2  # training moved the weights
    assert largest_difference(ours, theirs) <= 1e-6
    assert accumulated.history["loss_updates"] == [7.0] * 4
    assert int(accumulated.bound.optimizers["optimizer"].iterations) == 28
    hand = hand_written_classifier(digit_batches(8), 4, optimizer=make(), accumulate=4)
    assert_same_weights(ours, all_weights(hand))
    # the figures are the batches' own: the mean of every micro-batch's loss, by rows
    assert accumulated.history["loss"][0] == pytest.approx(big.history["loss"][0], rel=1e-2)


def test_the_clip_sees_the_accumulated_gradient_and_any_k_gives_the_same_run():
    clip = beatloop.ClipByGlobalNorm(0.05)
    make = OPTIMIZERS["sgd"]
    recipe = Classifier(make, accumulate=4, transform=clip)
    ours = all_weights(fit(recipe, digit_batches(8), epochs=2, steps_per_execution=8).models)
    big = fit(Classifier(make, transform=clip), digit_batches(32), epochs=2)
    assert largest_difference(ours, all_weights(big.models)) <= 1e-6
    hand = hand_written_classifier(
        digit_batches(8), 2, optimizer=make(), accumulate=4, transform=clip
    )
    assert_same_weights(ours, all_weights(hand))
    one_step = fit(Classifier(make, accumulate=4, transform=clip), digit_batches(8), epochs=2)
    assert_same_weights(ours, all_weights(one_step.models))
    # clipping each micro-batch's gradient instead would not be the same run
    unclipped = fit(Classifier(make, accumulate=4), digit_batches(8), epochs=2)
    assert largest_difference(ours, all_weights(unclipped.models)) > 1e-3


def test_a_gan_accumulating_on_its_discriminator_only_equals_the_hand_written_loop():
    """The discriminator sums 3 steps' gradients (8 steps an epoch: updates after steps
    3, 6 and the epoch's last two); the generator updates every step."""
    data = gan_data(128, 16)
    result = fit(ThresholdGan(accumulate=3, only_if=None), data, epochs=2, seed=5)
    theirs, updates = hand_written_threshold_gan(data, 2, seed=5, threshold=None, accumulate=3)
    assert updates == 6 and result.history["d_loss_updates"] == [3.0, 3.0]
    assert int(result.bound.optimizers["g_opt"].iterations) == 16
    assert_same_weights(all_weights(result.models), all_weights(theirs))


def test_mixed_precision_scales_the_sum_once():
    make = OPTIMIZERS["adam"]
    accumulated = fit(
        Classifier(make, accumulate=4), digit_batches(8), epochs=2, precision="mixed_float16"
    )
    big = fit(Classifier(make), digit_batches(32), epochs=2, precision="mixed_float16")
    optimizer = accumulated.bound.optimizers["optimizer"]
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    assert int(optimizer.iterations) == 14  # one apply (one unscale) per update
    # float16 activations: a batch's rows are computed alike whatever the batch size
    assert largest_difference(all_weights(accumulated.models), all_weights(big.models)) < 1e-3


def test_debug_mode_accumulates_alike():
    make = OPTIMIZERS["adamw"]
    eager = fit(Classifier(make, accumulate=4), digit_batches(8), epochs=1, debug=True)
    compiled = fit(Classifier(make, accumulate=4), digit_batches(8), epochs=1)
    np.testing.assert_allclose(
        eager.models["model"].get_weights()[0], compiled.models["model"].get_weights()[0],
        atol=1e-6,
    )  # fmt: skip
    assert eager.history["loss_updates"] == [7.0]


def test_the_nan_guard_rolls_back_the_sums_with_the_weights(tmp_path):
    """A NaN batch in the middle of an accumulation: the rollback restores the last
    checkpoint (weights, optimizer and the partial sums) and skips that batch."""
    x = np.concatenate([digit_batches(200).get_single_element()["x"].numpy()])
    y = digit_batches(200).get_single_element()["y"].numpy()
    poisoned = x.copy()
    poisoned[8 * 9 : 8 * 10] = np.nan  # batch 9: the second of an accumulation
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices({"x": poisoned, "y": y}).batch(8)
    with pytest.warns(RuntimeWarning, match="rollback"):
        result = fit(
            Classifier(OPTIMIZERS["sgd"], accumulate=4), data, epochs=1, on_nan="rollback",
            run_dir=tmp_path / "run", checkpoint_every=4,
        )  # fmt: skip
    weights = all_weights(result.models)
    assert all(np.all(np.isfinite(w)) for w in weights.values())
    # batches 0-7 (two updates), the rollback to step 8, batch 9 skipped; 24 batches
    assert result.history["loss_updates"] == [6.0]


def test_show_and_the_run_record_state_accumulate(tmp_path):
    result = fit(Classifier(OPTIMIZERS["sgd"], accumulate=4), digit_batches(8), epochs=1,
                 run_dir=tmp_path / "run")  # fmt: skip
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert any("accumulate=4" in line for line in record["schedule"])
    assert result.history["loss_updates"] == [7.0]
    beat = beatloop.Beat("loss", "optimizer", "model", accumulate=4)
    assert beat.describe() == "loss: loss=loss optimizer=optimizer updates=model accumulate=4"
    assert beat != beatloop.Beat("loss", "optimizer", "model", accumulate=2)


def test_the_supervised_recipe_accumulates_from_its_config():
    config = {"accumulate": 4, "batch_size": 8}
    recipe = beatloop.make_recipe("supervised", config)
    assert "accumulate=4" in recipe.schedule().describe()
    with pytest.raises(beatloop.ConfigError, match="accumulate"):
        beatloop.make_recipe("supervised", {"accumulate": 0})


def test_accumulate_is_refused_inside_a_group_and_must_be_a_positive_count():
    with pytest.raises(ValueError, match="accumulate"):
        beatloop.Beat("loss", "optimizer", "model", accumulate=0)
    beat = beatloop.Beat("loss", "optimizer", "model", accumulate=2)
    with pytest.raises(ValueError, match="set them on the Group"):
        beatloop.Group("forward", [beat])


def test_repeat_with_accumulate_is_refused_on_a_beat_and_a_group():
    """Their turns would all see the same weights: repeat=2, accumulate=2 summed one
    batch twice into one plain update a step, silently cancelling the repeat."""
    words = r"beat 'loss' sets repeat=2 with accumulate=2, which do not combine"
    with pytest.raises(beatloop.ScheduleError, match=words):
        beatloop.Beat("loss", "optimizer", "model", repeat=2, accumulate=2)
    beat = beatloop.Beat("loss", "optimizer", "model")
    with pytest.raises(beatloop.ScheduleError, match=r"group 'forward' sets repeat=3 with acc"):
        beatloop.Group("forward", [beat], repeat=3, accumulate=4)


def test_an_accumulation_larger_than_the_epoch_is_warned_of_once_naming_both_numbers():
    """7 steps an epoch: accumulate=10 makes one update an epoch, of 7 batches (each
    epoch's end applies the partial sum); with every=2 the beat has 4 turns."""
    words = r"beat 'loss' has accumulate=10, more than the 7 turns epoch 1 gave it"
    with pytest.warns(beatloop.IgnoredSettingWarning, match=words) as caught:
        result = fit(Classifier(accumulate=10), digit_batches(32), epochs=2)
    assert len(caught) == 1 and "of 7 batches; give accumulate=7 or less" in str(caught[0].message)
    assert result.history["loss_updates"] == [1.0, 1.0]
    with pytest.warns(beatloop.IgnoredSettingWarning, match=r"more than the 4 turns epoch 1"):
        fit(Classifier(accumulate=10, every=2), digit_batches(32), epochs=1)
    fit(Classifier(accumulate=7), digit_batches(32), epochs=1)  # one full sum: no warning


@pytest.mark.slow
def test_a_run_killed_in_the_middle_of_an_accumulation_resumes_bit_identical(tmp_path):
    """25 steps an epoch, an update every 4 and one at the epoch's end; checkpoints
    every 6 steps (6, 12, 18, 24, 25, 30, ...). The kill after step 33 resumes from step
    30: five turns into the second epoch, one into its second accumulation."""
    base = {"recipe": "accumulate", "epochs": 2, "checkpoint_every": 6}
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    spec = {**base, "run_dir": str(killed_dir), "out": "unused", "kill_at": 33}
    killed = start_python(WORKERS / "gated_run.py", json.dumps(spec))
    try:
        full = gated_run.fit({**base, "run_dir": str(full_dir)})
    finally:
        _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    resumed = gated_run.fit({**base, "run_dir": str(killed_dir)})
    assert resumed.resumed_from is not None and resumed.steps == 50
    assert_same_weights(all_weights(resumed.models), all_weights(full.models))
    assert history_records(killed_dir) == history_records(full_dir)


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory) -> tuple[dict, dict]:
    """``workers/gated_mirrored.py``'s report, and its one-device run of
    ``only_if_accumulate_clip`` (weights and ``updates``): the multi-worker test's
    reference, fitted once for both tests."""
    out = tmp_path_factory.mktemp("gated") / "mirrored.json"
    run_python(WORKERS / "gated_mirrored.py", out)
    return json.loads(out.read_text()), load_npz(out.with_suffix(".npz"))


@pytest.mark.slow
def test_accumulation_and_conditions_on_two_replicas_equal_one_device(mirrored):
    """MirroredStrategy over two logical CPUs (``workers/gated_mirrored.py``)."""
    report = mirrored[0]
    assert report["replicas"] == 2
    for name, figures in report["runs"].items():
        assert figures["moved"] > 1e-2, name
        assert figures["max_difference"] < 1e-6, name
        assert figures["updates_one"] == figures["updates_two"], name
    assert 0 < report["runs"]["only_if"]["updates_one"][0] < 25


def test_a_phase_accumulates_and_show_prints_it(capsys):
    """The probe phase of a recipe in phases sums 2 of its 5 batches an epoch: 3
    updates an epoch (2, 2 and the last batch alone); the pretraining phase counts none."""
    from phased_recipe import PretrainThenProbe

    from beatloop.cli import main

    class Accumulating(PretrainThenProbe):
        name = "pretrain_then_accumulate_test"

        def schedule(self):
            phases = super().schedule()
            probe = phases.phases[1]
            beat = attrs.evolve(probe.schedule.beats[0], accumulate=2)
            schedule = attrs.evolve(probe.schedule, beats=(beat,))
            return beatloop.Phases(phases.phases[0], attrs.evolve(probe, schedule=schedule))

    result = beatloop.fit(Accumulating, epochs=4, seed=0, progress=False,
                          config={"pretrain_epochs": 2})  # fmt: skip
    assert result.history["probe_updates"][-2:] == [3.0, 3.0]
    assert int(result.bound.optimizers["probe"].iterations) == 6
    assert main(["show", "supervised", "--set", "accumulate=4"]) == 0
    assert "1. loss: loss=loss optimizer=optimizer updates=model accumulate=4" in (
        capsys.readouterr().out
    )


@pytest.mark.slow
def test_a_condition_and_accumulation_on_two_worker_processes_equal_one_device(tmp_path, mirrored):
    """MultiWorkerMirroredStrategy, two processes on 127.0.0.1: the condition (of the
    global batch) agreed by both workers, the sums summed over them; against the same
    run on one device (fitted by the mirrored worker: ``gated_mirrored.worker_run``)."""
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    outputs = [tmp_path / f"worker{i}.npz" for i in range(2)]
    configs = [{"cluster": cluster, "task": {"type": "worker", "index": i}} for i in range(2)]
    script = WORKERS / "gated_mirrored.py"
    processes = [
        start_python(script, "--worker", out, TF_CONFIG=json.dumps(config))
        for out, config in zip(outputs, configs, strict=True)
    ]
    finish_all(processes, timeout=240)
    first, second = (load_npz(path) for path in outputs)
    single = dict(mirrored[1])
    assert list(first.pop("updates")) == list(single.pop("updates")) == [6.0, 6.0]
    second.pop("updates")
    assert_same_weights(first, second)
    assert largest_difference(first, single) < 1e-6
