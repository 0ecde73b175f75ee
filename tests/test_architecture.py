"""The code's shape, kept as docs/architecture.md describes it: no import cycle in the
package, every import pointing down its layers (core's wings among them), and the engine
no longer than a loop needs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "beatloop"


def imports_of(path: Path) -> set[str]:
    """The beatloop modules a file imports, type-checking imports included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = node.module
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("beatloop")}


def module_graph() -> dict[str, set[str]]:
    modules = {
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts): path
        for path in PACKAGE.rglob("*.py")
    }
    modules = {name.removesuffix(".__init__"): path for name, path in modules.items()}
    return {name: imports_of(path) & set(modules) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append([*trail[trail.index(target) :], target])
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_search_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_core_has_no_import_cycle():
    core = {name: deps for name, deps in module_graph().items() if name.startswith("beatloop.core")}
    core = {name: deps & set(core) for name, deps in core.items()}
    assert len(core) > 15  # the graph was read
    assert cycles(core) == []


def test_the_engine_is_a_loop_and_core_modules_stay_small():
    sizes = {
        path.name: len(path.read_text().splitlines()) for path in (PACKAGE / "core").rglob("*.py")
    }
    assert sizes["engine.py"] <= 250
    assert max(sizes.values()) <= 350, sizes
    assert long_functions(PACKAGE / "core") == []


def long_functions(folder: Path, most: int = 60) -> list[str]:
    """The functions in ``folder``'s modules longer than ``most`` lines, with lengths."""
    return [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in folder.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > most
    ]


def exported_from(package: Path) -> dict[str, str]:
    """The package's public names and the modules that define them (its ``__init__``'s
    ``_EXPORTS``, read without importing it)."""
    init = package / "__init__.py"
    if not init.exists():
        return {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_EXPORTS":
            return ast.literal_eval(node.value)
    return {}


def package_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every beatloop module's imports of the others, at module level and inside
    functions (lazy imports) alike, type-checking blocks included. ``from beatloop.recipes
    import views`` is an import of ``beatloop.recipes.views``, and ``from beatloop import
    Beat`` one of the module that defines ``Beat`` (``beatloop`` imports its public names
    on first use, so an import of one is an import of its module): importing a submodule
    runs its package's ``__init__`` first, but a package that imports nothing at run time
    (as ``beatloop`` itself) closes no circle through it."""
    paths = {
        ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(
            ".__init__"
        ): path
        for path in package.rglob("*.py")
    }
    exported = exported_from(package)
    modules, graph = set(paths), {}
    for name, path in paths.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    if node.module == package.name and alias.name in exported:
                        targets.add(exported[alias.name])
                    else:
                        targets.add(submodule if submodule in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = targets & modules - {name}
    return graph


def test_the_package_has_no_import_cycle_lazy_imports_included():
    graph = package_graph()
    assert {"beatloop.named_data.load", "beatloop.plugins.registry", "beatloop.cli"} <= set(graph)
    assert "beatloop.core.data.source" in graph["beatloop.plugins.registry"]  # imports were read
    assert cycles(graph) == []


#: The package's layers, lowest first: a module imports modules of its own layer and of
#: those below it, never of one above (function-level imports counted). ``NAME.*`` is a
#: package and everything in it; a module named exactly belongs to that layer even where
#: a package pattern also covers it.
LAYERS = (
    ("base", ("beatloop.moved",)),
    # core's wings, lowest first (docs/architecture.md has a table per wing)
    ("core: failures", ("beatloop.core", "beatloop.core.failures.*")),
    ("core: schedule", ("beatloop.core.schedule.*",)),
    ("core: data", ("beatloop.core.data.*",)),
    ("core: saving", ("beatloop.core.saving.*",)),
    ("core: devices", ("beatloop.core.devices.*",)),
    ("core: compiled", ("beatloop.core.compiled.*",)),
    ("core: feeding", ("beatloop.core.feeding.*",)),
    ("core: events", ("beatloop.core.events.*",)),
    ("core: running", ("beatloop.core.running.*",)),
    (
        "public modules",
        (
            "beatloop.datasets",
            "beatloop.files",
            "beatloop.images",
            "beatloop.layers",
            "beatloop.metrics",
            "beatloop.terminal",
        ),
    ),
    (
        "built-ins",
        (
            "beatloop.recipes.*",
            "beatloop.callbacks.*",
            "beatloop.sources.*",
            "beatloop.environments.*",
        ),
    ),
    ("plugins", ("beatloop.plugins.*",)),
    (
        "public face",
        (
            "beatloop",
            "beatloop.__main__",
            "beatloop.fitting",
            "beatloop.restoring",
            "beatloop.ignored_settings",
            "beatloop.named_data.*",
            "beatloop.compare",
            "beatloop.compare_report",
            "beatloop.forking",
            "beatloop.tuning.*",
            "beatloop.listing",
            "beatloop.run_file",
            "beatloop.user_modules",
            "beatloop.cli.*",
        ),
    ),
)


def layer_of(module: str) -> int | None:
    """The index in ``LAYERS`` of ``module``'s layer; ``None`` when it is in none."""
    for index, (_, patterns) in enumerate(LAYERS):
        if module in patterns:
            return index
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            package = pattern.removesuffix(".*")
            if pattern.endswith(".*") and (module == package or module.startswith(package + ".")):
                return index
    return None


def back_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module of a higher layer than the importer's, in words."""
    found = []
    for module in sorted(graph):
        for target in sorted(graph[module]):
            low, high = layer_of(module), layer_of(target)
            if low is not None and high is not None and high > low:
                found.append(f"{module} ({LAYERS[low][0]}) imports {target} ({LAYERS[high][0]})")
    return found


def test_every_module_has_a_layer_and_no_import_runs_back_up_one():
    graph = package_graph()
    assert [module for module in sorted(graph) if layer_of(module) is None] == []
    assert "beatloop.plugins.registry" in graph["beatloop.cli.cmd_data"]  # lazy ones read
    assert back_arrows(graph) == []


def test_the_layering_check_finds_a_planted_lazy_back_arrow(tmp_path):
    package = tmp_path / "beatloop"
    (package / "sources").mkdir(parents=True)
    (package / "plugins").mkdir()
    (package / "sources" / "named.py").write_text(
        "def kinds():\n    from beatloop.plugins.registry import registry\n    return registry()\n"
    )
    (package / "plugins" / "registry.py").write_text("from beatloop.sources import named\n")
    graph = package_graph(package)
    assert graph["beatloop.plugins.registry"] == {"beatloop.sources.named"}
    assert back_arrows(graph) == [
        "beatloop.sources.named (built-ins) imports beatloop.plugins.registry (plugins)"
    ]


def test_the_engine_finds_environments_through_the_registrys_lookup_alone():
    from beatloop.core.data import environment_lookup
    from beatloop.core.failures.errors import ConfigError
    from beatloop.plugins.registry import connect, registry

    environment_lookup.use_lookup(None)
    try:
        with pytest.raises(ConfigError, match="no environment 'chain' is known yet: environ"):
            environment_lookup.make_environment("chain")
    finally:
        connect()
    made = environment_lookup.make_environment("chain", ["length=5"])
    assert type(made) is registry().environment("chain").cls and made.config.length == 5
    with pytest.raises(ConfigError, match=r"no environment 'chian' \(did you mean 'chain'\?\)"):
        environment_lookup.make_environment("chian")


@pytest.mark.slow
def test_importing_the_wings_imports_neither_tensorflow_nor_their_modules():
    code = (
        "import sys, beatloop.sources, beatloop.environments, beatloop.recipes, "
        "beatloop.callbacks, beatloop.core; "
        "print(sorted(m for m in sys.modules if m.startswith(('beatloop', 'tensorflow'))))"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (
        shown.stdout.split("\n")[0] == "['beatloop', 'beatloop.callbacks', 'beatloop.core', "
        "'beatloop.environments', 'beatloop.moved', 'beatloop.recipes', 'beatloop.sources']"
    )
