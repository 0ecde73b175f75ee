"""The recipe, callback, data source and environment registry, filled through pluggy
from the built-in plugin and from every installed package's ``beatloop`` entry points.

Nothing loads at import: the registry fills the first time it is asked for a name. The
data source and environment wings sit below it and never import it; importing this
module hands them its lookups (``connect``), which load the plugins when first used.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pluggy
import tensorflow as tf

from beatloop.core.data import environment_lookup
from beatloop.core.data.environment import Environment
from beatloop.core.data.source import DataSource
from beatloop.core.events.callbacks import Callback
from beatloop.core.failures.errors import (
    ConfigError,
    RecipeNotFoundError,
    RegistrationError,
    did_you_mean,
)
from beatloop.core.running.recipe import Recipe, quality_problem
from beatloop.core.schedule.beats import Schedule
from beatloop.core.schedule.phases import Phases, schedules_of
from beatloop.plugins import builtin, hookspecs

BUILTIN = "built-in"
DISABLE_AUTOLOAD = hookspecs.DISABLE_AUTOLOAD


@attrs.frozen
class Entry:
    """A registered class and where it came from."""

    name: str
    cls: type
    #: "built-in", a distribution name, or where ``beatloop.register`` was called:
    #: "registered in script train.py" (a script run as ``__main__``), "registered in
    #: the interactive session", or "registered in <module>".
    origin: str
    #: The plugin's name; for a class registered at run time, its module.
    plugin: str
    #: Whether it was registered at run time (``beatloop.register``), not by a plugin.
    runtime: bool = False


@attrs.frozen
class PluginFailure:
    """A plugin that could not be loaded or whose hooks failed."""

    plugin: str
    origin: str
    error: str


@attrs.frozen
class Conflict:
    """One name registered by several plugins as different classes: usable by none."""

    kind: str  # "recipe", "callback", "data source" or "environment"
    name: str
    #: Each class with where it came from: ``pkg.Cls from plugin 'p' (dist)``.
    holders: tuple[str, ...]

    @property
    def message(self) -> str:
        return (
            f"{self.kind} {self.name!r} is registered by {' and by '.join(self.holders)}: "
            f"neither is used under that name; uninstall one of the packages or rename "
            f"one {self.kind}"
        )


def _holder(cls: type, plugin: str, origin: str) -> str:
    where = "beatloop (built-in)" if origin == BUILTIN else f"plugin {plugin!r} ({origin})"
    return f"{cls.__module__}.{cls.__qualname__} from {where}"


def check_recipe_class(cls: object, origin: str) -> None:
    """Refuse a class that cannot work as a recipe, listing every problem at once."""
    _refuse_problems("recipe", cls, Recipe, origin, build_config=False)


def check_source_class(cls: object, origin: str) -> None:
    """Refuse a class that cannot work as a data source, listing every problem at once."""
    _refuse_problems("data source", cls, DataSource, origin, build_config=True)


def check_environment_class(cls: object, origin: str) -> None:
    """Refuse a class that cannot work as an environment, listing every problem at once."""
    _refuse_problems("environment", cls, Environment, origin, build_config=True)


def _refuse_problems(kind: str, cls: object, base: type, origin: str, build_config: bool):
    """What recipes and data sources share: a subclass of ``base`` with an identifier
    ``name``, an attrs ``Config`` (built with its defaults, with ``build_config``) and no
    abstract method left; a recipe's default schedule is also tried. Every problem is
    listed in one RegistrationError."""
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise RegistrationError(
            f"{origin} registered {cls!r}, which is not a beatloop.{base.__name__} subclass"
        )
    problems = []
    if not isinstance(cls.name, str) or not cls.name.isidentifier():
        problems.append(f"it lacks a `name` that is a Python-style identifier (found {cls.name!r})")
    if not attrs.has(cls.Config):
        problems.append(f"it lacks a `Config` that is an attrs class (found {cls.Config!r})")
    elif build_config:
        try:
            _graph_first(cls.Config)
        except Exception as error:
            problems.append(f"its default config cannot be built: {_described(error)}")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        problems.append(f"it lacks the method(s) {', '.join(missing)}")
    if base is Recipe:
        quality = quality_problem(cls.quality_figure)
        problems += [quality] if quality else []
        problems += _default_problems(cls, missing)
    if problems:
        lines = "\n".join(f"  - {problem}" for problem in problems)
        raise RegistrationError(
            f"{kind} class {cls.__module__}.{cls.__qualname__} from {origin} has "
            f"{len(problems)} problem(s):\n{lines}"
        )


def _default_problems(cls: type[Recipe], missing: list[str]) -> list[str]:
    """Build the recipe's default config, schedule, losses and optimizers (no models, no
    data) so a schedule that cannot work fails at registration, not at training time.
    Methods in ``missing`` are skipped (a throwaway subclass stands in for them). Each
    call runs in a throwaway graph first (``_graph_first``): registering makes no
    variable and leaves TensorFlow's devices as they were."""
    try:
        stubs = dict.fromkeys(missing, _not_implemented)
        stand_in = type(cls.__name__, (cls,), stubs) if missing else cls
        recipe = _graph_first(lambda: stand_in(cls.Config()))
    except Exception as error:
        return [f"its default config cannot be built: {_described(error)}"]
    parts, problems = {}, []
    for method in ("schedule", "losses", "build_optimizers", "forwards"):
        if method in missing:
            continue
        try:
            parts[method] = _graph_first(getattr(recipe, method))
        except Exception as error:
            problems.append(f"{method}() fails on the default config: {_described(error)}")
    schedule = parts.get("schedule")
    if "schedule" in parts and not isinstance(schedule, Schedule | Phases):
        problems.append(
            f"schedule() must return a beatloop.Schedule (or beatloop.Phases), "
            f"got {_type(schedule)}"
        )
        schedule = None
    for method, kind in (
        ("losses", "loss"),
        ("build_optimizers", "optimizer"),
        ("forwards", "forward"),
    ):
        defined = parts.get(method)
        if method in parts and not isinstance(defined, Mapping):
            problems.append(f"{method}() must return a dict of {kind}s, got {_type(defined)}")
        elif schedule is not None and defined is not None:
            for each in schedules_of(schedule):
                problems += _unknown_names(each, defined, method, kind)
    return problems


