"""Random draws that break exact resume: TensorFlow's global (stateful) random ops.

``tf.random.normal`` and its kin draw from TensorFlow's global seed and op-level state,
which no checkpoint holds, so a resumed run draws different numbers than the
uninterrupted one. Recipes draw from ``models.random``, the run's checkpointed
``tf.random.Generator``. The generator's ops and Keras 3's seeded randomness (``Dropout``,
``GaussianNoise``, ``keras.random`` with a ``SeedGenerator``) are stateless ops and are
not flagged here.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator, Mapping

import tensorflow as tf

from beatloop.core.failures.errors import ResumeWarning

#: Op types of TensorFlow's stateful random ops seeded from the global seed (as
#: ``tf.random.normal``, ``uniform``, ``truncated_normal``, ``categorical``, ``shuffle``,
#: ``gamma``, ``poisson``, ``tf.nn.dropout``, ``tf.image.random_*`` and the candidate
#: samplers of sampled losses create them in TensorFlow 2.21).
GLOBAL_RANDOM_OPS = frozenset(
    {
        "RandomStandardNormal",
        "RandomUniform",
        "RandomUniformInt",
        "TruncatedNormal",
        "ParameterizedTruncatedNormal",
        "RandomShuffle",
        "RandomCrop",
        "Multinomial",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "UniformCandidateSampler",
        "LogUniformCandidateSampler",
        "LearnedUnigramCandidateSampler",
        "ThreadUnsafeUnigramCandidateSampler",
        "FixedUnigramCandidateSampler",
        "AllCandidateSampler",
    }
)


def global_random_ops(operations: Iterable[tf.Operation]) -> list[str]:
    """The sorted op types among ``operations`` (graph operations), and in the functions
    they call (``tf.cond`` branches, loop bodies, nested ``tf.function``\\ s), that are
    global random ops."""
    operations = list(operations)
    found = {op.type for op in operations if op.type in GLOBAL_RANDOM_OPS}
    called = [name for op in operations for name in _called_functions(op.node_def)]
    if called:
        library = {f.signature.name: f for f in operations[0].graph.as_graph_def().library.function}
        seen: set[str] = set()
        while called:
            name = called.pop()
            if name in seen or name not in library:
                continue
            seen.add(name)
            for node in library[name].node_def:
                if node.op in GLOBAL_RANDOM_OPS:
                    found.add(node.op)
                called += [node.op, *_called_functions(node)]
    return sorted(found)


def _called_functions(node_def) -> list[str]:
    """The names of the functions a node's attributes name (branches, bodies, ``f``)."""
    names = []
    for value in node_def.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names += [f.name for f in value.list.func]
    return names


@contextlib.contextmanager
def new_operations() -> Iterator[list[tf.Operation]]:
    """A list that, once the block ends, holds the operations the block created in the
    default graph (in a ``tf.function`` being traced: its graph)."""
    graph = tf.compat.v1.get_default_graph()
    start = len(graph.get_operations())
    created: list[tf.Operation] = []
    yield created
    created.extend(graph.get_operations()[start:])


def warn_global_random(found: Mapping[str, list[str]], context: str) -> None:
    """One ``ResumeWarning`` per beat or group that uses global random ops
    (``found``: op types by what drew them, e.g. "the loss of beat 'x'")."""
    for where, op_types in found.items():
        if op_types:
            warnings.warn(
                f"{context}: {where} draws from TensorFlow's global random "
                f"ops ({', '.join(op_types)}), which no checkpoint holds, so a resumed run "
                "would draw different numbers; draw from the run's generator instead, "
                "models.random (e.g. models.random.normal(shape))",
                ResumeWarning,
                stacklevel=2,
            )
