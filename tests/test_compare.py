"""`beatloop compare`: entries parsed from the command line, each run in its own
process, one table, a JSON file of the figures and a PNG of the loss curves."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from beatloop.compare import Entry, parse_entries


def test_each_set_belongs_to_the_recipe_before_it():
    tokens = [
        "gan",
        "--set",
        "n_critic=1",
        "gan",
        "--set=n_critic=5",
        "--set",
        "hidden=32",
        "supervised",
    ]
    assert parse_entries(tokens) == [
        Entry("gan", ("n_critic=1",)),
        Entry("gan", ("n_critic=5", "hidden=32")),
        Entry("supervised"),
    ]
    for bad, message in [
        (["--set", "a=1", "gan"], "before any recipe"),
        (["gan", "--set"], "needs FIELD=VALUE"),
        (["gan", "--fast"], "unknown option '--fast'"),
        ([], "at least one recipe"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_entries(bad)


@pytest.mark.slow
def test_compare_two_configs_writes_table_json_and_png(tmp_path, capsys):
    from beatloop.cli import main

    out = tmp_path / "cmp"
    argv = ["compare", "supervised", "--set", "batch_size=256", "supervised"]
    argv += ["--set", "batch_size=128", "--set", "hidden=16", "--epochs", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "supervised batch_size=256" in printed and "batch_size=128 hidden=16" in printed
    assert "val_accuracy" in printed and "(higher is better)" in printed

    record = json.loads((out / "compare.json").read_text())
    big, small = record["rows"]
    # 1,437 training digits: 6 batches of 256 or 12 of 128 per epoch, 2 epochs.
    assert (big["steps"], small["steps"]) == (12, 24)
    for row in (big, small):
        # Rates are timed over epoch 2 (epoch 1 includes tracing): 1,437 examples in
        # steps / 2 steps, whatever the time it took.
        assert row["steps_per_second"] > 0
        per_step = row["examples_per_second"] / row["steps_per_second"]
        assert per_step == pytest.approx(1437 / (row["steps"] / 2), rel=1e-9)
        assert row["peak_memory_mb"] > 100  # TensorFlow alone takes more than that
        assert list(row["final_losses"]) == ["loss"] and len(row["loss_curves"]["loss"]) == 2
        assert row["final_losses"]["loss"] == row["loss_curves"]["loss"][-1]
        assert row["loss_curves"]["loss"][1] < row["loss_curves"]["loss"][0]  # it trained
        # The last epoch's accuracy on the 360 validation digits: a whole count of them.
        assert row["quality"] == ["val_accuracy", "max"] and 0 < row["quality_value"] <= 1
        assert row["quality_value"] * 360 == pytest.approx(round(row["quality_value"] * 360))
    with Image.open(out / "loss_curves.png") as picture:
        assert picture.format == "PNG" and picture.size[0] > picture.size[1]

    assert main(["compare", "no_such_recipe", "--out", str(tmp_path / "x")]) == 2
    assert "no recipe named 'no_such_recipe'" in capsys.readouterr().err


# --- seeds: statistics, the lead, the table -------------------------------------------------


def test_bootstrap_interval_of_the_mean_over_seeds():
    from beatloop.compare_report import bootstrap_interval

    assert bootstrap_interval([0.75]) == (0.75, 0.75)  # one seed: just the value
    spread = [0.80, 0.90, 0.85]
    low, high = bootstrap_interval(spread)
    assert low < sum(spread) / 3 < high and low >= 0.80 and high <= 0.90
    assert bootstrap_interval(spread) == (low, high)  # a fixed generator: reproducible
    agreeing = [*spread, 0.85, 0.86, 0.84, 0.85, 0.85, 0.86, 0.84]
    narrow_low, narrow_high = bootstrap_interval(agreeing)
    assert narrow_low <= sum(agreeing) / len(agreeing) <= narrow_high
    assert narrow_high - narrow_low < (high - low) / 2
    assert bootstrap_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_interval([])


def _row(label, values, quality=("val_accuracy", "max")):
    """A hand-made row of compare.json, as ``compare`` writes it for these seeds' values."""
    from beatloop.compare_report import bootstrap_interval

    mean = sum(values) / len(values)
    return {
        "label": label,
        "steps_per_second": 100.0,
        "examples_per_second": 6400.0,
        "peak_memory_mb": 900.0,
        "final_losses": {"loss": 0.5},
        "quality": list(quality),
        "quality_value": mean,
        "seeds": list(range(len(values))),
        "intervals": {
            "steps_per_second": [90.0, 110.0],
            "examples_per_second": [5760.0, 7040.0],
            "peak_memory_mb": [880.0, 920.0],
            "final_losses": {"loss": [0.4, 0.6]},
            "quality_value": list(bootstrap_interval(values)),
        },
    }


