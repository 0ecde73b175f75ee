"""The command line: list, show, run, --version, errors as one line with their exit
code and their advice in the command line's spelling, and the package's shape."""

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BUILT_IN_RECIPES, history_records, python_env
from test_architecture import PACKAGE, cycles, long_functions, module_graph

import beatloop
from beatloop.cli import main
from beatloop.cli.spelling import for_command_line
from beatloop.core.running.recipe import Recipe
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry
from beatloop.recipes.supervised import Supervised


def test_list_shows_name_description_and_origin(capsys):
    assert main(["list"]) == 0
    line = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("supervised")
    )
    assert "Classification with one model" in line and line.endswith("[built-in]")


def test_list_verbose_shows_modules_and_callbacks(capsys):
    assert main(["list", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "module: beatloop.recipes.supervised" in out
    assert "callback progress: beatloop.callbacks.standard.ProgressBar [built-in]" in out


def test_show_prints_config_schedule_and_variables(capsys):
    assert main(["show", "supervised", "--set", "hidden=7"]) == 0
    out = capsys.readouterr().out
    assert "hidden: int = 7  (default 64)" in out
    assert "1. loss: loss=loss optimizer=optimizer updates=model" in out
    assert "classifier/dense" in out and "(64, 7)" in out  # the first kernel, 64 inputs


def test_run_trains_and_writes_the_run_dir(tmp_path, capsys):
    run_dir = tmp_path / "demo"
    code = main(
        [
            "run", "supervised", "--epochs", "2", "--seed", "0", "--set", "hidden=16",
            "--set", "batch_size=64", "--run-dir", str(run_dir), "--quiet",
            "--steps-per-execution", "4", "--callback", "csv",
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert f"run dir: {run_dir}" in out and "2 epoch(s), 46 steps, seed 0" in out
    records = history_records(run_dir)
    assert [r["epoch"] for r in records] == [1, 2] and records[1]["step"] == 46
    assert records[1]["loss"] < records[0]["loss"]
    assert (run_dir / "history.csv").read_text().splitlines()[0].startswith("epoch,step,loss")
    run = json.loads((run_dir / "run.json").read_text())
    assert run["recipe"] == "supervised" and run["config"]["hidden"] == 16 and run["seed"] == 0
    assert run["schedule"] == ["1. loss: loss=loss optimizer=optimizer updates=model"]


def test_errors_are_one_line_and_exit_2(capsys):
    assert main(["run", "supervized"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("beatloop: error: no recipe named 'supervized'")
    assert "did you mean 'supervised'" in err and "Traceback" not in err
    assert main(["run", "supervised", "--set", "hidden=wide"]) == 2
    assert "'hidden' expects int, got str 'wide'" in capsys.readouterr().err
    assert main(["run", "supervised", "--set", "colour=red"]) == 2
    assert "no config field 'colour'" in capsys.readouterr().err
    assert main(["run", "supervised", "--callback", "tensorbored"]) == 2
    assert "no callback named 'tensorbored'" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_and_module_entry_point(capsys):
    assert main(["list"]) == 0
    expected = capsys.readouterr().out
    names = [line.split()[0] for line in expected.splitlines() if "[built-in]" in line]
    assert names == BUILT_IN_RECIPES  # a real list, not an empty one
    script = Path(sys.executable).parent / "beatloop"
    for command in ([str(script), "list"], [sys.executable, "-m", "beatloop", "list"]):
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
        assert out.stdout == expected, command  # both entry points are main()


# -- --version ------------------------------------------------------------------------


def test_version_prints_beatloops_tensorflows_and_keras_versions(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code in (0, None)
    first, tensorflow, keras, python = capsys.readouterr().out.splitlines()
    assert first == f"beatloop {importlib.metadata.version('beatloop')}"
    assert re.fullmatch(r"TensorFlow 2\.\d+\.\d+.*", tensorflow), tensorflow
    assert tensorflow.split()[1] == __import__("tensorflow").__version__
    assert keras == f"Keras {__import__('keras').__version__}"
    assert python == f"Python {sys.version.split()[0]}"


@pytest.mark.slow
def test_version_does_not_import_tensorflow():
    code = (
        "import sys\nfrom beatloop.cli import main\ntry:\n    main(['--version'])\n"
        "except SystemExit as e:\n    print('exit', e.code, 'tensorflow' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=python_env()
    )
    assert done.stdout.startswith("beatloop ") and done.stdout.endswith("exit 0 False\n"), done
    assert done.stderr == ""


# -- failures: one line, an exit code, the command line's words --------------------------


def test_an_internal_error_asks_for_a_report_without_an_address(capsys, monkeypatch):
    import beatloop.cli.cmd_show

    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(beatloop.cli.cmd_show, "run", broken)
    assert main(["show", "supervised"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "beatloop: internal error: KeyError: 'a bug'" in err
    assert err.rstrip().endswith(
        "please report it to beatloop's maintainers with the command and the traceback above"
    )
    assert "http" not in err and "github" not in err


class NoData(Supervised):
    """Supervised without built-in data (test recipe)."""

    name = "no_data_test"
    default_data = Recipe.default_data


class NoModels(Supervised):
    """Supervised that builds no models (test recipe)."""

    name = "no_models_test"
    build_models = Recipe.build_models


@pytest.fixture
def bare_recipes(monkeypatch):
    registry = Registry(load_entry_points=False)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    for cls in (NoData, NoModels):
        registry.register(cls)
    return registry


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("beatloop: error: "), err
    return lines[0]


def test_advice_reaches_the_command_line_in_its_spelling(bare_recipes, tmp_path, capsys):
    with pytest.raises(beatloop.ConfigError, match=r"pass data=\.\.\.$"):
        beatloop.fit("no_data_test")  # Python keeps its own words
    assert main(["run", "no_data_test", "--run-dir", str(tmp_path / "a")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        "beatloop: error: recipe 'no_data_test' has no built-in data (it defines no "
        "default_data): pass --data KIND:PATH (data= in Python)"
    )
    assert main(["run", "no_models_test", "--run-dir", str(tmp_path / "b")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "build_models): pass --model NAME=PATH.keras (models={...} in Python) for each " in line
    assert line.endswith("for each of: model")
    for flag, value in (
        ("--checkpoint-every", "0"),
        ("--divergence-window", "0"),
        ("--seed", "-1"),
    ):
        assert main(["run", "supervised", flag, value, "--run-dir", str(tmp_path / "c")]) == 2
        line = one_error_line(capsys.readouterr().err)
        python = flag[2:].replace("-", "_")
        assert re.match(rf"beatloop: error: {flag}: .*\b{python}\b(=...\) takes|'? must) ", line)
    assert not any((tmp_path / name).exists() for name in "abc")


def string_literals(node: ast.AST) -> list[str]:
    """The string literals in ``node``, an f-string as one text (its values written ``1``)."""
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "1" for v in node.values)]
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    return [text for child in ast.iter_child_nodes(node) for text in string_literals(child)]


def raised_messages() -> list[tuple[str, str]]:
    """Every string beatloop raises or returns outside the command's own package, with
    where it is."""
    return [
        (f"{path.name}:{node.lineno}", text)
        for path in sorted(PACKAGE.rglob("*.py"))
        if "cli" not in path.relative_to(PACKAGE).parts
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Raise | ast.Return)
        for text in string_literals(node)
    ]


#: Advice in Python's words: ``pass NAME=`` with a keyword of fit, restore or evaluate.
PYTHON_ADVICE = re.compile(
    r"\bpass (data|models|run_dir|config|steps_per_\w+|seed|epochs|accept_changed_data)="
)


def test_no_error_reaches_the_command_line_with_only_pythons_spelling():
    advised = [(where, text) for where, text in raised_messages() if PYTHON_ADVICE.search(text)]
    assert len(advised) >= 5, advised  # the messages were found
    for where, text in advised:
        translated = for_command_line(text)
        assert translated != text and "in Python" in translated, (where, translated)
    example = "recipe 'r' has no built-in data to evaluate on: pass data= (a batched "
    example += "tf.data.Dataset like the run's training data)"
    assert for_command_line(example) == (
        "recipe 'r' has no built-in data to evaluate on: pass --data KIND:PATH (data= in Python)"
    )
    assert for_command_line("steps_per_execution is 8: pass steps_per_execution=2 or 'auto'") == (
        "steps_per_execution is 8: pass --steps-per-execution 2 or auto "
        "(steps_per_execution= in Python)"
    )


# -- the package's shape ----------------------------------------------------------------


def test_the_cli_package_has_no_import_cycle_and_no_long_function():
    graph = {name: deps for name, deps in module_graph().items() if name.startswith("beatloop.cli")}
    graph = {name: deps & set(graph) for name, deps in graph.items()}
    assert {"beatloop.cli.cmd_run", "beatloop.cli.parser", "beatloop.cli.failure"} <= set(graph)
    assert cycles(graph) == []
    assert long_functions(PACKAGE / "cli") == []
