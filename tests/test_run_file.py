"""Runs described in files: a TOML run file, and a recorded run.json replayed bit for bit."""

import json

import numpy as np
import pytest
from helpers import model_variables

from beatloop.cli import main

TINY = 'recipe = "supervised"\nepochs = 2\nseed = 3\nquiet = true\n'
FIELDS = "[config]\nhidden = 8\nbatch_size = 256\ndropout = 0.25\n"


def run(argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_toml_run_file_runs_as_its_flags_would(tmp_path, capsys):
    (tmp_path / "run.toml").write_text(TINY + "steps_per_execution = 4\n" + FIELDS)
    code, by_file, _ = run(["run", "--config", tmp_path / "run.toml", "--run-dir", tmp_path / "a"],
                           capsys)  # fmt: skip
    assert code == 0
    flags = ["run", "supervised", "--epochs", "2", "--seed", "3", "--quiet", "--set", "hidden=8",
             "--set", "batch_size=256", "--set", "dropout=0.25", "--steps-per-execution", "4",
             "--run-dir", tmp_path / "b"]  # fmt: skip
    code, by_flags, _ = run(flags, capsys)
    assert code == 0
    assert by_file.splitlines()[0] == by_flags.splitlines()[0]  # the same figures
    assert "2 epoch(s), 12 steps, seed 3" in by_file
    a, b = model_variables(tmp_path / "a"), model_variables(tmp_path / "b")
    assert all(np.array_equal(a[name], b[name]) for name in a)


def test_flags_override_the_run_file(tmp_path, capsys):
    (tmp_path / "run.toml").write_text(TINY + FIELDS)
    argv = ["run", "--config", tmp_path / "run.toml", "--epochs", "1", "--set", "hidden=6",
            "--run-dir", tmp_path / "r"]  # fmt: skip
    code, out, _ = run(argv, capsys)
    assert code == 0 and "1 epoch(s), 6 steps, seed 3" in out
    variables = model_variables(tmp_path / "r")
    kernels = [v.shape for n, v in variables.items() if n.startswith("model_") and v.ndim == 2]
    assert (64, 6) in kernels  # hidden=6 from --set, over the file's 8


def test_a_recorded_run_replays_bit_for_bit(tmp_path, capsys):
    (tmp_path / "run.toml").write_text(TINY + FIELDS)
    code, first, _ = run(["run", "--config", tmp_path / "run.toml", "--run-dir", tmp_path / "a"],
                         capsys)  # fmt: skip
    assert code == 0
    replay = ["run", "--config", tmp_path / "a" / "run.json", "--run-dir", tmp_path / "b",
              "--quiet"]  # fmt: skip
    code, second, _ = run(replay, capsys)
    assert code == 0
    assert first.splitlines()[0] == second.splitlines()[0]
    a, b = model_variables(tmp_path / "a"), model_variables(tmp_path / "b")
    assert set(a) == set(b)
    assert all(np.array_equal(a[name], b[name]) for name in a)  # dropout's draws included
    other_seed = [*replay[:-1], "--seed", "4", "--run-dir", tmp_path / "c"]
    assert run(other_seed, capsys)[0] == 0
    c = model_variables(tmp_path / "c")
    assert not all(np.array_equal(a[name], c[name]) for name in a)  # the seed matters


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('recipe = "supervised"\nepoch = 2\n', "unknown key 'epoch' (did you mean 'epochs'?)"),
        ('recipe = "supervised"\nseed = "x"\n', "'seed' expects an integer, got 'x'"),
        ('recipe = "supervised"\non_nan = "skip"\n', "'on_nan' expects one of 'raise', "),
        ('recipe = "supervised"\ndebug = 1\n', "'debug' expects true or false, got 1"),
        ('recipe = "supervised"\n[config]\nhiden = 8\n', "no config field 'hiden'"),
        ("epochs = 2\n", "run needs a recipe"),
        ('recipe = "supervised"\nepochs = \n', "is not valid TOML"),
    ],
)
def test_a_bad_run_file_is_one_error_line(text, fragment, tmp_path, capsys):
    (tmp_path / "run.toml").write_text(text)
    code, _, err = run(["run", "--config", tmp_path / "run.toml", "--run-dir", tmp_path / "r"],
                       capsys)  # fmt: skip
    assert code == 2
    assert err.startswith("beatloop: error: ") and fragment in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_json_file_that_is_no_run_record_is_refused(tmp_path, capsys):
    (tmp_path / "other.json").write_text('{"epochs": 3}')
    code, _, err = run(["run", "--config", tmp_path / "other.json"], capsys)
    assert code == 2 and "is not a beatloop run.json" in err
    code, _, err = run(["run", "--config", tmp_path / "missing.toml"], capsys)
    assert code == 2 and "no such file" in err


