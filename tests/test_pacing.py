"""steps_per_execution="auto": how K is chosen (on timings given to it), and that a run
under "auto" trains exactly as K=1 does, resumes across a change of K, records the K
chosen, and lets a callback ask for one step per call."""

import json
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import all_weights, assert_same_weights, python_env

import beatloop
from beatloop import Callback, ConfigError
from beatloop.core.running.pacing import AUTO_CEILING, AutoPace, AutoTargets, pace_for


def timed(pace: AutoPace, per_call: float, per_step: float, calls: int = 200) -> list[int]:
    """Feed ``pace`` calls taking ``per_call + K * per_step`` seconds until it settles;
    return the K of each call."""
    seen = []
    for _ in range(calls):
        if pace.settled:
            break
        seen.append(pace.steps)
        pace.observe(pace.steps, pace.steps, per_call + pace.steps * per_step)
    return seen


def test_auto_settles_where_the_per_call_overhead_is_under_two_percent():
    pace = AutoPace()
    seen = timed(pace, per_call=1e-3, per_step=1e-4)
    # overhead/(overhead + K*step) < 2% needs K >= 490: the next power of two is 512.
    assert pace.settled and pace.steps == 512
    per_call, per_step = pace.overhead()
    assert per_call == pytest.approx(1e-3) and per_step == pytest.approx(1e-4)
    assert seen[:4] == [1] * 4  # the one-step function's first call, then 3 timed
    assert sorted(set(seen)) == [1, 2, 4, 8, 512]  # doubles, then jumps to the fit's K


def test_auto_counts_the_last_shorter_call_of_an_epoch_of_known_length():
    """184 steps an epoch, 0.8 ms a call, 0.4 ms a step: K=128 keeps one call's overhead
    under 2% of the call, but its epoch takes two calls (2.1% of the epoch); K=256 takes
    one. With no epoch length known, 128 is chosen."""
    alone = AutoPace()
    timed(alone, per_call=0.8e-3, per_step=0.4e-3)
    assert alone.steps == 128
    epoch = pace_for("auto", epoch_steps=184)
    timed(epoch, per_call=0.8e-3, per_step=0.4e-3)
    assert epoch.settled and epoch.steps == 256
    divides = pace_for("auto", epoch_steps=256)  # two calls of 128 and one of 256 alike
    timed(divides, per_call=0.8e-3, per_step=0.4e-3)
    assert divides.steps == 128


def test_auto_keeps_calls_under_a_quarter_second():
    pace = AutoPace()
    timed(pace, per_call=5e-3, per_step=10e-3)  # the overhead asks for K=32: 0.325 s
    assert pace.steps == 16
    slow = AutoPace()
    timed(slow, per_call=1e-3, per_step=0.4)  # one step is already longer
    assert slow.steps == 1


def test_auto_stays_small_when_the_step_dwarfs_the_overhead():
    pace = AutoPace()
    timed(pace, per_call=1e-5, per_step=5e-3)
    assert pace.steps == 8  # no K past the three timed for the fit is wanted


def test_workers_agreeing_on_timings_settle_on_one_k():
    """Workers timed apart settle on different K alone; agreeing on the slowest worker's
    timing (what ``workers.slowest_of`` does across a cluster) they settle alike, on the
    K the slowest one alone would choose."""
    costs = {"fast": (1e-4, 1e-3), "slow": (1e-2, 1e-3)}  # (per_call, per_step) seconds
    alone = {name: AutoPace() for name in costs}
    for name, (per_call, per_step) in costs.items():
        timed(alone[name], per_call, per_step)
    assert alone["fast"].steps != alone["slow"].steps

    agreed: dict[str, AutoPace] = {}

    def slowest(name: str):  # the largest of the workers' timings of this K
        return lambda seconds: max(c + agreed[name].steps * s for c, s in costs.values())

    agreed.update({name: AutoPace(agree=slowest(name)) for name in costs})
    for _ in range(200):  # the workers' calls in step, as a cluster's are
        for name, (per_call, per_step) in costs.items():
            pace = agreed[name]
            pace.observe(pace.steps, pace.steps, per_call + pace.steps * per_step)
    assert agreed["fast"].settled and agreed["slow"].settled
    assert agreed["fast"].steps == agreed["slow"].steps == alone["slow"].steps
    assert agreed["fast"].timings == agreed["slow"].timings


def test_calls_cut_short_and_first_calls_are_not_timed():
    pace = AutoPace(targets=AutoTargets(samples=1))
    pace.observe(1, 1, 100.0)  # the one-step function's first call: not timed
    pace.observe(1, 1, 1e-3)
    assert pace.timings == {1: 1e-3} and pace.steps == 2
    pace.observe(1, 2, 1e-3)  # the data ended after 1 of 2 steps
    pace.observe(2, 2, 100.0)  # the K-step function's first call
    assert pace.timings == {1: 1e-3} and pace.steps == 2


def test_the_ceiling_comes_from_callbacks_and_the_epoch():
    class EveryStep(Callback):
        max_steps_per_execution = 1

    assert pace_for("auto", epoch_steps=45).ceiling == 64
    assert pace_for("auto").ceiling == AUTO_CEILING
    one = pace_for("auto", callbacks=[EveryStep()])
    assert one.settled and one.steps == 1
    assert pace_for(1, callbacks=[EveryStep()]).steps == 1
    with pytest.raises(ConfigError, match="EveryStep works with at most 1 step"):
        pace_for(4, callbacks=[EveryStep()])
    assert pace_for("auto", debug=True).steps == 1
    pace = pace_for("auto")
    pace.pass_ended(5)  # data of unknown length ended after 5 steps
    assert pace.ceiling == 8
    # Under "auto" calls end at every checkpoint_every multiple: K beyond it is moot,
    # so once the doubling reaches it the pace settles there.
    short = pace_for("auto", epoch_steps=1000, checkpoint_every=6)
    assert short.ceiling == 8
    assert sorted(set(timed(short, per_call=1e-3, per_step=1e-5))) == [1, 2, 4]
    assert short.settled and short.steps == 8


