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