def test_a_run_file_names_its_data_and_the_replay_reads_it_again(tmp_path, capsys, small_digits):
    train, _ = small_digits
    header = ",".join([*(f"p{i}" for i in range(64)), "digit"])
    pairs = zip(train["x"], train["y"], strict=True)
    rows = [",".join([*(repr(float(v)) for v in x), str(int(y))]) for x, y in pairs]
    (tmp_path / "digits.csv").write_text("\n".join([header, *rows]) + "\n")
    (tmp_path / "run.toml").write_text(
        TINY + f'data = "csv:{tmp_path / "digits.csv"}"\n'
        '[data_set]\nlabel = "digit"\nbatch_size = 50\nvalidation_fraction = 0.2\n' + FIELDS
    )
    code, first, _ = run(["run", "--config", tmp_path / "run.toml", "--run-dir", tmp_path / "a"],
                         capsys)  # fmt: skip
    assert code == 0, first
    assert "2 epoch(s), 8 steps" in first  # 160 of the 200 rows train, in batches of 50
    recorded = json.loads((tmp_path / "a" / "run.json").read_text())["data_source"]
    assert recorded["data"] == f"csv:{tmp_path / 'digits.csv'}"
    assert recorded["data_set"] == ["label=digit", "batch_size=50", "validation_fraction=0.2"]
    replay = ["run", "--config", tmp_path / "a" / "run.json", "--run-dir", tmp_path / "b",
              "--quiet"]  # fmt: skip
    code, second, _ = run(replay, capsys)
    assert code == 0 and first.splitlines()[0] == second.splitlines()[0]
    a, b = model_variables(tmp_path / "a"), model_variables(tmp_path / "b")
    assert all(np.array_equal(a[name], b[name]) for name in a)


def test_a_run_json_of_another_recipe_is_one_short_line(tmp_path, capsys):
    import attrs

    from beatloop.recipes.gan import Gan

    config = json.loads(json.dumps(attrs.asdict(Gan.Config()), default=str))
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "run.json").write_text(json.dumps({"recipe": "gan", "config": config}))
    argv = [
        "run",
        "supervised",
        "--config",
        tmp_path / "g" / "run.json",
        "--run-dir",
        tmp_path / "r",
    ]
    code, _, err = run(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(
        f"beatloop: error: {tmp_path / 'g' / 'run.json'} is a run of recipe 'gan', not "
        "'supervised': run it without naming a recipe (beatloop run --config "
    )
    assert len(err.replace(str(tmp_path / "g" / "run.json"), "g/run.json")) < 200, err
    assert "fields" not in err
    assert not (tmp_path / "r").exists()


def test_a_run_file_whose_config_is_another_recipes_names_it(tmp_path, capsys):
    (tmp_path / "gan.toml").write_text('recipe = "gan"\n[config]\nn_critic = 2\nlatent_dim = 4\n')
    argv = ["run", "supervised", "--config", tmp_path / "gan.toml", "--run-dir", tmp_path / "r"]
    code, _, err = run(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(
        f"beatloop: error: {tmp_path / 'gan.toml'} is a run file of recipe 'gan', not "
        "'supervised': its [config] has fields 'supervised' lacks (latent_dim, n_critic); "
    )
    # Fields both recipes have: the recipe named on the command line runs with them.
    shared = TINY.replace('"supervised"', '"gan"') + "[config]\nhidden = 8\nbatch_size = 256\n"
    (tmp_path / "shared.toml").write_text(shared)
    argv = ["run", "supervised", "--config", tmp_path / "shared.toml", "--run-dir", tmp_path / "s"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert out.startswith("supervised: 2 epoch(s), 12 steps, seed 3")