def test_the_best_quality_leads_clearly_only_outside_the_others_intervals():
    from beatloop.compare_report import format_table, quality_lead

    apart = [_row("a", [0.80, 0.81, 0.82]), _row("b", [0.90, 0.91, 0.92])]
    assert quality_lead(apart) == {"best": "b", "clear": True, "figure": "val_accuracy"}
    close = [_row("a", [0.80, 0.90, 0.85]), _row("b", [0.84, 0.92, 0.86])]
    assert quality_lead(close) == {"best": "b", "clear": False, "figure": "val_accuracy"}
    style = ("style_loss", "min")
    lower = [_row("a", [0.3, 0.31, 0.32], style), _row("b", [0.5, 0.52, 0.51], style)]
    assert quality_lead(lower) == {"best": "a", "clear": True, "figure": "style_loss"}
    # One seed has no spread to judge by; different recipes' figures do not compare.
    assert quality_lead([_row("a", [0.8]), _row("b", [0.9])])["clear"] is False
    assert quality_lead([_row("a", [0.8, 0.8]), _row("b", [0.9, 0.9], ("auc", "max"))]) is None
    assert quality_lead([_row("a", [0.8, 0.8])]) is None

    table = format_table(apart).splitlines()
    assert table[0] == "mean [95% bootstrap interval] over 3 seeds"
    assert "val_accuracy 0.91 [0.9, 0.92] (higher is better)" in table[-2]
    assert "100 [90, 110]" in table[-2] and "loss 0.5 [0.4, 0.6]" in table[-2]
    assert table[-1] == "best val_accuracy: b \N{EM DASH} its lead is outside the others' intervals"
    assert format_table(close).splitlines()[-1] == (
        "best val_accuracy: b \N{EM DASH} within the others' intervals: not distinguishable "
        "from seed noise at 3 seeds"
    )


def test_a_failed_run_ends_its_entry_and_the_other_entries_run_on(monkeypatch):
    """The pool of ``--jobs``: each run a process (here a stand-in for ``python -m
    beatloop.compare``), results in the tasks' order; a failure (reported, a crash or a
    timeout) ends its entry's other runs, killed or never started, and no other's."""
    import sys
    import time

    from beatloop import compare
    from beatloop.compare import RunFailure

    script = (
        "import json, sys, time; spec = json.loads(sys.argv[1]); seed = spec['seed']\n"
        "if seed == 9:\n"
        "    print(json.dumps({'failure': {'message': 'the loss ran away', 'exit_code': 4}}))\n"
        "    sys.exit(4)\n"
        "if seed == 7: sys.exit('ValueError: seed seven is cursed')\n"
        "if seed == 8: time.sleep(60)\n"
        "print(json.dumps({'seed': seed}))"
    )
    monkeypatch.setattr(
        compare, "_command", lambda spec: ([sys.executable, "-c", script, json.dumps(spec)], None)
    )

    def task(label, seed):
        return f"{label} s{seed}", {"label": label, "recipe": "x", "settings": [], "seed": seed,
                                    "run_dir": f"out/{label}/seed{seed}"}  # fmt: skip

    tasks = [task("x", seed) for seed in (3, 1, 2)]
    echoed = []
    assert compare._run_all(tasks, 2, 30, echoed.append) == [{"seed": 3}, {"seed": 1}, {"seed": 2}]
    assert echoed == ["x s3 ...", "x s1 ...", "x s2 ..."]

    for jobs in (1, 2):  # seed 8 of entry "a" is killed, or never started
        started = time.monotonic()
        tasks = [task("a", 9), task("a", 8), task("b", 3)]
        failed, stopped, other = compare._run_all(tasks, jobs, 30, echoed.append)
        assert time.monotonic() - started < 20  # the sleeping run was not waited for
        assert failed == RunFailure("a", 9, "out/a/seed9", "the loss ran away", 4)
        assert stopped is None and other == {"seed": 3}
        assert failed.text() == "a (seed 9, run dir out/a/seed9) failed: the loss ran away"
    crashed, timed_out = compare._run_all([task("c", 7), task("d", 8)], 2, 1, echoed.append)
    assert (crashed.message, crashed.exit_code) == ("ValueError: seed seven is cursed", 1)
    assert crashed.internal and "seed seven is cursed" in crashed.detail
    assert (timed_out.message, timed_out.exit_code) == ("did not finish within 1 s", 2)


# --- --tuned ----------------------------------------------------------------------------------


