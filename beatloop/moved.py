"""Paths that moved, kept working for a while: every module path and name an earlier
release documented (or its built-in recipes imported) that now lives elsewhere, where it
went, and the release that removes the old path. An old path works as before and warns
once, with a ``DeprecationWarning`` naming the new path and that release.

``import beatloop`` appends a ``MovedFinder`` to ``sys.meta_path``: an old module path
(``import beatloop.data``) is served only where no module of that name exists, by a
module that hands every attribute over to the new one. A package whose names moved
answers their old spelling with ``moved_names`` (``from beatloop.sources import
load_data``). Old checkpoints name callbacks by class path; ``current_path`` reads such
a path as it is now. Imports nothing of beatloop, so anything may import it.

The policy (``docs/api.md``, ``CHANGELOG.md``): a deprecated path lives at least two
minor releases after the one that deprecates it, and is removed in a minor release,
never a patch one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Callable, Mapping

import attrs


@attrs.frozen
class Moved:
    """One old path and where it went: a module's (``new`` a module; ``names`` the ones
    that went elsewhere, by their old name) or a single name's (``new`` a dotted name)."""

    old: str
    new: str
    since: str = "0.2.0"
    removed_in: str = "0.4.0"
    names: Mapping[str, str] = attrs.field(factory=dict, converter=dict)

    def message(self) -> str:
        return (
            f"{self.old} is deprecated since beatloop {self.since}: use {self.new} "
            f"(the old path is removed in beatloop {self.removed_in})"
        )


_KINDS = {
    "FolderSource": "beatloop.sources.folder.FolderSource",
    "NpzSource": "beatloop.sources.npz.NpzSource",
    "CsvSource": "beatloop.sources.csv.CsvSource",
    "TfrecordSource": "beatloop.sources.tfrecord.TfrecordSource",
}

#: Old module paths, each served by an alias of its new module.
MODULES: tuple[Moved, ...] = (
    # 0.1's data modules, moved into beatloop/sources/ and then to the public datasets
    Moved("beatloop.data", "beatloop.datasets"),
    Moved("beatloop.sources.digits", "beatloop.datasets"),
    Moved("beatloop.sources.arrays", "beatloop.datasets"),
    Moved("beatloop.source_kinds", "beatloop.datasets", names=_KINDS),
    Moved("beatloop.csv_source", "beatloop.sources.csv"),
    Moved("beatloop.tfrecord_source", "beatloop.sources.tfrecord"),
    Moved("beatloop.source_base", "beatloop"),
    Moved("beatloop.sources.base", "beatloop"),
    Moved("beatloop.sources.named", "beatloop"),
    Moved("beatloop.data_identity", "beatloop"),
    Moved("beatloop.sources.identity", "beatloop"),
    Moved("beatloop.environment_base", "beatloop"),
    Moved("beatloop.environments.base", "beatloop"),
    Moved("beatloop.environments.registry", "beatloop"),
    Moved("beatloop.cache", "beatloop.files"),
    # the built-in callbacks, now in beatloop/callbacks/
    Moved("beatloop.plugins.callbacks", "beatloop"),
    Moved("beatloop.plugins.tensorboard", "beatloop"),
    # core's modules that held public names, before core was grouped into wings
    *(
        Moved(f"beatloop.core.{name}", "beatloop")
        for name in [
            "batches",
            "beats",
            "binding",
            "callbacks",
            "collectives",
            "config",
            "data_origin",
            "engine",
            "errors",
            "forward",
            "keras_callbacks",
            "options",
            "phases",
            "recipe",
            "result",
            "run",
            "supplied",
            "transforms",
            "updates",
            "workers",
        ]
    ),
)

#: Old names of packages that are still there, each resolved to its new path.
NAMES: tuple[Moved, ...] = (
    # beatloop.sources was a module before it was the data sources' package
    Moved("beatloop.sources.load_data", "beatloop.load_data"),
    Moved("beatloop.sources.NamedData", "beatloop.NamedData"),
    Moved("beatloop.sources.DataSource", "beatloop.DataSource"),
    Moved("beatloop.sources.SourceConfig", "beatloop.SourceConfig"),
    Moved("beatloop.sources.split_arrays", "beatloop.datasets.split_arrays"),
    *(Moved(f"beatloop.sources.{name}", path) for name, path in _KINDS.items()),
    # beatloop.environments was a module before it was the environments' package
    Moved("beatloop.environments.make_environment", "beatloop.make_environment"),
)

_BY_MODULE = {moved.old: moved for moved in MODULES}
_WARNED: set[str] = set()


def _resolve(path: str):
    """The object at a dotted ``path`` (a module, or a module's attribute)."""
    try:
        return importlib.import_module(path)
    except ImportError:
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)


def _warn_once(moved: Moved) -> None:
    """``moved``'s DeprecationWarning, the first time its old path is used, pointed at
    the line that used it: the first frame outside this module and the import system
    (whose frames ``warnings.warn`` passes over without counting them)."""
    if moved.old in _WARNED:
        return
    _WARNED.add(moved.old)
    level, frame = 2, sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename == __file__ or _in_import_system(frame.f_code.co_filename)
    ):
        level += frame.f_code.co_filename == __file__
        frame = frame.f_back
    warnings.warn(moved.message(), DeprecationWarning, stacklevel=level)


def _in_import_system(filename: str) -> bool:
    """Whether a frame of ``filename`` is the import system's (as ``warnings`` tells)."""
    return "importlib" in filename and "_bootstrap" in filename


class _Alias(types.ModuleType):
    """An old module path: its attributes are its new module's (or, for the names that
    went elsewhere, theirs)."""

    def __getattr__(self, name: str):
        moved = _BY_MODULE[self.__name__]
        if name in moved.names:
            return _resolve(moved.names[name])
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        try:
            return getattr(importlib.import_module(moved.new), name)
        except AttributeError:
            raise AttributeError(
                f"{self.__name__} (deprecated: now {moved.new}) has no attribute {name!r}"
            ) from None

    def __dir__(self) -> list[str]:
        moved = _BY_MODULE[self.__name__]
        return sorted(set(dir(importlib.import_module(moved.new))) | set(moved.names))


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths in ``MODULES`` and loads each as an ``_Alias``, warning."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in _BY_MODULE:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec) -> types.ModuleType:
        return _Alias(spec.name, f"Deprecated: see {_BY_MODULE[spec.name].new}.")

    def exec_module(self, module: types.ModuleType) -> None:
        _warn_once(_BY_MODULE[module.__name__])


def install() -> None:
    """Append one ``MovedFinder`` to ``sys.meta_path``, after the finders of real modules
    (once per process)."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedFinder())


def moved_names(package: str) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: its moved names (``NAMES``) resolved,
    warning once each and then kept in the package; any other name an AttributeError."""
    moved = {m.old.rpartition(".")[2]: m for m in NAMES if m.old.rpartition(".")[0] == package}

    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        _warn_once(moved[name])
        value = _resolve(moved[name].new)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def current_path(path: str) -> str | None:
    """Where the class or function an old dotted ``path`` named lives now
    (``beatloop.plugins.callbacks.History`` -> ``beatloop.callbacks.standard.History``),
    without warning; ``None`` when ``path`` is not in a moved module."""
    module, _, name = path.rpartition(".")
    moved = _BY_MODULE.get(module)
    if moved is None:
        return None
    try:
        found = _resolve(moved.names.get(name, f"{moved.new}.{name}"))
    except (ImportError, AttributeError):
        return None
    return f"{found.__module__}.{found.__qualname__}"