def optimizer_state(result) -> list[np.ndarray]:
    return [v.numpy() for v in result.optimizers["optimizer"].variables]


def fit_supervised(epochs=3, **options):
    return beatloop.fit(
        "supervised", epochs=epochs, seed=4, config={"hidden": 16}, progress=False, **options
    )


@pytest.fixture(scope="module")
def one_step_run():
    return fit_supervised(steps_per_execution=1)


def test_auto_trains_exactly_as_one_step_per_call(one_step_run, tmp_path):
    auto = fit_supervised(run_dir=tmp_path / "run")
    assert auto.history == one_step_run.history
    assert_same_weights(all_weights(auto.models), all_weights(one_step_run.models))
    assert_same_weights(optimizer_state(auto), optimizer_state(one_step_run))
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())
    assert recorded["steps_per_execution"] == "auto"
    # The K chosen once the search settles (on a loaded machine it may still be
    # searching after 135 steps: then nothing is chosen and None is recorded).
    chosen = auto.engine.run.chosen_steps_per_execution
    assert recorded["chosen_steps_per_execution"] == chosen
    assert chosen in (None, auto.steps_per_execution)
    assert auto.steps_per_execution > 1  # 45 steps an epoch: calls of 1 step never win


def test_resume_across_a_change_of_k(one_step_run, tmp_path):
    run_dir = tmp_path / "run"
    first = fit_supervised(steps_per_execution=4, run_dir=run_dir, epochs=1)
    assert first.epochs == 1
    resumed = fit_supervised(run_dir=run_dir)  # auto from here
    assert resumed.resumed_from is not None and resumed.epochs == 3
    assert resumed.history == one_step_run.history
    assert_same_weights(all_weights(resumed.models), all_weights(one_step_run.models))
    assert_same_weights(optimizer_state(resumed), optimizer_state(one_step_run))


class CallSizes(Callback):
    def __init__(self):
        self.sizes = []

    def on_execution_end(self, run, steps, logs):
        self.sizes.append(steps)


def test_a_callback_asking_for_every_step_gets_one_step_per_call():
    class EveryStep(CallSizes):
        max_steps_per_execution = 1

    every, free = EveryStep(), CallSizes()
    result = fit_supervised(callbacks=[every, free], epochs=1)
    assert every.sizes == [1] * result.steps and free.sizes == every.sizes
    with pytest.raises(ConfigError, match="at most 1 step"):
        fit_supervised(callbacks=[EveryStep()], steps_per_execution=8)


def test_keras_batch_hooks_fire_per_batch_under_auto():
    class Batches(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(batch)

    epoch_only, batches = keras.callbacks.History(), Batches()
    result = fit_supervised(callbacks=[batches], epochs=1)
    assert batches.ends == list(range(result.steps))
    assert fit_supervised(callbacks=[epoch_only], epochs=1).steps_per_execution > 1


def test_steps_per_execution_is_auto_or_a_positive_integer():
    for bad in (0, -1, "fast", 2.5, True):
        with pytest.raises(ConfigError, match="steps_per_execution"):
            fit_supervised(steps_per_execution=bad, epochs=1)


def test_the_command_line_says_the_k_it_chose(tmp_path, capsys):
    from beatloop.cli import main

    # The run in this process (what it prints is the command's); the refusal in a
    # process of its own, as the command exits (argparse's, before TensorFlow starts).
    arguments = ["run", "supervised", "--epochs", "3"]
    code = main([*arguments, "--seed", "0", "--run-dir", str(tmp_path / "run"), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    chosen = json.loads((tmp_path / "run" / "run.json").read_text())["chosen_steps_per_execution"]
    if chosen is None:  # a loaded machine's timings did not settle within the run
        assert re.search(r"steps per call: \d+ \(still being timed by", out), out
    else:
        assert f"steps per call: {chosen} (chosen by --steps-per-execution auto)" in out, out
    command = [sys.executable, "-m", "beatloop", *arguments]
    bad = subprocess.run(
        [*command, "--steps-per-execution", "none"], capture_output=True, text=True,
        env=python_env(), timeout=300,
    )  # fmt: skip
    assert bad.returncode == 2 and "invalid steps_per_execution value: 'none'" in bad.stderr


def test_evaluate_under_auto_matches_the_logged_figures(tmp_path):
    result = fit_supervised(run_dir=tmp_path / "run", epochs=1)
    figures = beatloop.evaluate(tmp_path / "run")
    assert figures["loss"] == result.history["val_loss"][-1]
    assert np.isfinite(figures["accuracy"])


@pytest.mark.parametrize("recipe", ["gan", "multitask", "risk_weighted"])
def test_every_multi_beat_recipe_trains_under_auto_as_at_one_step(recipe):
    runs = [
        beatloop.fit(recipe, epochs=2, seed=1, progress=False, steps_per_execution=k)
        for k in ("auto", 1)
    ]
    assert runs[0].history == runs[1].history
    assert_same_weights(all_weights(runs[0].models), all_weights(runs[1].models))