def test_tuned_takes_a_studys_best_config_before_the_entrys_own_settings(tmp_path):
    from beatloop.compare import tuned_settings
    from beatloop.core.failures.errors import ConfigError

    tokens = ["supervised", "--tuned", "studies/s1", "--set", "hidden=8", "gan", "--tuned=s2"]
    assert parse_entries(tokens) == [
        Entry("supervised", ("hidden=8",), "studies/s1"),
        Entry("gan", (), "s2"),
    ]
    assert Entry("supervised", ("hidden=8",), "studies/s1").label == (
        "supervised tuned(s1) hidden=8"
    )
    for bad, message in [
        (["--tuned", "s", "gan"], "--tuned s comes before any recipe"),
        (["gan", "--tuned"], "--tuned needs STUDY_DIR"),
        (["gan", "--tuned", "a", "--tuned", "b"], "--tuned given twice for gan"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_entries(bad)

    study = tmp_path / "study"
    entry = Entry("supervised", ("hidden=8",), str(study))
    with pytest.raises(ConfigError, match="no such study directory; run `beatloop tune` first"):
        tuned_settings(entry)
    study.mkdir()
    with pytest.raises(ConfigError, match=r"no best\.toml .* run `beatloop tune` first"):
        tuned_settings(entry)
    (study / "best.toml").write_text("recipe = 'supervised'\n[config\n")
    with pytest.raises(ConfigError, match=r"best\.toml is not valid TOML"):
        tuned_settings(entry)
    (study / "best.toml").write_text('recipe = "gan"\n[config]\nn_critic = 2\n')
    with pytest.raises(ConfigError, match="of recipe 'gan', not 'supervised'"):
        tuned_settings(entry)
    best = 'recipe = "supervised"\nepochs = 7\nseed = 3\n[config]\nhidden = 24\n'
    (study / "best.toml").write_text(best + "learning_rate = 0.003\n")
    assert tuned_settings(entry) == ("hidden=24", "learning_rate=0.003")
    assert tuned_settings(Entry("supervised")) == ()


def test_bad_seeds_and_jobs_are_refused_before_anything_runs(tmp_path, capsys):
    from beatloop.cli import main

    for argv, message in [
        (["--seeds", "0", "supervised"], "--seeds must be >= 1, got 0"),
        (["supervised", "--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["supervised", "--seeds", "three"], "--seeds expects a number, got 'three'"),
        (["supervised", "--tuned", str(tmp_path / "none")], "no such study directory"),
    ]:
        assert main(["compare", *argv, "--out", str(tmp_path / "out")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_compare_over_seeds_prints_intervals_and_bands(tmp_path, capsys):
    """Two seeds of a config and a tuned one, two runs at a time."""
    from beatloop.cli import main

    study = tmp_path / "study"
    study.mkdir()
    (study / "best.toml").write_text('recipe = "supervised"\n[config]\nhidden = 16\n')
    out = tmp_path / "cmp"
    small = ["--set", "batch_size=256"]  # a trailing --set belongs to the last entry
    argv = ["compare", "supervised", "--set", "hidden=8", *small, "supervised"]
    argv += ["--tuned", str(study)]
    argv += ["--seeds", "2", "--jobs", "2", "--epochs", "1", *small, "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "mean [95% bootstrap interval] over 2 seeds" in printed
    assert "best val_accuracy: supervised " in printed
    table = printed[printed.index("mean [95%") :]
    assert table.count("[") >= 2 * 5 and "supervised tuned(study) batch_size=256" in table

    record = json.loads((out / "compare.json").read_text())
    assert record["seeds"] == [0, 1]
    assert record["quality_lead"]["figure"] == "val_accuracy"
    assert record["quality_lead"]["best"] in [row["label"] for row in record["rows"]]
    for row in record["rows"]:
        assert row["seeds"] == [0, 1] and len(row["per_seed"]) == 2
        assert [s["seed"] for s in row["per_seed"]] == [0, 1]
        losses = [s["final_losses"]["loss"] for s in row["per_seed"]]
        assert len(set(losses)) == 2  # the seed matters
        for figure in ("steps_per_second", "peak_memory_mb", "quality_value"):
            low, high = row["intervals"][figure]
            assert low <= row[figure] <= high
        low, high = row["intervals"]["final_losses"]["loss"]
        assert low <= row["final_losses"]["loss"] <= high and low < high
        assert row["final_losses"]["loss"] == pytest.approx(sum(losses) / 2)
        assert row["steps"] == 6  # 1,437 digits in batches of 256, 1 epoch
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "supervised-hidden_8-batch_size_256",
        "supervised-tuned_study_-batch_size_256",
    ]
    for run_dir in out.glob("supervised-*"):
        assert sorted(p.name for p in run_dir.iterdir()) == ["seed0", "seed1"]
    tuned = record["rows"][1]
    assert tuned["tuned"] == {"study": str(study), "settings": ["hidden=16"]}
    assert tuned["settings"] == ["batch_size=256"]
    config = json.loads((out / "supervised-tuned_study_-batch_size_256/seed1/run.json").read_text())
    assert (config["config"]["hidden"], config["config"]["batch_size"]) == (16, 256)
    with Image.open(out / "loss_curves.png") as picture:
        assert picture.format == "PNG" and picture.size[0] > picture.size[1]
