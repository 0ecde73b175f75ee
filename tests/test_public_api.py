"""The public surface (``docs/api.md``): recorded, so any change to it is a deliberate edit
of ``tests/public_api.txt``; enough to write the built-ins, which import nothing else;
and the paths earlier releases documented kept working, each warning once with its new
path and the release that removes it."""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.machinery
import inspect
import re
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
from api_surface import RECORD, describe

import beatloop
from beatloop import moved

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "beatloop"

#: The folders of built-ins, each written as a third-party plugin's would be.
BUILT_IN_FOLDERS = ("recipes", "callbacks", "sources", "environments")


def test_the_public_surface_is_its_record():
    now = describe()
    recorded = RECORD.read_text(encoding="utf-8").splitlines()
    changed = "\n".join(difflib.unified_diff(recorded, now, "recorded", "now", lineterm=""))
    assert now == recorded, (
        "the public surface differs from tests/public_api.txt. If the change is meant, "
        "write the record with `python tests/api_surface.py --write`, commit it with the "
        "change and say it in CHANGELOG.md (a removed or changed name needs a deprecation "
        f"first: beatloop/moved.py):\n{changed}"
    )


def test_the_record_would_see_a_changed_signature_and_a_changed_field():
    import attrs
    from api_surface import describe_name

    @attrs.frozen
    class Beat:
        loss: str
        optimizer: str = "adam"

    Beat.__module__ = "beatloop.core.schedule.beats"
    lines = describe_name("Beat", Beat, set())
    assert lines[0].startswith("Beat: attrs class (frozen)(object) Beat(loss: 'str'")
    assert lines[1:] == ["    field loss: str", "    field optimizer: str = 'adam'"]

    def fit(recipe, *, epochs: int = 1): ...

    assert describe_name("fit", fit, set()) == ["fit: function(recipe, *, epochs: 'int' = 1)"]


def test_the_record_lists_a_field_type_as_written_once_it_is_resolved():
    """``config_fields`` resolves a config's annotations to classes (``--set``, a source's
    settings); the record still lists each field's type as its source writes it, so it is
    the same whatever ran before it in the process."""
    from api_surface import describe_name

    from beatloop.core.schedule.config import config_fields

    config_fields(beatloop.SourceConfig)
    assert describe_name("SourceConfig", beatloop.SourceConfig, set())[1:] == [
        "    field batch_size: int | None = None",
        "    field validation_fraction: float = 0.0",
        "    field shuffle: bool = True",
    ]


