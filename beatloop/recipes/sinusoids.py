"""Sinusoid regression tasks for meta-learning (Finn, Abbeel & Levine, "Model-Agnostic
Meta-Learning for Fast Adaptation of Deep Networks", ICML 2017, section 5.1): each task
is ``y = a sin(x - b)`` with its own amplitude and phase, seen through a few support
points to adapt on and query points to be judged on. Generated with numpy from a seed:
nothing is downloaded, and the same seed gives the same tasks."""

from __future__ import annotations

import numpy as np

from beatloop import DataSplit
from beatloop.datasets import batches

#: A batch's keys: whole tasks, ``(tasks, points, 1)`` each.
KEYS = ("support_x", "support_y", "query_x", "query_y")
#: Finn et al.'s ranges: amplitude in [0.1, 5], phase in [0, pi], inputs in [-5, 5].
AMPLITUDE, PHASE, INPUTS = (0.1, 5.0), (0.0, np.pi), (-5.0, 5.0)


def sinusoid_tasks(
    rng: np.random.Generator, tasks: int, support: int, query: int
) -> dict[str, np.ndarray]:
    """``tasks`` tasks as float32 arrays ``support_x``, ``support_y`` of shape
    ``(tasks, support, 1)`` and ``query_x``, ``query_y`` of shape ``(tasks, query, 1)``,
    plus each task's ``amplitude`` and ``phase`` (shape ``(tasks,)``)."""
    amplitude = rng.uniform(*AMPLITUDE, size=tasks)
    phase = rng.uniform(*PHASE, size=tasks)
    x = rng.uniform(*INPUTS, size=(tasks, support + query, 1))
    y = amplitude[:, None, None] * np.sin(x - phase[:, None, None])
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    return {
        "support_x": f32(x[:, :support]),
        "support_y": f32(y[:, :support]),
        "query_x": f32(x[:, support:]),
        "query_y": f32(y[:, support:]),
        "amplitude": f32(amplitude),
        "phase": f32(phase),
    }


def sinusoid_split(
    seed: int,
    train_tasks: int,
    validation_tasks: int,
    batch_size: int,
    support: int,
    query: int,
) -> DataSplit:
    """A fixed pool of training tasks, reshuffled every epoch and batched by whole tasks,
    and held-out validation tasks drawn after them from the same generator."""
    rng = np.random.default_rng(seed)
    drawn = [
        sinusoid_tasks(rng, count, support, query) for count in (train_tasks, validation_tasks)
    ]
    train, validation = ({key: tasks[key] for key in KEYS} for tasks in drawn)
    return DataSplit(
        batches(train, batch_size, shuffle_seed=seed),
        batches(validation, batch_size),
    )


def mean_sinusoid(x: np.ndarray) -> np.ndarray:
    """Every task's value at ``x`` averaged over the task distribution,
    ``E[a] E_b[sin(x - b)]``: the prediction with the lowest expected squared error for
    a task one knows nothing of."""
    low, high = PHASE
    mean_amplitude = sum(AMPLITUDE) / 2
    return mean_amplitude * (np.cos(x - high) - np.cos(x - low)) / (high - low)


def unadapted_floor(tasks: dict[str, np.ndarray]) -> float:
    """The query loss of ``mean_sinusoid`` on ``tasks``: the lowest any learner that
    does not adapt to a task's support points can expect, the line adaptation must cross."""
    return float(np.mean(np.square(tasks["query_y"] - mean_sinusoid(tasks["query_x"]))))
