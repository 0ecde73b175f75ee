"""Recipes from the user's own modules: ``--import MODULE`` on every command and a run
file's ``import = [...]`` import them first; ``run.json`` records the module a recipe came
from (``recipe_module``) and beatloop, which never imports code on its own, names it when
the recipe is not registered; a module that fails to import, or trains when imported, is
one error line.

Most tests run the command in this process (``main([...])``): ``Session.new()`` forgets
the user's modules and registrations as a new process would start without them."""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import finish, start_python

import beatloop
from beatloop import user_modules
from beatloop.cli import main
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry

#: A module of the user's registering a recipe (a supervised one, to train fast).
RECIPES = '''
import beatloop
from beatloop.recipes.supervised import Supervised


class Mine(Supervised):
    """A supervised recipe of the user's own."""

    name = "mine"


beatloop.register(Mine)
'''

#: What trains a run of it quickly.
TRAIN = ["--epochs", "2", "--seed", "0", "--set", "batch_size=256", "--keep-best", "val_loss"]


class Session:
    """The working dir (``tmp_path``) and what a process holds of the user's code: its
    modules (named ``bl_user_*``), the registry, ``sys.path``."""

    def __init__(self, folder: Path, monkeypatch):
        self.folder, self.monkeypatch = folder, monkeypatch
        monkeypatch.chdir(folder)
        monkeypatch.setattr(sys, "path", list(sys.path))
        monkeypatch.setattr(user_modules, "_FROM_FILES", {})
        self.new()

    def write(self, name: str, source: str) -> Path:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
        return path

    def new(self) -> None:
        """As a new process: no module of the user's imported, only built-in recipes."""
        forget_user_modules()
        user_modules._FROM_FILES.clear()
        self.monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))


def forget_user_modules() -> None:
    for name in [name for name in sys.modules if name.startswith("bl_user_")]:
        del sys.modules[name]


@pytest.fixture
def session(tmp_path, monkeypatch):
    yield Session(tmp_path, monkeypatch)
    forget_user_modules()


def cli(argv, capsys) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_of_an_imported_recipe_names_its_module_until_it_is_imported(session, capsys):
    session.write("bl_user_recipes.py", RECIPES)
    code, out, err = cli(["run", "mine", "--import", "bl_user_recipes", *TRAIN,
                          "--run-dir", "r", "--quiet"], capsys)  # fmt: skip
    assert code == 0, err
    assert json.loads(Path("r/run.json").read_text())["recipe_module"] == "bl_user_recipes"
    session.new()
    missing = (
        "beatloop: error: recipe 'mine' is not registered in this process; it was registered "
        "in module bl_user_recipes: pass --import bl_user_recipes\n"
    )
    for command in (["evaluate", "r", "--best"], ["export", "r", "out", "--best"],
                    ["run", "--config", "r/run.json", "--run-dir", "again"]):  # fmt: skip
        assert cli(command, capsys) == (2, "", missing), command
    assert not Path("out").exists() and not Path("again").exists()
    code, out, err = cli(["evaluate", "r", "--best", "--import", "bl_user_recipes"], capsys)
    assert code == 0, err
    assert out.splitlines()[0].split()[0] == "loss"
    code, out, err = cli(["export", "r", "out", "--best", "--import", "bl_user_recipes"], capsys)
    assert code == 0, err
    assert (Path("out") / "model" / "saved_model.pb").is_file()


def test_python_names_the_module_a_run_recorded_for_its_unregistered_recipe(session):
    session.write("bl_user_recipes.py", RECIPES)
    user_modules.import_modules(["bl_user_recipes"])
    beatloop.fit("mine", epochs=1, seed=0, config={"batch_size": 256}, run_dir="r",
                 progress=False)  # fmt: skip
    session.new()
    for call in (beatloop.restore, beatloop.evaluate):
        with pytest.raises(beatloop.RecipeNotFoundError) as raised:
            call("r")
        assert str(raised.value) == (
            "recipe 'mine' is not registered in this process; it was registered in module "
            "bl_user_recipes: import that module first"
        )
    user_modules.import_modules(["bl_user_recipes"])
    assert beatloop.restore("r").recipe.name == "mine"


