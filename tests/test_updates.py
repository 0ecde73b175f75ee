"""Updates and acts in a schedule: an EMA or Copy target network equals a hand-written
TensorFlow loop bit for bit, binding gives written variables to their update, and only
the training step runs them."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, run_python, start_python, worker
from updates_recipe import Byol, build_byol_models, byol_data, hand_written_byol

import beatloop
from beatloop import EMA, Act, Beat, Copy, Schedule, Update
from beatloop.core.compiled.binding import bind

WORKERS = Path(__file__).parent / "workers"
updates_run = worker("updates_run")


def fit_byol(recipe, data, epochs=2, **options):
    return beatloop.fit(recipe, data=data, epochs=epochs, seed=5, progress=False, **options)


@pytest.mark.parametrize("spe", [1, 4])
def test_an_ema_target_equals_the_hand_written_loop_bit_for_bit(spe):
    data = byol_data()
    result = fit_byol(Byol("ema"), data, epochs=3, steps_per_execution=spe)
    theirs = build_byol_models()
    start = all_weights(theirs)
    hand_written_byol(theirs, data, epochs=3, seed=5)
    assert not np.array_equal(start["target/0"], all_weights(theirs)["target/0"])
    assert_same_weights(all_weights(result.models), all_weights(theirs))


def test_a_copy_every_three_steps_equals_the_hand_written_loop():
    data = byol_data()
    result = fit_byol(Byol("copy", every=3), data, steps_per_execution=4)
    theirs = build_byol_models()
    hand_written_byol(theirs, data, epochs=2, seed=5, follow="copy", every=3)
    assert_same_weights(all_weights(result.models), all_weights(theirs))
    # 8 steps, copies after steps 0, 3, 6: the target is not the online encoder now
    ours = result.models
    assert not np.array_equal(ours["target"].weights[0], ours["online"].weights[0])


def test_acts_run_in_training_only_and_evaluate_leaves_them_alone():
    data = byol_data()
    recipe = Byol("ema", act=True, every=2)
    split = beatloop.DataSplit(data, data)
    result = fit_byol(recipe, split, steps_per_execution=4)
    assert int(recipe.acted.numpy()) == 4  # steps 0, 2, 4, 6 of 8; validation ran none
    before = all_weights(result.models)
    result.evaluate(data)
    assert int(recipe.acted.numpy()) == 4
    assert_same_weights(before, all_weights(result.models))


def test_debug_mode_and_mixed_precision_run_updates():
    data = byol_data()
    eager = fit_byol(Byol("ema"), data, epochs=1, debug=True)
    theirs = build_byol_models()
    hand_written_byol(theirs, data, epochs=1, seed=5)
    np.testing.assert_allclose(
        eager.models["target"].weights[0], theirs["target"].weights[0], rtol=1e-5, atol=1e-6
    )
    mixed = fit_byol(Byol("ema"), data, epochs=1, precision="mixed_float16")
    target = mixed.models["target"].trainable_variables[0]
    assert target.dtype == "float32"
    start = build_byol_models()["target"].trainable_variables[0].numpy()
    assert np.all(np.isfinite(target.numpy())) and not np.array_equal(target.numpy(), start)


def test_a_schedule_describes_its_updates_and_acts_in_order():
    def nudge(models, batch=None):  # an update's fn(models) and an act's fn(models, batch)
        pass

    schedule = Schedule(
        [
            Beat("byol", "sgd", updates=("online", "predictor")),
            Act(nudge, name="collect", every=2),
            EMA("online", "target", 0.99),
            Update(nudge, writes="target:dense/*", every=5),
        ]
    )
    assert schedule.describe().splitlines() == [
        "1. byol: loss=byol optimizer=sgd updates=online,predictor",
        "2. collect: act fn=test_a_schedule_describes_its_updates_and_acts_in_order.<locals>"
        ".nudge every=2",
        "3. target: EMA source=online target=target decay=0.99 every=1",
        "4. nudge: update fn=test_a_schedule_describes_its_updates_and_acts_in_order.<locals>"
        ".nudge writes=target:dense/* every=5",
    ]
    assert [e.name for e in schedule.updates] == ["target", "nudge"]
    assert [e.name for e in schedule.acts] == ["collect"]
    assert [b.name for b in schedule.all_beats] == ["byol"]


def test_bad_entries_are_schedule_errors_that_say_what_to_give():
    cases = {
        "EMA(decay=...) must be a number from 0 to 1": lambda: EMA("a", "b", 1.5),
        "Update(fn=...) must be a function, got 3": lambda: Update(3),
        "give it `name=`": lambda: Act(lambda models, batch: None),
        "Copy(every=...) must be a whole number": lambda: Copy("a", "b", every=0),
        "Update(writes=...) must be a model name": lambda: Update(print, writes=[""]),
        "repeated: online": lambda: Schedule(
            [Beat("l", "o", "a", name="online"), EMA("x", "online", 0.5)]
        ),
    }
    for words, make in cases.items():
        with pytest.raises(
            beatloop.ScheduleError, match=words.replace("(", r"\(").replace(")", r"\)")
        ):
            make()


def _bind(schedule, **models):
    models = models or build_byol_models()
    losses = {"byol": lambda m, b: tf.reduce_sum(m["online"](b["x"]))}
    return bind(schedule, models, {"sgd": keras.optimizers.SGD(0.1)}, losses)


def test_binding_reports_every_update_problem_in_one_error():
    models = build_byol_models()
    models["small"] = build_byol_models(width=3)["target"]
    schedule = Schedule(
        [
            Beat("byol", "sgd", updates=("online", "predictor", "target")),
            EMA("onlin", "target", 0.99),
            Copy("online", "small", name="hard"),
            Update(print, name="writer", writes="target"),
        ],
        frozen="target",
    )
    with pytest.raises(beatloop.ScheduleError) as caught:
        _bind(schedule, **models)
    text = "\n".join(caught.value.problems)
    assert (
        "EMA 'target' (source) selects 'onlin', but there is no model 'onlin' "
        "(did you mean 'online'?)" in text
    )
    assert re.search(
        r"Copy 'hard' pairs 'online/\w+/kernel' \(8, 6\) float32 with '\w+/\w+/kernel' "
        r"\(8, 3\) float32, which differ",
        text,
    )
    assert "is declared frozen but update(s) ['target', 'writer'] write it" in text
    assert (
        "is written by beat(s) ['byol'] and update(s) ['target', 'writer'] but not declared shared"
        in text
    )


def test_an_updated_variable_is_owned_not_frozen_and_show_lists_it():
    bound = _bind(
        Schedule(
            [Beat("byol", "sgd", updates=("online", "predictor")), EMA("online", "target", 0.5)]
        )
    )
    lines = bound.describe_variables().splitlines()
    assert "target (update, writes 4 variables):" in lines
    assert [type(e).__name__ for e in bound.entries] == ["BoundGroup", "BoundUpdate"]
    with pytest.raises(beatloop.ScheduleError, match="updated by no beat and not declared frozen"):
        _bind(Schedule([Beat("byol", "sgd", updates=("online", "predictor"))]))


def test_a_schedule_without_updates_binds_to_its_groups_alone():
    bound = _bind(Schedule([Beat("byol", "sgd", updates=("online", "predictor"))], frozen="target"))
    assert bound.entries == bound.groups and bound.updates == ()


def test_an_update_that_fails_names_itself():
    def broken(models):
        raise RuntimeError("no such buffer")

    class Broken(Byol):
        def schedule(self):
            beats = super().schedule().beats
            return Schedule([*beats, Update(broken, writes=())])

    with pytest.raises(beatloop.UserCodeError, match=r"update 'broken'.*no such buffer"):
        fit_byol(Broken("ema"), byol_data(), epochs=1)


# --- in their own processes ------------------------------------------------------------------


@pytest.mark.slow
def test_an_ema_under_mirrored_strategy_equals_one_device(tmp_path):
    out = tmp_path / "mirrored.json"
    run_python(WORKERS / "updates_run.py", "mirrored", str(out))
    report = json.loads(out.read_text())
    assert report["replicas"] == 2 and report["steps"] == [8, 8]
    assert report["target_move"] > 1e-3  # the EMA moved the target on both
    assert report["max_difference"] < 1e-6  # float32 round-off of two half-batch sums


@pytest.mark.slow
@pytest.mark.parametrize("follow", ["ema", "copy"])
def test_a_run_with_updates_killed_mid_epoch_resumes_bit_identical(tmp_path, follow):
    # 96 examples in batches of 16: 6 steps an epoch; checkpoints every 4 steps; the kill
    # after the call ending at step 10 (of 12) loses the steps since the one at 8.
    spec = {"follow": follow, "every": 3, "epochs": 2, "checkpoint_every": 4}
    spec["steps_per_execution"] = 2
    worker = WORKERS / "updates_run.py"
    killed = {**spec, "run_dir": str(tmp_path / "killed"), "out": str(tmp_path / "no.npz")}
    process = start_python(worker, "resume", json.dumps({**killed, "kill_at": 10}))
    try:  # the uninterrupted run and the resume are fitted here: no process needed
        full = updates_run.fit({**spec, "run_dir": str(tmp_path / "full")})
    finally:
        _, err = process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL, err
    resumed = updates_run.fit(killed)
    assert resumed.resumed_from is not None and resumed.steps == 12
    assert_same_weights(all_weights(resumed.models), all_weights(full.models))


class ShownByol(Byol):
    """The EMA recipe with an act, as ``beatloop show`` finds it (test recipe)."""

    name = "byol_show_test"

    def __init__(self, config=None):
        super().__init__("ema", act=True)

    def default_data(self, seed):
        return beatloop.DataSplit(byol_data())


def test_show_prints_updates_and_acts_in_order_and_what_they_write(monkeypatch, capsys):
    from beatloop.cli import main
    from beatloop.plugins import registry as registry_module
    from beatloop.plugins.registry import Registry

    registry = Registry(load_entry_points=False)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    registry.register(ShownByol)
    assert main(["show", "byol_show_test"]) == 0
    out = capsys.readouterr().out
    assert (
        "  1. byol: loss=byol optimizer=sgd updates=online,predictor\n"
        "  2. target: EMA source=online target=target decay=0.9 every=1\n"
        "  3. count: act fn=Byol.count every=1\n"
    ) in out
    assert "variables each beat updates and each update writes (default models):" in out
    assert re.search(
        r"  target \(update, writes 4 variables\):\n      target/\w+/kernel \(8, 6\)", out
    )
    assert "frozen" not in out


def test_run_json_records_the_schedule_and_what_each_update_writes(tmp_path):
    fit_byol(Byol("copy", every=2), byol_data(), epochs=1, run_dir=tmp_path / "run")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["schedule"][1] == "2. target: Copy source=online target=target every=2"
    assert sorted(record["updates"]) == ["byol", "target"]
    assert len(record["updates"]["target"]) == 4
    assert all(path.startswith("target/") for path in record["updates"]["target"])
