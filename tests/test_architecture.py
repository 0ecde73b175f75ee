"""The code's shape, kept as docs/architecture.md describes it: no import cycle in the
package, and the engine no longer than a loop needs."""

from __future__ import annotations

import ast
from pathlib import Path

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
        path.name: len(path.read_text().splitlines()) for path in (PACKAGE / "core").glob("*.py")
    }
    assert sizes["engine.py"] <= 250
    assert max(sizes.values()) <= 350, sizes
    assert long_functions(PACKAGE / "core") == []


def long_functions(folder: Path, most: int = 60) -> list[str]:
    """The functions in ``folder``'s modules longer than ``most`` lines, with lengths."""
    return [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in folder.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > most
    ]


def package_graph() -> dict[str, set[str]]:
    """Every beatloop module's imports of the others, at module level and inside
    functions (lazy imports) alike, type-checking blocks included. ``from beatloop
    import data`` is an import of ``beatloop.sources.digits``: importing a submodule runs its
    package's ``__init__`` first, but a package that imports nothing at run time (as
    ``beatloop`` itself) closes no circle through it."""
    paths = {
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(
            ".__init__"
        ): path
        for path in PACKAGE.rglob("*.py")
    }
    modules, graph = set(paths), {}
    for name, path in paths.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = targets & modules - {name}
    return graph


def test_the_package_has_no_import_cycle_lazy_imports_included():
    graph = package_graph()
    assert {"beatloop.sources", "beatloop.plugins.registry", "beatloop.cli"} <= set(graph)
    assert "beatloop.sources.base" in graph["beatloop.plugins.registry"]  # imports were read
    assert cycles(graph) == []
