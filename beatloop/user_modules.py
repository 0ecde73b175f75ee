"""The user's own modules, imported only when named: ``--import MODULE`` on every command,
a run file's ``import = [...]``, and ``imports=`` of ``tune`` and ``compare`` (imported
again in each trial's or run's process) — as ``flask --app`` or ``uvicorn module:app``
name an application. beatloop never imports code on its own: a run's ``run.json``
records the module its recipe came from (``recipe_module``), and a command that needs
that recipe when it is not registered says which module to name.

A name is a dotted module name, importable from the current directory (put first on
``sys.path``, as ``python -m`` does) or ``sys.path``; or a path to a ``.py`` file,
imported as a module named after the file (its folder first on ``sys.path``, as
``python path/to/file.py`` would have it), so its ``if __name__ == "__main__":`` block does
not run. A module that calls ``beatloop.fit`` while it is being imported is refused: it
would train again, e.g. a script that trains at module level.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import sysconfig
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from beatloop.core.failures.errors import BeatloopError, RecipeNotFoundError


class ModuleImportError(BeatloopError, ImportError):
    """A module of the user's named to be imported (``--import MODULE``, a run file's
    ``import = [...]``, ``imports=`` of ``tune`` and ``compare``) that could not be: not
    found, it raised (that exception is the ``__cause__``) or exited, or it trains when
    imported. One line naming the module and what went wrong; exit code 2 (a beatloop
    error it raised keeps its own)."""


#: The names being imported now, innermost last (``refuse_while_importing`` reads it).
_IMPORTING: list[str] = []
#: Modules imported from a file path: module name -> the file's absolute path.
_FROM_FILES: dict[str, str] = {}
#: What ``recipe_module`` records for a recipe defined in a notebook or at a prompt.
INTERACTIVE = "__main__"


def is_file_path(name: str) -> bool:
    """Whether an ``--import`` value names a file (``path/to/recipes.py``), not a module."""
    return name.endswith(".py") or "/" in name or os.sep in name


def as_given_to_children(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as another process (a trial, a compared run) imports them: file paths
    made absolute, module names as they are (those processes share this working dir)."""
    return tuple(str(Path(n).expanduser().resolve()) if is_file_path(n) else n for n in names)


def import_modules(names: Sequence[str], option: str = "--import") -> list[ModuleType]:
    """Import each of ``names`` in order (one already imported is not run again); the
    first that fails is a ``ModuleImportError`` naming it with ``option`` (how the user
    named it: ``--import``, ``import = [...]``)."""
    return [import_module(name, option) for name in names]


def import_module(name: str, option: str = "--import") -> ModuleType:
    """The module ``name`` names (a dotted name or a ``.py`` file's path), imported."""
    if not isinstance(name, str) or not name.strip():
        raise ModuleImportError(
            f"{option} expects a module name (my_pkg.recipes) or a .py file's path, got {name!r}"
        )
    with _importing(name):
        return _import_file(name, option) if is_file_path(name) else _import_named(name, option)


@contextmanager
def _importing(name: str) -> Iterator[None]:
    _IMPORTING.append(name)
    try:
        yield
    finally:
        _IMPORTING.pop()


def _import_named(name: str, option: str) -> ModuleType:
    """A dotted module name, found from the current directory first, then ``sys.path``."""
    if not all(part.isidentifier() for part in name.split(".")):
        raise ModuleImportError(
            f"{option} {name}: not a module name; name a module as Python imports it "
            "(my_pkg.recipes for my_pkg/recipes.py) or a .py file's path"
        )
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and (name == error.name or name.startswith(f"{error.name}.")):
            raise ModuleImportError(
                f"{option} {name}: no module named {error.name!r} in the current directory "
                f"({here}) or on sys.path; name a module as Python imports it from here "
                "(my_pkg.recipes for my_pkg/recipes.py), or a .py file's path"
            ) from error
        raise _failed(option, name, error) from error
    except (Exception, SystemExit) as error:
        raise _failed(option, name, error) from error


def _import_file(name: str, option: str) -> ModuleType:
    """A ``.py`` file imported as the module named after it (its ``__name__`` is not
    ``"__main__"``); the same file again is the module already imported."""
    path = Path(name).expanduser().resolve()
    if path.suffix != ".py" or not path.is_file():
        raise ModuleImportError(
            f"{option} {name}: no such .py file ({path}); name a .py file or a module "
            "(my_pkg.recipes)"
        )
    module_name = path.stem
    existing = sys.modules.get(module_name)
    if existing is not None:
        if _FROM_FILES.get(module_name) == str(path) or _file_of(existing) == path:
            return existing
        raise ModuleImportError(
            f"{option} {name}: a module named {module_name!r} is imported already (from "
            f"{getattr(existing, '__file__', None) or 'Python itself'}); rename {path.name}"
        )
    if str(path.parent) not in sys.path:  # its sibling modules import, as when it runs
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    _FROM_FILES[module_name] = str(path)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:
        del sys.modules[module_name]
        del _FROM_FILES[module_name]
        raise _failed(option, name, error) from error
    return module


