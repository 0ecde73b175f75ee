"""The new API's edges: what an update or act writes is checked at bind, act messages
and arity, ``build_state() -> None``, a phased run's schedule, the recipe state seen by
callbacks and the result, and which steps ``every=N`` runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, run_python
from updates_recipe import Byol, build_byol_models, byol_data

import beatloop
from beatloop import Act, Beat, Schedule, Update
from beatloop.core.compiled.binding import bind

SPEC = {"x": tf.TensorSpec([None, 8], tf.float32)}


def _bind(schedule, models=None, random=None, state=None):
    models = models or build_byol_models()
    losses = {"byol": lambda m, b: tf.reduce_sum(m["predictor"](m["online"](b["x"])))}
    optimizers = {"sgd": keras.optimizers.SGD(0.1)}
    return bind(schedule, models, optimizers, losses, SPEC, random=random, state=state)


def _halve(models):
    """Assigns the target inside a tf.cond branch (found there too)."""
    kernel = models.raw("target").trainable_variables[0]
    tf.cond(tf.constant(True), lambda: kernel.assign(kernel * 0.5), lambda: kernel)


def test_an_update_assigning_outside_its_writes_is_refused_and_tracing_changes_nothing():
    beat = Beat("byol", "sgd", updates=("online", "predictor"))
    models = build_byol_models()
    before = all_weights(models)
    random = tf.random.Generator.from_seed(3)
    state_before = random.state.numpy()
    with pytest.raises(beatloop.ScheduleError) as caught:
        _bind(Schedule([beat, Update(_halve, writes=())], frozen="target"), models, random)
    assert caught.value.exit_code == 2
    (problem,) = caught.value.problems
    assert re.fullmatch(
        r"update '_halve' assigns variable 'target/dense_\d+/kernel' of model 'target', which "
        r"its writes= does not select \(an update assigns only what it writes\): add its "
        r"model, writes=\('target',\)",
        problem,
    ), problem
    assert_same_weights(all_weights(models), before)  # traced, never run
    np.testing.assert_array_equal(random.state.numpy(), state_before)
    bound = _bind(Schedule([beat, Update(_halve, writes="target")]), models)  # the advice
    assert [len(u.writes) for u in bound.updates] == [4]


def test_an_act_assigning_a_model_variable_is_refused():
    def nudge(models, batch):
        bias = models.raw("online").trainable_variables[1]

        def body(i):
            bias.assign_add(tf.reduce_mean(batch["x"]) * tf.ones_like(bias))
            return i + 1

        tf.while_loop(lambda i: i < 2, body, [tf.constant(0)])  # found in a loop body too

    beat = Beat("byol", "sgd", updates=("online", "predictor"))
    with pytest.raises(beatloop.ScheduleError) as caught:
        _bind(Schedule([Act(nudge), beat], frozen="target"))
    (problem,) = caught.value.problems
    assert re.fullmatch(
        r"act 'nudge' assigns variable 'online/dense_\d+/bias' of model 'online': acts write "
        r"recipe state only \(models.state\); assign model variables in an Update with "
        r"writes=, e.g. Update\(fn, writes=\('online',\)\)",
        problem,
    ), problem
    counted = {"n": tf.Variable(0, trainable=False)}
    count = Act(lambda models, batch: models.state["n"].assign_add(1), name="count")
    bound = _bind(Schedule([count, beat], frozen="target"), state=counted)  # state: fine
    assert int(counted["n"].numpy()) == 0 and bound.updates[0].name == "count"


def test_act_messages_say_act_and_an_acts_arity_is_checked_when_made():
    def act_one_arg(models):
        pass

    with pytest.raises(beatloop.ScheduleError) as caught:
        Act(act_one_arg)
    assert caught.value.exit_code == 2
    assert list(caught.value.problems) == [
        "Act(fn=...) must be a function fn(models, batch), got "
        "test_act_messages_say_act_and_an_acts_arity_is_checked_when_made.<locals>.act_one_arg, "
        "whose signature (models) cannot take 2 positional arguments"
    ]
    with pytest.raises(beatloop.ScheduleError, match=r"a lambda has no name of its own\): give"):
        Update(lambda models: None)

    def broken(models, batch):
        raise RuntimeError("no environment")

    class Broken(Byol):
        def schedule(self):
            return Schedule([*super().schedule().beats, Act(broken, name="collect")])

    with pytest.raises(beatloop.UserCodeError) as failed:
        beatloop.fit(Broken("ema"), data=byol_data(), epochs=1, seed=5, progress=False)
    first = str(failed.value).splitlines()[0]
    assert first == (
        "recipe 'byol_test': act 'collect', function 'broken' failed: RuntimeError: no environment"
    ), first
    assert isinstance(failed.value.__cause__, RuntimeError)


class Marks(Byol):
    """Byol with two acts writing recipe state: ``mark`` (every 3 steps) records the
    step number ``tick`` (every step, after it) counts in ``clock``."""

    name = "marks_test"

    def build_state(self):
        return {
            "clock": tf.Variable(0, dtype=tf.int64, trainable=False),
            "hits": tf.Variable(0, dtype=tf.int64, trainable=False),
            "marks": tf.Variable(tf.fill([8], tf.constant(-1, tf.int64)), trainable=False),
        }

    def mark(self, models, batch):
        state = models.state
        state["marks"].scatter_nd_update(state["hits"][None, None], state["clock"][None])
        state["hits"].assign_add(1)

    def tick(self, models, batch):
        models.state["clock"].assign_add(1)

    def schedule(self):
        acts = [Act(self.mark, every=3), Act(self.tick)]
        return Schedule([*acts, *super().schedule().beats])


def test_build_state_returning_none_means_no_recipe_state():
    class NoState(Byol):
        def build_state(self):
            return None

    result = beatloop.fit(NoState("ema"), data=byol_data(), epochs=1, seed=5, progress=False)
    assert result.steps == 4 and result.state == {} and result.bound.state == {}


def test_a_phased_runs_schedule_describes_every_phase():
    from phased_recipe import PretrainThenProbe

    result = beatloop.fit(PretrainThenProbe(), epochs=2, seed=0, progress=False)
    assert isinstance(result.schedule, beatloop.Phases)
    assert result.schedule.describe().splitlines() == [
        "phase pretrain (epochs 1-2):",
        "  1. reconstruction: loss=reconstruction optimizer=pretrain updates=encoder,decoder",
        "  frozen: probe",
        "phase probe (epochs 3 on):",
        "  1. probe: loss=probe optimizer=probe updates=probe",
        "  frozen: encoder, decoder",
    ]


def test_callbacks_read_the_recipe_state_and_the_result_holds_it():
    seen = []

    class Watch(beatloop.Callback):
        def on_epoch_end(self, run, epoch, logs):
            seen.append((int(run.recipe_state["clock"]), int(run.state.step), run.step))

    result = beatloop.fit(
        Marks("ema"), data=byol_data(), epochs=2, seed=5, progress=False, callbacks=[Watch()]
    )
    assert seen == [(4, 4, 4), (8, 8, 8)]  # 4 batches an epoch; run.state: the counters
    assert int(result.state["clock"]) == 8 and result.state["marks"].dtype == np.int64


def test_every_n_runs_steps_0_n_2n_counted_over_the_run_across_epochs_and_resume(tmp_path):
    options = {"data": byol_data(), "seed": 5, "progress": False, "run_dir": tmp_path / "r"}
    first = beatloop.fit(Marks("ema"), epochs=1, steps_per_execution=3, **options)
    assert first.state["marks"].tolist() == [0, 3, -1, -1, -1, -1, -1, -1]
    more = beatloop.fit(Marks("ema"), epochs=3, steps_per_execution=3, **options)
    assert more.resumed_from is not None and more.steps == 12
    assert more.state["marks"].tolist() == [0, 3, 6, 9, -1, -1, -1, -1]
    whole = beatloop.fit(Marks("ema"), epochs=3, **{**options, "run_dir": tmp_path / "w"})
    assert whole.state["marks"].tolist() == more.state["marks"].tolist()


@pytest.mark.slow
def test_writes_are_checked_under_a_mirrored_strategy(tmp_path):
    out = tmp_path / "writes.json"
    run_python(Path(__file__).parent / "workers" / "writes_run.py", str(out))
    report = json.loads(out.read_text())
    assert report["counted"] == 4  # an act writing recipe state: one agent, 4 steps
    (halving,) = report["halving_writes_test"]
    assert re.match(r"update 'halve' assigns variable 'target/dense_\d+/kernel' of model", halving)
    (poking,) = report["poking_writes_test"]
    assert re.match(r"act 'poke' assigns variable 'online/dense_\d+/bias' of model", poking)