def test_a_run_file_imports_its_modules_and_the_commands_see_them(session, capsys):
    session.write("bl_user_recipes.py", RECIPES)
    session.write(
        "run.toml",
        """
        import = ["bl_user_recipes"]
        recipe = "mine"
        epochs = 1
        seed = 0
        quiet = true
        [config]
        batch_size = 256
        """,
    )
    code, out, err = cli(["run", "--config", "run.toml", "--run-dir", "r"], capsys)
    assert code == 0, err
    assert out.startswith("mine: 1 epoch(s), ")
    session.write("bad.toml", 'import = "bl_user_recipes"\nrecipe = "mine"\n')
    code, _, err = cli(["run", "--config", "bad.toml"], capsys)
    assert code == 2 and "'import' expects a list of module names or .py paths" in err
    session.new()
    code, out, err = cli(["show", "mine", "--import", "bl_user_recipes"], capsys)
    assert code == 0 and out.startswith("mine: A supervised recipe of the user's own."), err
    session.new()
    code, out, err = cli(["list", "--import", "bl_user_recipes"], capsys)
    assert code == 0, err
    assert "mine" in out.split() and "[registered in bl_user_recipes]" in out
    session.new()
    code, _, err = cli(["show", "mine"], capsys)
    assert code == 2 and err.rstrip().endswith(
        "; for a recipe of your own, pass --import MODULE (the module that registers it)"
    )


def test_a_module_that_fails_to_import_is_one_line_naming_it_and_the_cause(session, capsys):
    session.write("bl_user_broken.py", "import os\nimport bl_missing_dependency\n")
    assert cli(["list", "--import", "bl_user_broken"], capsys) == (2, "", (
        "beatloop: error: --import bl_user_broken failed: ModuleNotFoundError: No module "
        "named 'bl_missing_dependency' (at bl_user_broken.py:2)\n"
    ))  # fmt: skip
    with pytest.raises(beatloop.ModuleImportError) as raised:
        user_modules.import_modules(["bl_user_broken"])
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)
    assert isinstance(raised.value, ImportError)
    session.write("bl_user_raises.py", "def f():\n    raise ValueError('no\\nmore')\n\nf()\n")
    assert cli(["show", "mine", "--import", "bl_user_raises"], capsys)[2] == (
        "beatloop: error: --import bl_user_raises failed: ValueError: no (at bl_user_raises.py:2)\n"
    )
    code, _, err = cli(["evaluate", "r", "--import", "bl_user_nowhere.recipes"], capsys)
    assert code == 2 and err.startswith(
        "beatloop: error: --import bl_user_nowhere.recipes: no module named 'bl_user_nowhere' "
        f"in the current directory ({session.folder}) or on sys.path; "
    )
    code, _, err = cli(["list", "--import", "nowhere/bl_user_recipes.py"], capsys)
    assert code == 2 and err.startswith(
        "beatloop: error: --import nowhere/bl_user_recipes.py: no such .py file ("
    )
    session.write("bl_user_empty.py", "VALUE = 1\n")  # registers nothing: fine
    assert cli(["show", "supervised", "--import", "bl_user_empty"], capsys)[0] == 0


def test_a_module_that_trains_when_imported_is_refused_before_it_trains(session, capsys):
    session.write(
        "bl_user_trains.py",
        RECIPES + 'beatloop.fit("mine", epochs=1, run_dir="trained_on_import")\n',
    )
    assert cli(["list", "--import", "bl_user_trains"], capsys) == (2, "", (
        "beatloop: error: beatloop.fit was called while bl_user_trains was being imported "
        '(--import): it trains when imported; put its training under if __name__ == '
        '"__main__": (or in a function), so that importing it only registers its recipe\n'
    ))  # fmt: skip
    assert not Path("trained_on_import").exists()
    session.write("bl_user_exits.py", "import sys\nsys.exit(3)\n")
    code, _, err = cli(["list", "--import", "bl_user_exits"], capsys)
    assert code == 2 and err.startswith(
        "beatloop: error: --import bl_user_exits: it exited while being imported (SystemExit: 3): "
    )


