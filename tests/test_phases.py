"""Phases: a recipe whose schedule changes at epoch boundaries. Pretraining an encoder and
decoder for 2 epochs, then a linear probe on the frozen encoder for 2, ends bit-identical
to a hand-written loop and resumes bit-identical after a SIGKILL in either phase; every
phase is bound before the first step, its errors naming it; ``show``, ``run.json`` and the
history show each phase."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import attrs
import keras
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, history_records, start_python, worker
from phased_recipe import PretrainThenProbe, data, models, probe, reconstruction

import beatloop
from beatloop.cli import main
from beatloop.core.data.batches import DataSplit
from beatloop.core.running.engine import Engine
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry

WORKER = Path(__file__).parent / "workers" / "phased_run.py"
phased_run = worker("phased_run")
STEPS_PER_EPOCH = 5  # 160 digits in batches of 32


def schedule(beat: beatloop.Beat, frozen=()) -> beatloop.Schedule:
    return beatloop.Schedule(beat, frozen=frozen)


PRETRAIN = beatloop.Beat("reconstruction", "pretrain", updates=("encoder", "decoder"))
PROBE = beatloop.Beat("probe", "probe", updates="probe")


def hand_written(pretrain_epochs: int, probe_epochs: int) -> dict:
    """The two phases as a plain TensorFlow loop: a ``tf.function`` step per phase
    (``GradientTape``, ``apply``) traced for the data's spec, the same initial weights,
    optimizers and data order; op determinism on, as a seeded run has it."""
    tf.config.experimental.enable_op_determinism()
    trained = models(0)
    train, _ = data()
    optimizers = {"pretrain": keras.optimizers.Adam(1e-2), "probe": keras.optimizers.Adam(1e-2)}
    encoder, decoder, head = (trained[name] for name in ("encoder", "decoder", "probe"))
    variables = {
        "pretrain": [*encoder.trainable_variables, *decoder.trainable_variables],
        "probe": list(head.trainable_variables),
    }
    for name, optimizer in optimizers.items():
        optimizer.build(variables[name])

    def step(loss_fn, name):
        @tf.function(input_signature=[train.element_spec])
        def run(batch):
            with tf.GradientTape() as tape:
                loss = loss_fn(trained, batch)
            optimizers[name].apply(tape.gradient(loss, variables[name]), variables[name])

        return run

    pretrain, probing = step(reconstruction, "pretrain"), step(probe, "probe")
    for epoch in range(pretrain_epochs + probe_epochs):
        for batch in train:
            (pretrain if epoch < pretrain_epochs else probing)(batch)
    return all_weights(trained)


@pytest.fixture(scope="module")
def two_phases(tmp_path_factory):
    """Two epochs of pretraining, two of probing, checkpointed in a run dir."""
    run_dir = tmp_path_factory.mktemp("phases") / "run"
    result = beatloop.fit(
        PretrainThenProbe, epochs=4, seed=0, steps_per_execution=3, run_dir=run_dir,
        progress=False,
    )  # fmt: skip
    return result, run_dir


def test_two_phases_equal_a_hand_written_loop_bit_for_bit(two_phases):
    result, _ = two_phases
    assert_same_weights(all_weights(result.models), hand_written(2, 2))


def test_the_history_has_each_phases_figures(two_phases):
    result, run_dir = two_phases
    history = result.history
    assert len(history["reconstruction"]) == len(history["val_reconstruction"]) == 2
    assert len(history["probe"]) == len(history["val_probe"]) == 2
    records = history_records(run_dir)
    assert ["reconstruction" in r for r in records] == [True, True, False, False]
    assert ["val_probe" in r for r in records] == [False, False, True, True]
    assert history["reconstruction"][1] < history["reconstruction"][0]  # it learned
    assert [r["probe"] for r in records[2:]] == history["probe"]


def test_run_json_records_the_phases(two_phases):
    _, run_dir = two_phases
    stored = json.loads((run_dir / "run.json").read_text())
    assert stored["schedule"] == [
        "phase pretrain (epochs 1-2):",
        "  1. reconstruction: loss=reconstruction optimizer=pretrain updates=encoder,decoder",
        "  frozen: probe",
        "phase probe (epochs 3 on):",
        "  1. probe: loss=probe optimizer=probe updates=probe",
        "  frozen: encoder, decoder",
    ]
    assert sorted(stored["updates"]) == ["probe", "reconstruction"]


def test_a_resume_with_other_phases_is_refused(two_phases):
    class LongerPretraining(PretrainThenProbe):  # the same recipe name and config
        def schedule(self):
            first, second = super().schedule().phases
            return beatloop.Phases(attrs.evolve(first, epochs=3), second)

    _, run_dir = two_phases
    with pytest.raises(beatloop.CheckpointError, match=r"the schedule differs.*epochs 1-3"):
        beatloop.fit(LongerPretraining, epochs=5, seed=0, run_dir=run_dir, progress=False)


def test_evaluate_after_the_run_uses_the_last_phases_schedule(two_phases):
    result, _ = two_phases
    figures = result.evaluate()
    assert sorted(figures) == ["probe"]
    assert figures["probe"] == result.history["val_probe"][-1]


def test_every_phases_binding_error_names_its_phase_before_training():
    class Broken(PretrainThenProbe):
        name = "broken_phases_test"

        def schedule(self):
            return beatloop.Phases(
                beatloop.Phase("pretrain", schedule(PRETRAIN), epochs=1),  # probe not frozen
                beatloop.Phase("probe", schedule(PROBE, frozen="encoder")),  # decoder not
            )

    with pytest.raises(beatloop.ScheduleError) as raised:
        beatloop.fit(Broken, epochs=2, seed=0, progress=False)
    problems = raised.value.problems
    assert len(problems) == 4  # the probe's kernel and bias; the decoder's kernel and bias
    assert all(p.startswith("phase 'pretrain': variable") for p in problems[:2])
    assert all(p.startswith("phase 'probe': variable") for p in problems[2:])
    assert "of model 'decoder' is updated by no beat" in problems[2]


def test_a_phases_missing_gradient_is_named_by_its_phase_when_its_loop_is_traced():
    def detached_probe(models, batch):
        return (
            probe(models, {**batch, "x": tf.stop_gradient(batch["x"])})
            + tf.reduce_sum(tf.stop_gradient(models["decoder"](models["encoder"](batch["x"]))))
            * 0.0
        )

    class Detached(PretrainThenProbe):
        name = "detached_phases_test"

        def schedule(self):
            probing = schedule(
                beatloop.Beat("detached", "probe", updates=("probe", "decoder")),
                frozen="encoder",
            )
            return beatloop.Phases(
                beatloop.Phase("pretrain", schedule(PRETRAIN, frozen="probe"), epochs=1),
                beatloop.Phase("probe", probing),
            )

        def losses(self):
            return {**super().losses(), "detached": detached_probe}

    with pytest.raises(beatloop.ScheduleError) as raised:
        beatloop.fit(Detached, epochs=2, seed=0, progress=False)
    problems = raised.value.problems
    assert len(problems) == 2  # the decoder's kernel and bias, in phase 'probe' only
    for problem, weight in zip(problems, ("kernel", "bias"), strict=True):
        assert re.fullmatch(
            rf"phase 'probe': beat 'detached' claims variable '\w+/\w+/{weight}', but its "
            r"loss 'detached' gives it no gradient \(is the model called inside the loss, on "
            r"a path connected to the result\?\)",
            problem,
        )
    # An engine built not to train (evaluate's) checks each phase's loop at its first call.
    engine = Engine(Detached(), DataSplit(*data()), trains=False)
    with pytest.raises(beatloop.ScheduleError) as lazily:
        engine.fit(2)
    assert lazily.value.problems == problems
    assert int(engine.counters.epoch) == 1  # the first phase trained; the second is refused


class WarmUpThenFineTune(PretrainThenProbe):
    """The probe warms up on the frozen encoder (optimizer ``probe``), then encoder and
    probe are fine-tuned together (optimizer ``pretrain``, built once for both phases)."""

    name = "warm_up_then_fine_tune_test"

    def schedule(self):
        warm = schedule(PROBE, frozen=("encoder", "decoder"))
        both = schedule(
            beatloop.Beat("probe", "pretrain", updates=("encoder", "probe")), frozen="decoder"
        )
        return beatloop.Phases(
            beatloop.Phase("warm_up", warm, epochs=1), beatloop.Phase("fine_tune", both)
        )


class SeenOptimizers(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_begin(self, epoch, logs=None):
        self.seen.append(self.model.optimizer)


def test_a_variable_frozen_in_one_phase_is_trained_in_the_next():
    keras.utils.set_random_seed(0)
    before = all_weights(models(0))
    seen = SeenOptimizers()
    result = beatloop.fit(
        WarmUpThenFineTune, epochs=3, seed=0, steps_per_epoch=2, progress=False,
        callbacks=[beatloop.keras_callback(seen, model="probe")],
    )  # fmt: skip
    after = all_weights(result.models)
    assert not (before["encoder/0"] == after["encoder/0"]).all()
    assert (before["decoder/0"] == after["decoder/0"]).all()
    assert len(result.history["probe"]) == 3  # one figure for the beat of both phases
    # A Keras callback sees the optimizer of the phase it is in.
    optimizers = result.optimizers
    assert seen.seen == [optimizers["probe"], optimizers["pretrain"], optimizers["pretrain"]]


def test_the_divergence_guard_watches_every_phase_and_resumes(tmp_path):
    """Each phase's beats have their own window; all are checkpointed, so a run
    continued into the second phase ends as one that never stopped."""
    options = {"seed": 0, "divergence": 50.0, "divergence_window": 4, "progress": False}
    whole = beatloop.fit(PretrainThenProbe, epochs=3, **options)
    beatloop.fit(PretrainThenProbe, epochs=2, run_dir=tmp_path / "run", **options)
    continued = beatloop.fit(PretrainThenProbe, epochs=3, run_dir=tmp_path / "run", **options)
    assert continued.resumed_from is not None
    assert_same_weights(all_weights(continued.models), all_weights(whole.models))
    assert continued.history == whole.history


def test_the_nan_guard_names_the_beat_of_the_phase_that_faulted():
    class NanProbe(PretrainThenProbe):
        name = "nan_probe_test"

        def losses(self):
            return {**super().losses(), "probe": lambda m, b: probe(m, b) * float("nan")}

    with pytest.raises(
        beatloop.NumericsError, match=r"beat 'probe' .* at step 11 \(epoch 3\)"
    ) as raised:
        beatloop.fit(NanProbe, epochs=4, seed=0, steps_per_execution=1, progress=False)
    assert "reconstruction" not in str(raised.value)


def test_a_run_longer_than_fixed_phases_is_refused():
    with pytest.raises(beatloop.ConfigError, match=r"cover 3 epoch\(s\).*epochs=4"):
        beatloop.fit(
            PretrainThenProbe, config={"probe_epochs": 1, "pretrain_epochs": 2}, epochs=4,
            seed=0, progress=False,
        )  # fmt: skip


def test_phases_are_checked_as_values():
    one = schedule(PROBE)
    with pytest.raises(beatloop.ScheduleError, match="only the last phase may have"):
        beatloop.Phases(beatloop.Phase("a", one), beatloop.Phase("b", one))
    with pytest.raises(beatloop.ScheduleError, match="repeated: a"):
        beatloop.Phases(beatloop.Phase("a", one, epochs=1), beatloop.Phase("a", one))
    with pytest.raises(beatloop.ScheduleError, match=r"needs a beatloop\.Schedule, got Beat"):
        beatloop.Phase("a", PROBE)
    with pytest.raises(beatloop.ConfigError, match=r"integer >= 1.*got 0"):
        beatloop.Phase("a", one, epochs=0)
    with pytest.raises(beatloop.ScheduleError, match="holds Phase values, got Schedule"):
        beatloop.Phases(one)
    phases = beatloop.Phases(
        beatloop.Phase("a", one, epochs=2), beatloop.Phase("b", one, epochs=1),
        beatloop.Phase("c", one),
    )  # fmt: skip
    assert [phases.index_at(epoch) for epoch in range(6)] == [0, 0, 1, 2, 2, 2]
    assert [phases.span(i) for i in range(3)] == ["epochs 1-2", "epoch 3", "epochs 4 on"]


def test_show_prints_each_phases_schedule_and_variables(monkeypatch, capsys):
    registry = Registry(load_entry_points=False)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    registry.register(PretrainThenProbe)
    assert main(["show", PretrainThenProbe.name, "--set", "pretrain_epochs=3"]) == 0
    out = capsys.readouterr().out
    assert (
        "schedule (one step of each phase):\n"
        "  phase pretrain (epochs 1-3):\n"
        "    1. reconstruction: loss=reconstruction optimizer=pretrain updates=encoder,decoder\n"
        "    frozen: probe\n"
        "  phase probe (epochs 4 on):\n"
    ) in out
    variables = out.split("variables each beat updates (default models):\n")[1]
    assert variables.startswith("  phase pretrain (epochs 1-3):\n    reconstruction (4 variables):")
    assert "  phase probe (epochs 4 on):\n    probe (2 variables):" in variables


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [7, 13], ids=["in-pretrain", "in-probe"])
def test_a_run_killed_in_a_phase_resumes_bit_identical(tmp_path, kill_at):
    """Checkpoints every 3 steps (and at each epoch's end): the kill at step 7 (epoch 2,
    pretraining) or 13 (epoch 3, probing) loses a step or two of that phase."""

    def start(run_dir: Path, out: str, **more):
        spec = {"epochs": 4, "checkpoint_every": 3, "run_dir": str(run_dir), "out": out}
        return start_python(WORKER, json.dumps({**spec, **more}))

    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    killed = start(killed_dir, "unused", kill_at=kill_at)
    spec = {"epochs": 4, "checkpoint_every": 3}
    try:  # the uninterrupted run and the resume are fitted here: no process needed
        full = phased_run.fit({**spec, "run_dir": str(full_dir)})
    finally:
        _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    assert len(history_records(killed_dir)) == kill_at // STEPS_PER_EPOCH

    resumed = phased_run.fit({**spec, "run_dir": str(killed_dir)})
    assert resumed.steps == 4 * STEPS_PER_EPOCH
    assert_same_weights(all_weights(resumed.models), all_weights(full.models))
    assert history_records(killed_dir) == history_records(full_dir)
