"""Where a run's training data come from, when that changes how it runs: the run's own
loop (``loop_data``: endless one-example "ticks" for a recipe whose acts make its data),
or Python state (``from_generator``, ``py_function``), which no checkpoint holds.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import attrs
import tensorflow as tf
from tensorflow.python.data.ops import structured_function

from beatloop.core.data.batches import DataSplit, pipeline
from beatloop.core.failures.errors import ConfigError, ResumeWarning

#: The batch key of loop data: each batch is ``{"tick": [0]}``, one example.
TICK = "tick"

#: Ops that run Python in a data set's graph: a generator's, or a ``py_function``'s /
#: ``numpy_function``'s.
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc", "GeneratorDataset"})


#: The attribute ``replayable`` marks a data set with.
_REPLAYABLE = "_beatloop_replayable"


#: What to evaluate a run on whose data are ``loop_data()`` without validation ticks.
LOOP_DATA_ADVICE = (
    "its data are the recipe's own loop's ticks (beatloop.loop_data()), which hold no "
    "validation data: pass data= with a finite run of ticks, e.g. "
    "beatloop.loop_data().train.take(10)"
)


def loop_data() -> DataSplit:
    """Training data for a recipe whose data its own loop makes (an agent acting in an
    environment, filling a buffer in recipe state): an endless data set of one-example
    batches ``{"tick": [0]}`` that only drives the steps. A recipe returns it from
    ``default_data`` and sets ``steps_per_epoch`` (or a run passes it). It holds no
    validation data: a recipe that evaluates returns
    ``DataSplit(ticks, validation=ticks.take(N))``, as ``dqn`` and ``ppo`` do; otherwise
    ``evaluate()`` needs ``data=``, a finite run of ticks
    (``beatloop.loop_data().train.take(N)``), and its error says so."""
    tick = tf.data.Dataset.from_tensors({TICK: tf.zeros([1], tf.int64)})
    return DataSplit(tick.repeat())


def is_loop_data(dataset: tf.data.Dataset) -> bool:
    """Whether ``dataset`` gives ``loop_data``'s batches (by its element spec)."""
    spec = dataset.element_spec
    return isinstance(spec, dict) and set(spec) == {TICK} and spec[TICK].shape == [1]


def recipe_options(options, recipe):
    """``options`` with the recipe's ``steps_per_epoch`` where the run gives none."""
    if options.steps_per_epoch is None and recipe.steps_per_epoch is not None:
        return attrs.evolve(options, steps_per_epoch=recipe.steps_per_epoch)
    return options


def refuse_endless_loop_data(dataset: tf.data.Dataset) -> None:
    """Loop data without ``steps_per_epoch``: a ConfigError saying what to set."""
    if is_loop_data(dataset):
        raise ConfigError(
            "the training data are made by the recipe's own loop (beatloop.loop_data(), "
            "endless ticks), so an epoch has no end of its own: set steps_per_epoch on the "
            "recipe (a class attribute) or pass steps_per_epoch=N"
        )


def replayable(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` marked as fed from Python that starts again, the same, at every pass
    (a generator reading files from their start, say): what it gives depends on no
    Python state a checkpoint misses, so a resumed run, which opens the passes again and
    skips the batches taken, continues exactly, and ``python_ops`` looks past it."""
    setattr(dataset, _REPLAYABLE, True)
    return dataset


def python_ops(dataset: tf.data.Dataset) -> list[str]:
    """The ops that run Python in ``dataset``'s pipeline (its own and its inputs'
    functions, and the functions those call), by type, but for those of a ``replayable``
    data set and its inputs; none when it cannot be read. The functions' graphs are
    read, not the data set's serialised graph, which would copy every array the
    pipeline holds."""
    found: set[str] = set()
    try:
        marked = [d for d in pipeline(dataset) if getattr(d, _REPLAYABLE, False)]
        exempt = {id(inner) for d in marked for inner in pipeline(d)}
        for current in pipeline(dataset):
            if id(current) in exempt:
                continue
            for value in vars(current).values():
                if isinstance(value, structured_function.StructuredFunctionWrapper):
                    found |= _graph_ops(value.function.graph.as_graph_def())
    except Exception:  # a data set of a shape TensorFlow's private API does not show
        return []
    return sorted(found & _PYTHON_OPS)


def _graph_ops(graph) -> set[str]:
    """The op types of a ``GraphDef``, those of its function library included."""
    found = {node.op for node in graph.node}
    for function in graph.library.function:
        found.update(node.op for node in function.node_def)
    return found


def warn_if_python_fed(dataset: tf.data.Dataset, label: str, run_dir: Path | None) -> None:
    """One ``ResumeWarning`` when a run with a run dir trains on data fed from Python
    state: a resumed run would not continue as the uninterrupted one."""
    found = python_ops(dataset) if run_dir is not None else []
    if not found:
        return
    warnings.warn(
        f"{label}: the training data set runs Python ({', '.join(found)}: from_generator, "
        "py_function or numpy_function), whose state (a generator's position, a Python "
        "buffer or environment) is in no checkpoint, so a resumed run cannot continue "
        "exactly as the uninterrupted one. For exact resume, keep that state in recipe "
        "state (Recipe.build_state) and make the data in the step with an Act entry "
        "(beatloop.loop_data()), or build the data with deterministic tf.data ops",
        ResumeWarning,
        stacklevel=3,
    )
