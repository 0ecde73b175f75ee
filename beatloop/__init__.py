"""beatloop: TensorFlow custom training loops as recipes of beats, run by one engine.

The public API is loaded on first attribute access, so ``import beatloop`` neither
imports TensorFlow nor loads plugins until something is used (the CLI relies on this to
quiet TensorFlow's start-up log before it loads). The access that first imports
TensorFlow keeps its start-up lines (the oneDNN banner, absl's) off standard error, as
the command does, and writes every other line on (``beatloop.fit`` in a script prints
no start-up line); TensorFlow imported before that prints them as usual.

What a plugin or a script may import is ``docs/api.md``'s list: the names in ``__all__``
and the modules in ``PUBLIC_MODULES``. Importing beatloop does two things besides: it
appends the finder of moved module paths to ``sys.meta_path`` (``beatloop.moved``: an
old path warns and works), and it keeps ``beatloop.recipes`` the public function when the
package of built-in recipes, which shares the name, is imported.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import TYPE_CHECKING

from beatloop import moved

__version__ = "0.2.0"

#: The public modules besides ``beatloop`` itself, by name: what recipe, callback and
#: source authors use, and the command line as a function (``docs/api.md``).
PUBLIC_MODULES = (
    "beatloop.cli",
    "beatloop.datasets",
    "beatloop.files",
    "beatloop.images",
    "beatloop.layers",
    "beatloop.metrics",
)

_EXPORTS = {
    # running
    "fit": "beatloop.fitting",
    "make_recipe": "beatloop.fitting",
    "restore": "beatloop.restoring",
    "evaluate": "beatloop.restoring",
    "tune": "beatloop.tuning",
    "TuneResult": "beatloop.tuning",
    "FitResult": "beatloop.core.running.result",
    "Engine": "beatloop.core.running.engine",
    "EngineOptions": "beatloop.core.running.options",
    "DataSplit": "beatloop.core.data.batches",
    "loop_data": "beatloop.core.data.data_origin",
    "NamedData": "beatloop.named_data.load",
    # data sources (--data KIND:PATH)
    "DataSource": "beatloop.core.data.source",
    "SourceConfig": "beatloop.core.data.source",
    "load_data": "beatloop.named_data.load",
    "register_data_source": "beatloop.plugins.registry",
    # environments (the dqn recipe's env)
    "Environment": "beatloop.core.data.environment",
    "make_environment": "beatloop.core.data.environment_lookup",
    "register_environment": "beatloop.plugins.registry",
    # registry
    "recipes": "beatloop.plugins.registry",  # kept over the package's name: _Beatloop
    "get_recipe": "beatloop.plugins.registry",
    "register": "beatloop.plugins.registry",
    "hookimpl": "beatloop.plugins.hookspecs",
    # writing recipes
    "Recipe": "beatloop.core.running.recipe",
    "Beat": "beatloop.core.schedule.beats",
    "Schedule": "beatloop.core.schedule.beats",
    "Phase": "beatloop.core.schedule.phases",
    "Phases": "beatloop.core.schedule.phases",
    "Group": "beatloop.core.schedule.beats",
    "ClipByGlobalNorm": "beatloop.core.schedule.beats",
    "ClipByNorm": "beatloop.core.schedule.beats",
    "ClipByValue": "beatloop.core.schedule.beats",
    "ClipValues": "beatloop.core.schedule.beats",
    "PCGrad": "beatloop.core.schedule.transforms",
    "Update": "beatloop.core.schedule.updates",
    "EMA": "beatloop.core.schedule.updates",
    "Copy": "beatloop.core.schedule.updates",
    "Act": "beatloop.core.schedule.updates",
    "ModelCalls": "beatloop.core.compiled.forward",
    "SuppliedModel": "beatloop.core.schedule.supplied",
    "bind": "beatloop.core.compiled.binding",
    "setting": "beatloop.core.schedule.config",
    "choice": "beatloop.core.schedule.config",
    # callbacks
    "Callback": "beatloop.core.events.callbacks",
    "Run": "beatloop.core.events.run",
    "EVENTS": "beatloop.core.events.callbacks",
    "Order": "beatloop.core.events.callbacks",
    "when": "beatloop.core.events.callbacks",
    "EventFilter": "beatloop.core.events.callbacks",
    "keras_callback": "beatloop.core.events.keras_callbacks",
    "KerasCallback": "beatloop.core.events.keras_callbacks",
    "History": "beatloop.callbacks.standard",
    "ProgressBar": "beatloop.callbacks.standard",
    "TrainingTimer": "beatloop.callbacks.standard",
    "JsonLinesLogger": "beatloop.callbacks.standard",
    "CsvLogger": "beatloop.callbacks.standard",
    "EarlyStopping": "beatloop.callbacks.standard",
    "TensorBoard": "beatloop.callbacks.tensorboard",
    "Profiler": "beatloop.callbacks.profiler",
    "MlflowLogger": "beatloop.callbacks.mlflow",
    # errors
    "BeatloopError": "beatloop.core.failures.errors",
    "ConfigError": "beatloop.core.failures.errors",
    "DataError": "beatloop.core.failures.errors",
    "InputMismatchError": "beatloop.core.failures.errors",
    "LabelRangeError": "beatloop.core.failures.errors",
    "ScheduleError": "beatloop.core.failures.errors",
    "RecipeNotFoundError": "beatloop.core.failures.errors",
    "ModuleImportError": "beatloop.user_modules",
    "RegistrationError": "beatloop.core.failures.errors",
    "CallbackError": "beatloop.core.failures.errors",
    "NumericsError": "beatloop.core.failures.errors",
    "CollectiveError": "beatloop.core.devices.collectives",
    "WorkerLostError": "beatloop.core.devices.workers",
    "RunDirError": "beatloop.core.failures.errors",
    "CheckpointError": "beatloop.core.failures.errors",
    "RunInterrupted": "beatloop.core.failures.errors",
    "UserCodeError": "beatloop.core.failures.errors",
    "ResumeWarning": "beatloop.core.failures.errors",
    "ReproducibilityWarning": "beatloop.core.failures.errors",
    "RunawayLossWarning": "beatloop.core.failures.errors",
    "NotRecordedWarning": "beatloop.core.saving.passed",
    "IgnoredSettingWarning": "beatloop.core.failures.errors",
    "InferredSettingWarning": "beatloop.core.data.source",
    "DataChangedWarning": "beatloop.named_data.identity",
    "TrackingWarning": "beatloop.callbacks.mlflow",
}

__all__ = sorted([*_EXPORTS, "PUBLIC_MODULES"])


#: Names that find kinds by name: the registry's module, imported first, hands its lookup.
_NEED_THE_REGISTRY = frozenset({"load_data", "make_environment"})


def __getattr__(name: str):
    if f"beatloop.{name}" in PUBLIC_MODULES:
        return _imported(f"beatloop.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'beatloop' has no attribute {name!r}")
    if name in _NEED_THE_REGISTRY:
        _imported("beatloop.plugins.registry")
    value = getattr(_imported(module), name)
    globals()[name] = value
    return value


def _imported(module: str):
    """``module``, imported with TensorFlow's start-up lines filtered out of standard
    error while TensorFlow is not imported yet (the import may be the one that does).
    The filter points descriptor 2 elsewhere while it lasts, so only the main thread
    sets one up: two threads doing so at once could leave it pointing at the wrong one."""
    if "tensorflow" in sys.modules or threading.current_thread() is not threading.main_thread():
        return importlib.import_module(module)
    from beatloop.terminal import start_up_filtered

    with start_up_filtered():
        return importlib.import_module(module)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Beatloop(types.ModuleType):
    """This module: importing a submodule binds it to its name here, which for the
    package of built-in recipes would hide the public ``beatloop.recipes()``; that one
    binding is skipped (the package stays ``sys.modules["beatloop.recipes"]``)."""

    def __setattr__(self, name: str, value) -> None:
        if name == "recipes" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Beatloop
moved.install()


if TYPE_CHECKING:  # for type checkers and IDEs; never executed
    from beatloop.callbacks.mlflow import MlflowLogger, TrackingWarning
    from beatloop.callbacks.profiler import Profiler
    from beatloop.callbacks.standard import (
        CsvLogger,
        EarlyStopping,
        History,
        JsonLinesLogger,
        ProgressBar,
        TrainingTimer,
    )
    from beatloop.callbacks.tensorboard import TensorBoard
    from beatloop.core.compiled.binding import bind
    from beatloop.core.compiled.forward import ModelCalls
    from beatloop.core.data.batches import DataSplit
    from beatloop.core.data.data_origin import loop_data
    from beatloop.core.data.environment import Environment
    from beatloop.core.data.environment_lookup import make_environment
    from beatloop.core.data.source import DataSource, InferredSettingWarning, SourceConfig
    from beatloop.core.devices.collectives import CollectiveError
    from beatloop.core.devices.workers import WorkerLostError
    from beatloop.core.events.callbacks import EVENTS, Callback, EventFilter, Order, when
    from beatloop.core.events.keras_callbacks import KerasCallback, keras_callback
    from beatloop.core.events.run import Run
    from beatloop.core.failures.errors import (
        BeatloopError,
        CallbackError,
        CheckpointError,
        ConfigError,
        DataError,
        IgnoredSettingWarning,
        InputMismatchError,
        LabelRangeError,
        NumericsError,
        RecipeNotFoundError,
        RegistrationError,
        ReproducibilityWarning,
        ResumeWarning,
        RunawayLossWarning,
        RunDirError,
        RunInterrupted,
        ScheduleError,
        UserCodeError,
    )
    from beatloop.core.running.engine import Engine
    from beatloop.core.running.options import EngineOptions
    from beatloop.core.running.recipe import Recipe
    from beatloop.core.running.result import FitResult
    from beatloop.core.saving.passed import NotRecordedWarning
    from beatloop.core.schedule.beats import (
        Beat,
        ClipByGlobalNorm,
        ClipByNorm,
        ClipByValue,
        ClipValues,
        Group,
        Schedule,
    )
    from beatloop.core.schedule.config import choice, setting
    from beatloop.core.schedule.phases import Phase, Phases
    from beatloop.core.schedule.supplied import SuppliedModel
    from beatloop.core.schedule.transforms import PCGrad
    from beatloop.core.schedule.updates import EMA, Act, Copy, Update
    from beatloop.fitting import fit, make_recipe
    from beatloop.named_data.identity import DataChangedWarning
    from beatloop.named_data.load import NamedData, load_data
    from beatloop.plugins.hookspecs import hookimpl
    from beatloop.plugins.registry import (
        get_recipe,
        recipes,
        register,
        register_data_source,
        register_environment,
    )
    from beatloop.restoring import evaluate, restore
    from beatloop.tuning import TuneResult, tune
    from beatloop.user_modules import ModuleImportError