def _unknown_names(schedule: Schedule, defined: Mapping, method: str, kind: str) -> list[str]:
    """The beats' losses (or optimizers, or the groups' forwards) that ``method`` does not
    define, as problems."""
    problems = []
    users = schedule.all_beats if kind != "forward" else schedule.groups
    for user in users:
        name = getattr(user, kind)
        if name not in defined:
            problems.append(
                f"{type(user).__name__.lower()} {user.name!r} uses {kind} {name!r}"
                f"{did_you_mean(name, defined)}, which {method}() does not define "
                f"(defined: {', '.join(defined) or 'none'})"
            )
    return problems


def _graph_first(call: Callable[[], Any]) -> Any:
    """``call()`` in a throwaway graph, where the optimizers and variables it makes are
    nodes that never run: eagerly, a Keras optimizer's variables would initialise
    TensorFlow's devices, and a script could no longer configure them (logical devices
    for a ``MirroredStrategy``) after registering a recipe. Code that needs eager tensors
    (a tensor's ``.numpy()``) raises in a graph: it is called again eagerly, as it always
    was, and only what it raises then counts."""
    try:
        with tf.Graph().as_default():
            return call()
    except Exception:
        return call()


def _not_implemented(*args, **kwargs):
    raise NotImplementedError


def _described(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _type(value: object) -> str:
    return type(value).__name__


class Registry:
    """Recipes, callbacks, data sources and environments by name, with their origins and
    the plugins that failed."""

    def __init__(self, load_entry_points: bool = True):
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.recipes: dict[str, Entry] = {}
        self.callbacks: dict[str, Entry] = {}
        self.sources: dict[str, Entry] = {}
        self.environments: dict[str, Entry] = {}
        self.failures: list[PluginFailure] = []
        #: Names two plugins registered as different classes, by table kind and name.
        self.conflicts: dict[tuple[str, str], Conflict] = {}
        self._origins: dict[str, str] = {}
        self._add_plugin(builtin, "beatloop.builtin", BUILTIN)
        if load_entry_points:
            self._load_entry_points()
        self._collect()

    # -- loading ------------------------------------------------------------------
    def _load_entry_points(self) -> None:
        for entry_point in importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
            origin = entry_point.dist.name if entry_point.dist else entry_point.value
            try:
                plugin = entry_point.load()
            except Exception as error:
                self._fail(
                    entry_point.name, origin, f"import failed: {type(error).__name__}: {error}"
                )
                continue
            self._add_plugin(plugin, entry_point.name, origin)

    def _add_plugin(self, plugin: object, name: str, origin: str) -> None:
        try:
            self.manager.register(plugin, name=name)
            self.manager.check_pending()
        except Exception as error:
            if self.manager.is_registered(plugin):
                self.manager.unregister(plugin)
            self._fail(name, origin, f"{type(error).__name__}: {error}")
            return
        self._origins[name] = origin

    def _fail(self, plugin: str, origin: str, error: str) -> None:
        self.failures.append(PluginFailure(plugin, origin, error))
        warnings.warn(
            f"beatloop plugin {plugin!r} ({origin}) was not loaded: {error}",
            RuntimeWarning,
            stacklevel=4,
        )

    def _collect(self) -> None:
        for hook, kind, check in (
            (self.manager.hook.register_recipes, "recipe", self._check_recipe),
            (self.manager.hook.register_callbacks, "callback", self._check_callback),
            (self.manager.hook.register_data_sources, "data source", check_source_class),
            (self.manager.hook.register_environments, "environment", check_environment_class),
        ):
            for impl in hook.get_hookimpls():
                origin = self._origins[impl.plugin_name]
                try:
                    classes = list(impl.function() or ())
                except Exception as error:
                    self._fail(impl.plugin_name, origin, f"{hook.name}() raised {error!r}")
                    continue
                for cls in classes:
                    try:
                        check(cls, f"plugin {impl.plugin_name!r} ({origin})")
                    except RegistrationError as error:
                        self._fail(impl.plugin_name, origin, str(error))
                        continue
                    self._add_collected(kind, cls, origin, impl.plugin_name)

    def _table(self, kind: str) -> dict[str, Entry]:
        return {
            "recipe": self.recipes,
            "callback": self.callbacks,
            "data source": self.sources,
            "environment": self.environments,
        }[kind]

    def _add_collected(self, kind: str, cls: type, origin: str, plugin: str) -> None:
        """Add a plugin's class; a name another plugin registered as another class
        becomes a ``Conflict``: a warning naming both, the name unusable, and every
        other name as it was (a clash costs no more than a plugin failing to load)."""
        table, name = self._table(kind), _name_of(cls)
        holder = _holder(cls, plugin, origin)
        conflict = self.conflicts.get((kind, name))
        if conflict is not None:
            if holder not in conflict.holders:
                self.conflicts[kind, name] = attrs.evolve(
                    conflict, holders=(*conflict.holders, holder)
                )
            return
        existing = table.get(name)
        if existing is None or existing.cls is cls:
            table[name] = Entry(name, cls, origin, plugin)
            return
        del table[name]
        first = _holder(existing.cls, existing.plugin, existing.origin)
        conflict = self.conflicts[kind, name] = Conflict(kind, name, (first, holder))
        warnings.warn(conflict.message, RuntimeWarning, stacklevel=4)

    def _refuse_conflict(self, kind: str, name: str) -> None:
        """A ``RegistrationError`` when ``name`` is a conflict of ``kind``."""
        conflict = self.conflicts.get((kind, name))
        if conflict is not None:
            raise RegistrationError(conflict.message)

    @staticmethod
    def _check_recipe(cls, origin):
        check_recipe_class(cls, origin)

    @staticmethod
    def _check_callback(cls, origin):
        if not (inspect.isclass(cls) and issubclass(cls, Callback)):
            raise RegistrationError(
                f"{origin} registered {cls!r}, which is not a beatloop.Callback subclass"
            )
        if not cls.callback_name.isidentifier():
            raise RegistrationError(
                f"callback class {cls.__qualname__} from {origin} needs a `callback_name` "
                f"identifier to be named on the command line (found {cls.callback_name!r})"
            )

    @staticmethod
    def _add(
        table: dict[str, Entry], cls: type, origin: str, plugin: str, runtime: bool = False
    ) -> None:
        name = _name_of(cls)
        existing = table.get(name)
        if existing is not None and existing.cls is not cls:
            raise RegistrationError(
                f"two classes are registered as {name!r}: {existing.cls.__module__}."
                f"{existing.cls.__qualname__} from {existing.origin} and {cls.__module__}."
                f"{cls.__qualname__} from {origin}; uninstall one or rename it"
            )
        table[name] = Entry(name, cls, origin, plugin, runtime)

    # -- lookups --------------------------------------------------------------------
    def register(self, cls: type) -> type:
        """Register a recipe class from a script or notebook, without packaging."""
        module = getattr(cls, "__module__", "?")
        check_recipe_class(cls, f"beatloop.register in {registration_place(module)}")
        self._refuse_conflict("recipe", cls.name)
        origin = _runtime_origin(module)
        self._add(self.recipes, cls, origin, cls.__module__, runtime=True)
        return cls

    def register_source(self, cls: type) -> type:
        """Register a data source class from a script or notebook, without packaging."""
        module = getattr(cls, "__module__", "?")
        check_source_class(cls, f"beatloop.register_data_source in {registration_place(module)}")
        self._refuse_conflict("data source", cls.name)
        origin = _runtime_origin(module)
        self._add(self.sources, cls, origin, cls.__module__, runtime=True)
        return cls

    def source(self, name: str) -> Entry:
        """The data source kind ``name`` (the ``KIND`` of ``--data KIND:PATH``)."""
        self._refuse_conflict("data source", name)
        return self._named(self.sources, name, "data source kind", "kinds")

    def source_names(self) -> list[str]:
        return sorted(self.sources)

    def register_environment(self, cls: type) -> type:
        """Register an environment class from a script or notebook, without packaging."""
        module = getattr(cls, "__module__", "?")
        place = registration_place(module)
        check_environment_class(cls, f"beatloop.register_environment in {place}")
        self._refuse_conflict("environment", cls.name)
        self._add(self.environments, cls, _runtime_origin(module), cls.__module__, runtime=True)
        return cls

    def environment(self, name: str) -> Entry:
        """The environment ``name`` (what the ``dqn`` recipe's ``env`` names)."""
        self._refuse_conflict("environment", name)
        return self._named(self.environments, name, "environment", "environments")

    def environment_names(self) -> list[str]:
        return sorted(self.environments)

    def _named(self, table: dict[str, Entry], name: str, kind: str, plural: str) -> Entry:
        """``table[name]``, or a ConfigError naming the known ones (and any plugin that
        failed to load, which may be where the missing one lives)."""
        try:
            return table[name]
        except KeyError:
            failed = "".join(
                f"; plugin {f.plugin} ({f.origin}) failed to load: {f.error}" for f in self.failures
            )
            raise ConfigError(
                f"no {kind} {name!r}{did_you_mean(name, table)}; known "
                f"{plural}: {', '.join(sorted(table)) or '(none)'}{failed}"
            ) from None

    def recipe(self, name: str) -> Entry:
        if not isinstance(name, str):
            raise TypeError(f"a recipe name is a string, got {type(name).__name__}")
        self._refuse_conflict("recipe", name)
        try:
            return self.recipes[name]
        except KeyError:
            failed = [f"{f.plugin} ({f.origin}): {f.error}" for f in self.failures]
            raise RecipeNotFoundError(name, self.recipes, failed) from None

    def callback(self, name: str) -> Entry:
        self._refuse_conflict("callback", name)
        try:
            return self.callbacks[name]
        except KeyError:
            raise RegistrationError(
                f"no callback named {name!r}{did_you_mean(name, self.callbacks)}; "
                f"known callbacks: {', '.join(sorted(self.callbacks)) or '(none)'}"
            ) from None

    def describe_origin(self, name: str) -> str:
        """``recipe 'x'``, plus where it came from when not built in: the plugin and its
        package, or where ``beatloop.register`` registered it."""
        entry = self.recipe(name)
        if entry.origin == BUILTIN:
            return f"recipe {name!r}"
        if not entry.runtime:
            return f"recipe {name!r} (plugin {entry.plugin!r} from {entry.origin})"
        place = registration_place(entry.plugin)
        if place.startswith("module "):
            return f"recipe {name!r} (registered by beatloop.register in {place})"
        return f"recipe {name!r} (registered in {place})"

    def recipe_names(self) -> list[str]:
        return sorted(self.recipes)


def _name_of(cls: type) -> str:
    """The name a registered class is found by: a callback's ``callback_name``."""
    return cls.callback_name if issubclass(cls, Callback) else cls.name


def registration_place(module: str) -> str:
    """Where ``beatloop.register`` was called for a class of ``module``, in words:
    ``script train.py`` (a script run as ``__main__``), ``the interactive session`` (a
    notebook or prompt) or ``module NAME``."""
    if module != "__main__":
        return f"module {module}"
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    return f"script {Path(script).name}" if script else "the interactive session"


def _runtime_origin(module: str) -> str:
    """An ``Entry.origin`` of a class registered at run time."""
    place = registration_place(module)
    return f"registered in {place.removeprefix('module ')}"


_REGISTRY: Registry | None = None


def registry() -> Registry:
    """The process-wide registry, filled on first use (entry points unless disabled)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry(load_entry_points=not _autoload_disabled())
    connect()
    return _REGISTRY


def connect() -> None:
    """Hand the engine the process-wide registry's lookup of environments: recipes make
    the environment their config names (``beatloop.make_environment``) below this module,
    which they cannot import (the built-in plugin imports the recipes). Loads nothing."""
    environment_lookup.use_lookup(_environment_class)


def _environment_class(name: str) -> type:
    """The environment ``name`` of the process-wide registry; while it is being built
    (its recipes' default configs name environments), the built-in plugin's."""
    if _REGISTRY is not None:
        return _REGISTRY.environment(name).cls
    built_in = {cls.name: cls for cls in builtin.register_environments()}
    if name not in built_in:
        raise ConfigError(
            f"no environment {name!r}{did_you_mean(name, built_in)} among the built-in ones "
            f"({', '.join(sorted(built_in))}): the registry is still being built"
        )
    return built_in[name]


def loaded_registry() -> Registry | None:
    """The process-wide registry if something has filled it already, else ``None``
    (nothing is loaded)."""
    return _REGISTRY


def reset_registry() -> None:
    """Forget the registry so the next lookup reloads plugins (after installing one)."""
    global _REGISTRY
    _REGISTRY = None


def _autoload_disabled() -> bool:
    return os.environ.get(DISABLE_AUTOLOAD, "").strip().lower() in {"1", "true", "yes", "on"}


def recipes() -> list[str]:
    """Sorted names of every registered recipe."""
    return registry().recipe_names()


def get_recipe(name: str) -> type[Recipe]:
    """The Recipe class registered as ``name``."""
    return registry().recipe(name).cls


def register(cls: type[Recipe]) -> type[Recipe]:
    """Register a recipe class at run time; usable as a class decorator."""
    return registry().register(cls)


def register_data_source(cls: type[DataSource]) -> type[DataSource]:
    """Register a data source class at run time; usable as a class decorator."""
    return registry().register_source(cls)


def register_environment(cls: type[Environment]) -> type[Environment]:
    """Register an environment class at run time; usable as a class decorator."""
    return registry().register_environment(cls)


connect()  # the wings' lookups, handed over on import; nothing is loaded
