"""The built-in recipes, callbacks, data sources and environments, registered through
the same hooks as plugins."""

from __future__ import annotations

from beatloop import hookimpl


@hookimpl
def register_recipes() -> list[type]:
    from beatloop.recipes.contrastive import Contrastive
    from beatloop.recipes.dqn import Dqn
    from beatloop.recipes.gan import Gan
    from beatloop.recipes.meta import Meta
    from beatloop.recipes.multitask import Multitask
    from beatloop.recipes.ppo import Ppo
    from beatloop.recipes.recommender import Recommender
    from beatloop.recipes.risk_weighted import RiskWeighted
    from beatloop.recipes.style_transfer import StyleTransfer
    from beatloop.recipes.supervised import Supervised

    return [Supervised, Gan, StyleTransfer, RiskWeighted, Multitask, Contrastive, Dqn, Meta,
            Ppo, Recommender]  # fmt: skip


@hookimpl
def register_callbacks() -> list[type]:
    from beatloop.callbacks.mlflow import MlflowLogger
    from beatloop.callbacks.profiler import Profiler
    from beatloop.callbacks.standard import (
        CsvLogger,
        EarlyStopping,
        JsonLinesLogger,
        ProgressBar,
        TrainingTimer,
    )
    from beatloop.callbacks.tensorboard import TensorBoard

    return [
        ProgressBar, JsonLinesLogger, CsvLogger, EarlyStopping, TensorBoard, TrainingTimer,
        Profiler, MlflowLogger,
    ]  # fmt: skip


@hookimpl
def register_data_sources() -> list[type]:
    from beatloop.sources.csv import CsvSource
    from beatloop.sources.folder import FolderSource
    from beatloop.sources.npz import NpzSource
    from beatloop.sources.parquet import ParquetSource
    from beatloop.sources.tfds import TfdsSource
    from beatloop.sources.tfrecord import TfrecordSource

    return [FolderSource, CsvSource, NpzSource, ParquetSource, TfdsSource, TfrecordSource]


@hookimpl
def register_environments() -> list[type]:
    from beatloop.environments.kinds import CartPole, Chain

    return [Chain, CartPole]