def _file_of(module: ModuleType) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file else None


def _failed(option: str, name: str, error: BaseException) -> ModuleImportError:
    """What a module that raised (or exited) while being imported is reported as: one
    line naming it, the exception and the user's line it came from. beatloop's own
    errors raised there keep their words (and their exit code)."""
    if isinstance(error, ModuleImportError):
        return error  # refuse_while_importing's: it names the module already
    if isinstance(error, SystemExit):
        failed = ModuleImportError(
            f"{option} {name}: it exited while being imported (SystemExit: {error.code}): "
            "does it read the command line or exit at module level? Put that under "
            'if __name__ == "__main__":'
        )
        return failed
    if isinstance(error, BeatloopError):
        failed = ModuleImportError(f"{option} {name} failed: {error}")
        failed.exit_code = error.exit_code
        return failed
    lines = str(error).strip().splitlines() or [""]
    text = f"{type(error).__name__}: {lines[0]}".rstrip(": ")
    return ModuleImportError(f"{option} {name} failed: {text}{_where(error)}")


def _where(error: BaseException) -> str:
    """`` (at FILE:LINE)``: the last line of the traceback in the user's own files (not
    Python's, an installed package's or beatloop's), or nothing."""
    skipped = tuple(
        {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    )
    own = str(Path(__file__).resolve().parent)
    found = ""
    for frame, line in traceback.walk_tb(error.__traceback__):
        file = frame.f_code.co_filename
        if file.startswith(("<", own, *skipped)):
            continue
        shown = os.path.relpath(file) if file.startswith(os.getcwd() + os.sep) else file
        found = f" (at {shown}:{line})"
    return found


def refuse_while_importing(call: str) -> None:
    """Refuse ``call`` (``beatloop.fit``) made by a module while ``--import`` imports it:
    a script that trains at module level would train again, where the user only asked
    for its recipe."""
    if _IMPORTING:
        name = _IMPORTING[-1]
        raise ModuleImportError(
            f"{call} was called while {name} was being imported (--import): it trains when "
            'imported; put its training under if __name__ == "__main__": (or in a '
            "function), so that importing it only registers its recipe"
        )


def recipe_module(cls: type) -> str:
    """Where a recipe class came from, as ``run.json`` records it (``recipe_module``):
    its module's dotted name; the file's absolute path for a module imported from a file
    (``--import path/to/recipes.py``) or a script run as ``python train.py``; the module
    run with ``python -m`` by its name; ``"__main__"`` for a notebook or a prompt."""
    module = cls.__module__
    if module in _FROM_FILES:
        return _FROM_FILES[module]
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return spec.name  # python -m my_pkg.train
    script = getattr(main, "__file__", None)
    return str(Path(script).resolve()) if script else INTERACTIVE


def registered_recipe(name: str, recorded_module: str | None = None) -> type:
    """The recipe class registered as ``name``; when there is none and the run recorded
    the module its recipe came from, a ``RecipeNotFoundError`` saying which module to
    import (``not_registered``)."""
    from beatloop.plugins.registry import get_recipe

    try:
        return get_recipe(name)
    except RecipeNotFoundError as error:
        if not recorded_module:
            raise
        raise not_registered(name, recorded_module, error.known) from None


def not_registered(name: str, module: str, known: Sequence[str] = ()) -> RecipeNotFoundError:
    """The error for a recorded run's recipe ``name`` that nothing registered in this
    process, saying where it was registered (``module``, as ``recipe_module`` recorded
    it) and what to import. Written for Python; the command line says which ``--import``
    to pass (``cli/spelling.py``)."""
    head = f"recipe {name!r} is not registered in this process"
    register = "register it in this process first (import a module that calls beatloop.register)"
    if module == INTERACTIVE:
        advice = f"it was registered in an interactive session: {register}"
    elif is_file_path(module):
        advice = f"it was registered in script {module}: {register}"
    elif module in sys.modules:
        advice = (
            f"it was registered in module {module}, which is imported but did not register "
            "it: does that module call beatloop.register when it is imported?"
        )
    else:
        advice = f"it was registered in module {module}: import that module first"
    return RecipeNotFoundError(name, known, message=f"{head}; {advice}")


def recorded_module(run_dir: str | Path) -> str | None:
    """The module ``RUN_DIR/run.json`` records its recipe came from (``None``: a run
    written before it was recorded, or no ``run.json``)."""
    from beatloop.core.saving.record import read_run_json

    module = read_run_json(Path(run_dir) / "run.json").get("recipe_module")
    return module if isinstance(module, str) and module else None