def test_the_type_checking_imports_are_the_exports():
    """Type checkers, IDEs and the API reference see each public name where it is
    defined: the ``TYPE_CHECKING`` block of ``beatloop/__init__.py`` imports exactly
    ``_EXPORTS``, each from its module."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    typed = {alias.name: node.module for node in block.body for alias in node.names}
    assert typed == beatloop._EXPORTS


def public_path(path: str) -> bool:
    """Whether ``path`` (``beatloop.X.Y``) is importable from the public surface."""
    name = path.removeprefix("beatloop.").split(".")[0]
    if path == "beatloop" or name in beatloop.__all__ or path in beatloop.PUBLIC_MODULES:
        return True
    return any(
        path.startswith(f"{module}.")
        and path[len(module) + 1 :].split(".")[0] in importlib.import_module(module).__all__
        for module in beatloop.PUBLIC_MODULES
    )


def test_public_docstrings_name_only_public_paths():
    """What a plugin author reads (``help()``, the API reference) names the public
    import of a thing, never its internal module (``beatloop.sources``,
    ``beatloop.plugins.registry.recipes``): every public name's docstring and its
    class's members'. ``PUBLIC_MODULES`` is itself public: in ``__all__``, on the page."""
    assert "PUBLIC_MODULES" in beatloop.__all__
    assert "::: beatloop.PUBLIC_MODULES" in (ROOT / "docs" / "api.md").read_text()
    documented = {name: getattr(beatloop, name) for name in beatloop.__all__}
    for module in beatloop.PUBLIC_MODULES:
        found = importlib.import_module(module)
        documented.update({f"{module}.{name}": getattr(found, name) for name in found.__all__})
    for owner, obj in list(documented.items()):
        if isinstance(obj, type):
            members = {k: v for k, v in vars(obj).items() if not k.startswith("_")}
            documented.update({f"{owner}.{k}": v for k, v in members.items()})
    internal = {
        owner: ref.rstrip(".")
        for owner, obj in documented.items()
        for ref in re.findall(r"\bbeatloop(?:\.\w+)+", inspect.getdoc(obj) or "")
        if not public_path(ref.rstrip("."))
    }
    assert internal == {}


def test_the_version_is_one_in_the_package_the_project_and_the_changelog():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.M)
    assert project["project"]["version"] == beatloop.__version__ == released[0]
    assert f"version {beatloop.__version__}" in RECORD.read_text(encoding="utf-8")


# --- built-ins use the public surface alone -----------------------------------------


def _built_in_files(package: Path) -> list[Path]:
    files = [path for folder in BUILT_IN_FOLDERS for path in (package / folder).rglob("*.py")]
    return [*sorted(files), package / "plugins" / "builtin.py"]


def non_public_imports(package: Path, public_names, public_modules) -> list[str]:
    """Every import in a built-in of a beatloop module or name that is not public, in
    words. A built-in may import the public surface, modules of its own folder (the
    built-in plugin: of every built-in folder), and a built-in folder's ``__init__`` the
    helper answering the names the package had before (``beatloop.moved``)."""
    found = []
    for path in _built_in_files(package):
        relative = path.relative_to(package.parent)
        folder = relative.parts[1]
        own = (
            tuple(f"beatloop.{name}" for name in BUILT_IN_FOLDERS)
            if folder == "plugins"
            else (f"beatloop.{folder}",)
        )
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported = [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                imported = [(alias.name, None) for alias in node.names]
            else:
                continue
            for module, name in imported:
                if not (module == "beatloop" or module.startswith("beatloop.")):
                    continue
                if module == "beatloop":
                    ok = (
                        name is None or name in public_names or f"beatloop.{name}" in public_modules
                    )
                else:
                    ok = (
                        module in public_modules
                        or module.startswith(tuple(f"{o}." for o in own))
                        or module in own
                        or (path.name == "__init__.py" and module == "beatloop.moved")
                    )
                if not ok:
                    shown = module if name is None or module != "beatloop" else f"beatloop.{name}"
                    found.append(f"{relative}:{node.lineno} imports {shown}")
    return found


def test_built_ins_import_only_the_public_surface():
    found = non_public_imports(PACKAGE, set(beatloop.__all__), set(beatloop.PUBLIC_MODULES))
    assert found == []
    assert len(_built_in_files(PACKAGE)) > 25  # the files were read


def test_the_check_finds_a_planted_import_of_an_internal(tmp_path):
    package = tmp_path / "beatloop"
    for folder in (*BUILT_IN_FOLDERS, "plugins"):
        (package / folder).mkdir(parents=True)
    (package / "plugins" / "builtin.py").write_text("from beatloop.recipes.mine import Mine\n")
    (package / "recipes" / "mine.py").write_text(
        "from beatloop import Beat, Recipe\n"
        "from beatloop.datasets import digits\n"
        "from beatloop.core.schedule.beats import Schedule\n"
        "def later():\n    from beatloop import bound_schedule\n"
    )
    (package / "sources" / "kind.py").write_text("from beatloop.recipes import mine\n")
    found = non_public_imports(package, {"Beat", "Recipe"}, {"beatloop.datasets"})
    assert found == [
        "beatloop/recipes/mine.py:3 imports beatloop.core.schedule.beats",
        "beatloop/recipes/mine.py:5 imports beatloop.bound_schedule",
        "beatloop/sources/kind.py:1 imports beatloop.recipes",
    ]


def test_the_recipes_package_leaves_the_public_recipes_function_in_place():
    import beatloop.recipes.gan  # binds nothing over beatloop.recipes

    assert callable(beatloop.recipes) and "gan" in beatloop.recipes()
    from beatloop import recipes

    assert recipes is beatloop.recipes
    assert sys.modules["beatloop.recipes"].__name__ == "beatloop.recipes"
    from beatloop.recipes import gan  # the package's modules are still reached

    assert gan.Gan.name == "gan"


# --- old paths: deprecations, not breaks -----------------------------------------------

#: What each old module path held that the docs of earlier releases (and the built-in
#: recipes people copy) named, with where each is now.
DOCUMENTED = {
    "beatloop.data": ["digits", "digits_arrays", "batches"],
    "beatloop.sources.digits": ["digits", "digits_arrays", "batches"],
    "beatloop.sources.arrays": ["split_arrays"],
    "beatloop.source_kinds": ["split_arrays", "FolderSource", "NpzSource"],
    "beatloop.csv_source": ["CsvSource"],
    "beatloop.tfrecord_source": ["TfrecordSource"],
    "beatloop.source_base": ["DataSource", "SourceConfig", "InferredSettingWarning"],
    "beatloop.sources.base": ["DataSource", "SourceConfig", "InferredSettingWarning"],
    "beatloop.sources.named": ["load_data", "NamedData"],
    "beatloop.data_identity": ["DataChangedWarning"],
    "beatloop.sources.identity": ["DataChangedWarning"],
    "beatloop.environment_base": ["Environment"],
    "beatloop.environments.base": ["Environment"],
    "beatloop.environments.registry": ["make_environment"],
    "beatloop.plugins.callbacks": [
        "History", "ProgressBar", "TrainingTimer", "JsonLinesLogger", "CsvLogger", "EarlyStopping"
    ],
    "beatloop.plugins.tensorboard": ["TensorBoard"],
    "beatloop.cache": ["cache_dir"],
    "beatloop.core.batches": ["DataSplit"],
    "beatloop.core.beats": [
        "Beat", "Group", "Schedule", "ClipByGlobalNorm", "ClipByNorm", "ClipByValue", "ClipValues"
    ],
    "beatloop.core.binding": ["bind"],
    "beatloop.core.callbacks": ["Callback", "EVENTS", "Order", "when", "EventFilter"],
    "beatloop.core.collectives": ["CollectiveError"],
    "beatloop.core.config": ["setting", "choice"],
    "beatloop.core.data_origin": ["loop_data"],
    "beatloop.core.engine": ["Engine"],
    "beatloop.core.errors": [
        "BeatloopError", "ConfigError", "DataError", "InputMismatchError", "LabelRangeError",
        "ScheduleError", "RecipeNotFoundError", "RegistrationError", "CallbackError",
        "NumericsError", "RunDirError", "CheckpointError", "RunInterrupted", "UserCodeError",
        "ResumeWarning", "ReproducibilityWarning", "RunawayLossWarning", "IgnoredSettingWarning",
    ],
    "beatloop.core.forward": ["ModelCalls"],
    "beatloop.core.keras_callbacks": ["keras_callback", "KerasCallback"],
    "beatloop.core.options": ["EngineOptions"],
    "beatloop.core.phases": ["Phase", "Phases"],
    "beatloop.core.recipe": ["Recipe"],
    "beatloop.core.result": ["FitResult"],
    "beatloop.core.run": ["Run"],
    "beatloop.core.supplied": ["SuppliedModel"],
    "beatloop.core.transforms": ["PCGrad"],
    "beatloop.core.updates": ["Update", "EMA", "Copy", "Act"],
    "beatloop.core.workers": ["WorkerLostError"],
}  # fmt: skip


def _now(entry: moved.Moved, name: str):
    """Where ``name`` of the old module ``entry`` is now."""
    path = entry.names.get(name, f"{entry.new}.{name}")
    module, _, attribute = path.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


@pytest.fixture
def first_use(monkeypatch):
    """Each old path as on its first use in a process: none has warned, no alias is
    imported, no moved name is kept in its package; and so again after the test."""
    monkeypatch.setattr(moved, "_WARNED", set())
    old_names = [entry.old.rpartition(".") for entry in moved.NAMES]

    def forget():
        for entry in moved.MODULES:
            sys.modules.pop(entry.old, None)
            parent, _, child = entry.old.rpartition(".")
            if isinstance(vars(sys.modules[parent]).get(child), moved._Alias):
                delattr(sys.modules[parent], child)  # the import bound it there
        for package, _, name in old_names:
            vars(importlib.import_module(package)).pop(name, None)

    forget()
    yield
    forget()


def test_every_moved_module_is_one_the_docs_named():
    assert sorted(entry.old for entry in moved.MODULES) == sorted(DOCUMENTED)


@pytest.mark.parametrize("entry", moved.MODULES, ids=lambda entry: entry.old)
def test_an_old_module_path_warns_once_and_holds_what_it_held(entry, first_use):
    with pytest.warns(DeprecationWarning) as caught:
        exec(f"import {entry.old} as old_module", namespace := {})
    message = str(caught[0].message)
    assert [str(w.message) for w in caught] == [entry.message()]
    assert message.startswith(f"{entry.old} is deprecated since beatloop 0.2.0: use {entry.new}")
    assert message.endswith(f"(the old path is removed in beatloop {entry.removed_in})")
    assert caught[0].filename == "<string>"  # the line that imported it
    old_module = namespace["old_module"]
    for name in DOCUMENTED[entry.old]:
        assert getattr(old_module, name) is _now(entry, name), name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(f"from {entry.old} import {DOCUMENTED[entry.old][0]}", {})  # once: silent now
    with pytest.raises(AttributeError, match=rf"{re.escape(entry.old)} \(deprecated: now"):
        old_module.no_such_name  # noqa: B018


@pytest.mark.parametrize("entry", moved.NAMES, ids=lambda entry: entry.old)
def test_an_old_name_of_a_package_warns_once_and_is_the_new_one(entry, first_use):
    package, _, name = entry.old.rpartition(".")
    with pytest.warns(DeprecationWarning, match=re.escape(entry.message())) as caught:
        exec(f"from {package} import {name} as found", namespace := {})
    assert len(caught) == 1 and caught[0].filename == "<string>"
    module, _, attribute = entry.new.rpartition(".")
    assert namespace["found"] is getattr(importlib.import_module(module), attribute)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(f"from {package} import {name}", {})


def test_a_package_without_a_moved_name_says_it_has_no_such_attribute():
    import beatloop.sources

    with pytest.raises(AttributeError, match=r"module 'beatloop\.sources' has no attribute 'nope'"):
        beatloop.sources.nope  # noqa: B018


def test_a_moved_class_path_reads_as_it_is_now():
    from beatloop import History

    assert moved.current_path("beatloop.plugins.callbacks.History") == (
        f"{History.__module__}.{History.__qualname__}"
    )
    assert moved.current_path("beatloop.callbacks.standard.History") is None  # not moved
    assert moved.current_path("beatloop.plugins.callbacks.NoSuchClass") is None
    assert moved.current_path("beatloop.source_kinds.FolderSource") == (
        "beatloop.sources.folder.FolderSource"
    )


def test_the_finder_serves_only_moved_paths_after_the_real_modules():
    finders = [finder for finder in sys.meta_path if isinstance(finder, moved.MovedFinder)]
    assert len(finders) == 1
    assert sys.meta_path.index(finders[0]) > sys.meta_path.index(importlib.machinery.PathFinder)
    moved.install()  # again: still one
    assert sum(isinstance(finder, moved.MovedFinder) for finder in sys.meta_path) == 1
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("beatloop.core.no_such_module")