def test_a_script_imported_by_its_path_runs_without_its_main_block(session, capsys):
    script = session.write(
        "scripts/bl_user_script.py",
        RECIPES + 'if __name__ == "__main__":\n    raise SystemExit("trained")\n',
    )
    code, _, err = cli(["run", "mine", "--import", "scripts/bl_user_script.py", *TRAIN,
                        "--run-dir", "r", "--quiet"], capsys)  # fmt: skip
    assert code == 0, err
    recorded = json.loads(Path("r/run.json").read_text())["recipe_module"]
    assert recorded == str(script.resolve())
    assert sys.modules["bl_user_script"].__file__ == str(script.resolve())
    session.new()
    code, _, err = cli(["evaluate", "r"], capsys)
    assert code == 2 and err == (
        "beatloop: error: recipe 'mine' is not registered in this process; it was registered "
        f"in script {script.resolve()}: pass --import {script.resolve()} if that script trains "
        'only under if __name__ == "__main__": (importing it runs the rest), or move the '
        "recipe into a module of its own and pass --import MODULE\n"
    )
    assert cli(["evaluate", "r", "--import", script.resolve()], capsys)[0] == 0


def test_a_recipe_of_a_script_or_a_session_records_where_it_was_registered(monkeypatch):
    class Defined:
        pass

    main_module = sys.modules["__main__"]
    monkeypatch.setattr(Defined, "__module__", "__main__")
    monkeypatch.setattr(main_module, "__file__", "/home/me/train.py", raising=False)
    monkeypatch.setattr(main_module, "__spec__", None, raising=False)
    assert user_modules.recipe_module(Defined) == "/home/me/train.py"
    monkeypatch.delattr(main_module, "__file__")
    assert user_modules.recipe_module(Defined) == "__main__"
    assert str(user_modules.not_registered("mine", "__main__")) == (
        "recipe 'mine' is not registered in this process; it was registered in an "
        "interactive session: register it in this process first (import a module that calls "
        "beatloop.register)"
    )


@pytest.mark.slow
def test_the_console_script_imports_from_the_working_dir(tmp_path):
    """The ``beatloop`` script (whose ``sys.path`` starts at its own folder, not the
    working dir) imports a module of the working dir, trains its recipe, and a later
    command without ``--import`` names the option."""
    (tmp_path / "bl_user_recipes.py").write_text(RECIPES)
    script = Path(sys.executable).parent / "beatloop"

    def beatloop_command(*args):  # forked with TensorFlow imported, as a new process
        with contextlib.chdir(tmp_path):
            process = start_python(script, *args)
        return finish(process, 300, args)

    done = beatloop_command("run", "mine", "--import", "bl_user_recipes", *TRAIN,
                            "--run-dir", "r", "--quiet")  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = beatloop_command("export", "r", "out", "--best")
    assert (done.returncode, done.stderr.splitlines()[-1]) == (2, (
        "beatloop: error: recipe 'mine' is not registered in this process; it was registered "
        "in module bl_user_recipes: pass --import bl_user_recipes"
    ))  # fmt: skip
    done = beatloop_command("export", "r", "out", "--best", "--import", "bl_user_recipes")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "model" / "saved_model.pb").is_file()


@pytest.mark.slow
def test_compare_and_tune_import_the_module_in_every_process(session, capsys):
    """Each compared run and each trial is a process of its own: it imports the modules
    ``--import`` names before it looks the recipe up, and ``best.toml`` names them."""
    pytest.importorskip("optuna")
    session.write("bl_user_recipes.py", RECIPES)
    code, _, err = cli(["compare", "mine", "--set", "batch_size=256", "--epochs", "1",
                          "--out", "cmp", "--import", "bl_user_recipes"], capsys)  # fmt: skip
    assert code == 0, err
    assert [row["label"] for row in json.loads(Path("cmp/compare.json").read_text())["rows"]] == [
        "mine batch_size=256"
    ]
    code, _, err = cli(["tune", "mine", "--import", "bl_user_recipes", "--space",
                          "hidden=int:8:16", "--set", "batch_size=256", "--trials", "1",
                          "--epochs", "1", "--out", "study"], capsys)  # fmt: skip
    assert code == 0, err
    assert Path("study/best.toml").read_text().splitlines()[2] == 'import = ["bl_user_recipes"]'
