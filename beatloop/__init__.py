"""beatloop: TensorFlow custom training loops as recipes of beats, run by one engine.

The public API is loaded on first attribute access, so ``import beatloop`` neither
imports TensorFlow nor loads plugins until something is used (the CLI relies on this to
quiet TensorFlow's start-up log before it loads). The access that first imports
TensorFlow keeps its start-up lines (the oneDNN banner, absl's) off standard error, as
the command does, and writes every other line on (``beatloop.fit`` in a script prints
no start-up line); TensorFlow imported before that prints them as usual.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    # running
    "fit": "beatloop.fitting",
    "make_recipe": "beatloop.fitting",
    "restore": "beatloop.fitting",
    "evaluate": "beatloop.fitting",
    "tune": "beatloop.tuning",
    "TuneResult": "beatloop.tuning",
    "FitResult": "beatloop.core.result",
    "Engine": "beatloop.core.engine",
    "EngineOptions": "beatloop.core.options",
    "DataSplit": "beatloop.core.batches",
    "loop_data": "beatloop.core.data_origin",
    # data sources (--data KIND:PATH)
    "DataSource": "beatloop.sources.base",
    "SourceConfig": "beatloop.sources.base",
    "load_data": "beatloop.sources.named",
    "register_data_source": "beatloop.plugins.registry",
    # environments (the dqn recipe's env)
    "Environment": "beatloop.environments.base",
    "register_environment": "beatloop.plugins.registry",
    # registry
    "recipes": "beatloop",  # the callable beatloop.recipes package; see its docstring
    "get_recipe": "beatloop.plugins.registry",
    "register": "beatloop.plugins.registry",
    "hookimpl": "beatloop.plugins.hookspecs",
    # writing recipes
    "Recipe": "beatloop.core.recipe",
    "Beat": "beatloop.core.beats",
    "Schedule": "beatloop.core.beats",
    "Phase": "beatloop.core.phases",
    "Phases": "beatloop.core.phases",
    "Group": "beatloop.core.beats",
    "ClipByGlobalNorm": "beatloop.core.beats",
    "ClipByNorm": "beatloop.core.beats",
    "ClipByValue": "beatloop.core.beats",
    "ClipValues": "beatloop.core.beats",
    "PCGrad": "beatloop.core.transforms",
    "Update": "beatloop.core.updates",
    "EMA": "beatloop.core.updates",
    "Copy": "beatloop.core.updates",
    "Act": "beatloop.core.updates",
    "ModelCalls": "beatloop.core.forward",
    "SuppliedModel": "beatloop.core.supplied",
    "bind": "beatloop.core.binding",
    # callbacks
    "Callback": "beatloop.core.callbacks",
    "Run": "beatloop.core.run",
    "EVENTS": "beatloop.core.callbacks",
    "Order": "beatloop.core.callbacks",
    "when": "beatloop.core.callbacks",
    "EventFilter": "beatloop.core.callbacks",
    "keras_callback": "beatloop.core.keras_callbacks",
    "KerasCallback": "beatloop.core.keras_callbacks",
    "History": "beatloop.plugins.callbacks",
    "ProgressBar": "beatloop.plugins.callbacks",
    "TrainingTimer": "beatloop.plugins.callbacks",
    "JsonLinesLogger": "beatloop.plugins.callbacks",
    "CsvLogger": "beatloop.plugins.callbacks",
    "EarlyStopping": "beatloop.plugins.callbacks",
    "TensorBoard": "beatloop.plugins.tensorboard",
    # errors
    "BeatloopError": "beatloop.core.errors",
    "ConfigError": "beatloop.core.errors",
    "DataError": "beatloop.core.errors",
    "InputMismatchError": "beatloop.core.errors",
    "LabelRangeError": "beatloop.core.errors",
    "ScheduleError": "beatloop.core.errors",
    "RecipeNotFoundError": "beatloop.core.errors",
    "RegistrationError": "beatloop.core.errors",
    "CallbackError": "beatloop.core.errors",
    "NumericsError": "beatloop.core.errors",
    "CollectiveError": "beatloop.core.collectives",
    "WorkerLostError": "beatloop.core.workers",
    "RunDirError": "beatloop.core.errors",
    "CheckpointError": "beatloop.core.errors",
    "RunInterrupted": "beatloop.core.errors",
    "UserCodeError": "beatloop.core.errors",
    "ResumeWarning": "beatloop.core.errors",
    "ReproducibilityWarning": "beatloop.core.errors",
    "RunawayLossWarning": "beatloop.core.errors",
    "IgnoredSettingWarning": "beatloop.core.errors",
    "InferredSettingWarning": "beatloop.sources.base",
    "DataChangedWarning": "beatloop.sources.identity",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'beatloop' has no attribute {name!r}")
    if name == "recipes":
        return _imported("beatloop.recipes")
    if name == "load_data":
        # it finds kinds by name: importing the registry's module hands it plugins' kinds
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


if TYPE_CHECKING:  # for type checkers and IDEs; never executed
    from beatloop.core.batches import DataSplit
    from beatloop.core.beats import (
        Beat,
        ClipByGlobalNorm,
        ClipByNorm,
        ClipByValue,
        ClipValues,
        Group,
        Schedule,
    )
    from beatloop.core.binding import bind
    from beatloop.core.callbacks import EVENTS, Callback, EventFilter, Order, when
    from beatloop.core.collectives import CollectiveError
    from beatloop.core.data_origin import loop_data
    from beatloop.core.engine import Engine
    from beatloop.core.errors import (
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
    from beatloop.core.forward import ModelCalls
    from beatloop.core.keras_callbacks import KerasCallback, keras_callback
    from beatloop.core.options import EngineOptions
    from beatloop.core.phases import Phase, Phases
    from beatloop.core.recipe import Recipe
    from beatloop.core.result import FitResult
    from beatloop.core.run import Run
    from beatloop.core.supplied import SuppliedModel
    from beatloop.core.transforms import PCGrad
    from beatloop.core.updates import EMA, Act, Copy, Update
    from beatloop.core.workers import WorkerLostError
    from beatloop.environments.base import Environment
    from beatloop.fitting import evaluate, fit, make_recipe, restore
    from beatloop.plugins.callbacks import (
        CsvLogger,
        EarlyStopping,
        History,
        JsonLinesLogger,
        ProgressBar,
    )
    from beatloop.plugins.hookspecs import hookimpl
    from beatloop.plugins.registry import (
        get_recipe,
        recipes,
        register,
        register_data_source,
        register_environment,
    )
    from beatloop.plugins.tensorboard import TensorBoard
    from beatloop.sources.base import DataSource, InferredSettingWarning, SourceConfig
    from beatloop.sources.identity import DataChangedWarning
    from beatloop.sources.named import load_data
    from beatloop.tuning import TuneResult, tune
