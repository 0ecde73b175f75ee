"""A profile of a step range (``fit(profile=...)``, ``--profile START:STOP``): a
TensorFlow profiler trace of exactly those steps in the run dir's TensorBoard folder,
at any K, without changing the run."""

from __future__ import annotations

import pytest
from helpers import CountExecutions, all_weights, assert_same_weights, tuple_batches

import beatloop
from beatloop.cli import main


def traces(run_dir):
    return sorted((run_dir / "tensorboard" / "plugins" / "profile").rglob("*.xplane.pb"))


def test_a_profiled_range_is_traced_exactly_at_any_k_and_changes_nothing(digits, tmp_path):
    data = tuple_batches(digits[0], 64)  # 23 steps an epoch
    counted = CountExecutions()
    profiler = beatloop.Profiler((5, 9))
    options = {"epochs": 2, "seed": 0, "progress": False, "steps_per_execution": 4}
    profiled = beatloop.fit(
        "supervised", data=data, run_dir=tmp_path / "run", callbacks=[counted, profiler],
        **options,
    )  # fmt: skip
    # calls end at steps 5 and 9 (the range's edges); the others keep K=4
    assert counted.steps[:4] == [4, 1, 4, 4] and sum(counted.steps) == 46
    assert profiler.traced == (5, 9)
    (trace,) = traces(tmp_path / "run")
    assert b"MatMul" in trace.read_bytes()  # the step's ops are in it
    plain = beatloop.fit("supervised", data=data, **options)
    assert_same_weights(all_weights(profiled.models), all_weights(plain.models))


def test_the_command_line_profiles_and_bad_ranges_are_refused(tmp_path, capsys):
    run_dir = tmp_path / "cli"
    argv = ["run", "supervised", "--epochs", "1", "--seed", "0", "--quiet", "--set",
            "batch_size=64", "--run-dir", str(run_dir), "--profile", "2:4"]  # fmt: skip
    assert main(argv) == 0
    assert len(traces(run_dir)) == 1
    for bad in ("4:2", "x:3", "7", "-1:3"):
        with pytest.raises(beatloop.ConfigError, match="profile"):
            beatloop.Profiler(bad)
    with pytest.raises(beatloop.ConfigError, match="profile needs a run_dir"):
        beatloop.fit("supervised", epochs=1, profile=(1, 2))
    assert main([*argv[:-1], "9:3"]) != 0
    assert "profile needs 0 <= start < stop" in capsys.readouterr().err


def test_a_range_past_the_run_or_passed_by_a_resume_is_warned_of_and_traces_nothing(tmp_path):
    run_dir = tmp_path / "run"
    options = {"seed": 0, "progress": False, "config": {"batch_size": 64}, "run_dir": run_dir}
    words = r"profile 1000:1010 traces nothing: the run's steps are 0 to 45 \(2 epochs of 23\)"
    with pytest.warns(beatloop.IgnoredSettingWarning, match=words) as caught:
        beatloop.fit("supervised", epochs=2, profile=(1000, 1010), **options)
    assert len(caught) == 1 and not traces(run_dir)
    words = r"profile 2:4 traces nothing: this run resumed at step 46, after it"
    with pytest.warns(beatloop.IgnoredSettingWarning, match=words) as caught:
        resumed = beatloop.fit("supervised", epochs=3, profile=(2, 4), **options)
    assert len(caught) == 1 and resumed.resumed_from is not None and not traces(run_dir)
    beatloop.fit("supervised", epochs=4, profile=(70, 72), **options)  # reached: no warning
    assert len(traces(run_dir)) == 1
