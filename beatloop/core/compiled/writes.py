"""What an update or an act assigns, found at bind by tracing its function once.

An ``Update`` owns the model variables its ``writes`` select and may assign only those;
an ``Act`` writes recipe state only, never a model variable. ``write_problems`` traces
each user function once in a throwaway ``tf.function`` (nothing runs: no variable
changes, the run's generator and counters do not move) and reads the trainable model
variables its ops assign, following the variables into ``tf.cond`` branches, loop
bodies and nested ``tf.function``\\ s. The built-in ``EMA`` and ``Copy`` assign exactly
their targets and are not traced.
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import tensorflow as tf

from beatloop.core.compiled.bound import BoundUpdate
from beatloop.core.schedule.updates import Act, Update

#: Op types that write a resource variable: assignments, scatters and optimizer applies.
WRITING_OPS = (
    "Assign",
    "ResourceScatter",
    "ResourceApply",
    "ResourceSparseApply",
    "ResourceStridedSliceAssign",
)
#: Ops that call functions, and how many of their inputs precede the functions' arguments.
_LEADING_INPUTS = {"If": 1, "StatelessIf": 1, "Case": 1, "StatelessCase": 1}


def write_problems(
    updates, models: Mapping[str, keras.Layer], batch_spec, random, state, strategy=None
) -> list[str]:
    """Each update's model variables assigned outside its ``writes``, and each act's
    model variables assigned at all, as problems (one trace per ``Update`` and ``Act``)."""
    traced = [u for u in updates if isinstance(u.entry, Update | Act)]
    if not traced:
        return []
    owners = _variables(models)
    problems = []
    for update in traced:
        assigned = _assigned(update, models, batch_spec, random, state, strategy, owners)
        problems += _problems(update, assigned)
    return problems


def _variables(models) -> dict[int, tuple[keras.Variable, str]]:
    """Each trainable model variable and its model, by the id of each handle it has (a
    mirrored variable's copies each have one)."""
    found: dict[int, tuple[keras.Variable, str]] = {}
    for name, model in models.items():
        for variable in model.trainable_variables:
            inner = getattr(variable, "value", variable)
            parts = inner.values if isinstance(inner, tf.distribute.DistributedValues) else [inner]
            for part in parts:
                found.setdefault(id(part.handle), (variable, name))
    return found


def _assigned(update: BoundUpdate, models, batch_spec, random, state, strategy, owners) -> list:
    """The model variables (with their model) the entry's function assigns, traced once."""
    state = dict(state or {})
    if strategy is not None and isinstance(update.entry, Act):  # as once_per_step gives it
        state = {k: strategy.experimental_local_results(v)[0] for k, v in state.items()}

    def trace(batch):
        update.run(models, batch, random=random, state=state)
        return tf.constant(0)

    spec = dict(batch_spec or {})
    if strategy is None:
        graph = tf.function(trace, autograph=False).get_concrete_function(spec).graph
    else:
        with strategy.scope():
            graph = tf.function(trace, autograph=False).get_concrete_function(spec).graph
    known = {
        internal.name: owners[id(external)]
        for external, internal in graph.captures
        if id(external) in owners
    }
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    nodes = [
        (
            op.type,
            [t.name for t in op.inputs],
            op.node_def,
            op.outputs[0].name if op.outputs else "",
        )
        for op in graph.get_operations()
    ]
    found: dict[int, tuple] = {}
    _walk(nodes, known, library, found, set())
    return list(found.values())


def _walk(nodes, known: dict, library, found: dict, seen: set) -> None:
    """Note in ``found`` each ``known`` variable (by the name of the tensor holding its
    handle) that ``nodes`` (``(type, inputs, node_def, first output)``) write, in the
    functions they call too."""
    for kind, inputs, node_def, output in nodes:
        if not inputs:
            continue
        if kind == "Identity" and inputs[0] in known:
            known[output] = known[inputs[0]]
        elif kind.startswith(WRITING_OPS) and inputs[0] in known:
            variable, model = known[inputs[0]]
            found.setdefault(id(variable), (variable, model))
        offset = _LEADING_INPUTS.get(kind, 0)
        for name in _called(kind, node_def, library):
            args = [arg.name for arg in library[name].signature.input_arg]
            passed = {
                args[index - offset]: known[tensor]
                for index, tensor in enumerate(inputs)
                if tensor in known and 0 <= index - offset < len(args)
            }
            key = (name, tuple(sorted((arg, id(v)) for arg, (v, _) in passed.items())))
            if passed and key not in seen:
                seen.add(key)
                _walk(_function_nodes(library[name]), passed, library, found, seen)


def _called(kind: str, node_def, library) -> list[str]:
    """The library functions a node calls: those its attributes name (branches, bodies,
    ``f``), or its op type itself when that is a function."""
    names = [kind] if kind in library else []
    for value in node_def.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names += [f.name for f in value.list.func]
    return [name for name in names if name in library]


def _function_nodes(function) -> list[tuple]:
    """A library function's nodes as ``_walk`` takes them (control inputs left out)."""
    return [
        (node.op, [i for i in node.input if not i.startswith("^")], node, f"{node.name}:output:0")
        for node in function.node_def
    ]


def _problems(update: BoundUpdate, assigned) -> list[str]:
    """An act's model variables, or an update's outside its ``writes``, in words."""
    if isinstance(update.entry, Act):
        return [
            f"act {update.name!r} assigns variable {v.path!r} of model {model!r}: acts write "
            "recipe state only (models.state); assign model variables in an Update with "
            f"writes=, e.g. Update(fn, writes=({model!r},))"
            for v, model in assigned
        ]
    owned = {id(v) for v in update.writes}
    return [
        f"update {update.name!r} assigns variable {v.path!r} of model {model!r}, which its "
        f"writes= does not select (an update assigns only what it writes): add its model, "
        f"writes={(*update.entry.writes, model)!r}"
        for v, model in assigned
        if id(v) not in owned
    ]
