"""Where a step's time goes: beatloop's compiled call beside Keras ``fit``'s and a
hand-written 32-steps-per-call loop's, op type by op type.

The three loops of ``engine_overhead.py`` (the 784-64-10 classifier, Adam, a loss mean
and sparse categorical accuracy) each train a few epochs under the TensorFlow profiler,
at their defaults (beatloop without a seed: op determinism off, under which TensorFlow's
cross-entropy would run as composite ops); the trace's op events (the ``.xplane.pb``)
are summed per op type and divided by the steps run. A second table counts the ops each
loop's traced graph runs per step (its while loop's body, by type), read from the
concrete functions' graphs.

    python benchmarks/profile_step.py                  # batch 32, spe=32
    python benchmarks/profile_step.py --batch-size 256 --top 40
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import collections
import glob
import tempfile

import engine_overhead as eo
import keras
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

import beatloop

LOOPS = ("beatloop", "keras", "handwritten")
#: Op types of the iterator, the while loop and its conditionals: per call, not per op
#: of the model, but counted per step as the rest.
CONTROL = {"While", "StatelessWhile", "If", "StatelessIf", "PartitionedCall"}


#: The executor's per-op bookkeeping, which encloses the op events (not in the total).
EXECUTOR = "(executor: ExecutorState::Process)"


def profiled(run) -> collections.Counter:
    """Microseconds per op type of the op events the profiler saw while ``run()`` ran."""
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            run()
        finally:
            tf.profiler.experimental.stop()
        totals = collections.Counter()
        for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True):
            space = xplane_pb2.XSpace()
            with open(path, "rb") as file:
                space.ParseFromString(file.read())
            for plane in space.planes:
                totals.update(_op_times(plane))
    return totals


def _op_times(plane) -> collections.Counter:
    """Per op type, the summed duration (µs) of a host plane's TensorFlow op events
    (``op name:Type`` on the executor's ``tf_Compute`` lines, the iterator's ops on
    their own lines), plus the executor's own per-op bookkeeping (``ExecutorState``)."""
    totals = collections.Counter()
    names = {key: meta.name for key, meta in plane.event_metadata.items()}
    for line in plane.lines:
        if not line.name.startswith(("tf_Compute", "tf_data_iterator_get_next")):
            continue
        for event in line.events:
            name = names.get(event.metadata_id, "")
            if name == "ExecutorState::Process":
                totals[EXECUTOR] += event.duration_ps / 1e6
            elif ":" in name and "::" not in name:
                totals[name.rsplit(":", 1)[1]] += event.duration_ps / 1e6
            elif name.startswith("IteratorGetNext"):
                totals[name.split("::")[0]] += event.duration_ps / 1e6
    return totals


def graph_ops(function) -> collections.Counter:
    """Op types a concrete function runs per step: the body of its (first) while loop,
    nested functions (conditionals, the step) included; the whole graph without one."""
    graph_def = function.graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}
    bodies = [
        node.attr["body"].func.name
        for node in graph_def.node
        if node.op in ("While", "StatelessWhile")
    ]
    counts = collections.Counter()

    def visit(nodes, seen):
        for node in nodes:
            counts[node.op] += 1
            for attr in node.attr.values():
                names = [attr.func.name] + [f.name for f in attr.list.func]
                for name in names:
                    if name in library and name not in seen:
                        seen.add(name)
                        visit(library[name].node_def, seen)

    if bodies:
        visit(library[bodies[0]].node_def, {bodies[0]})
    else:
        visit(graph_def.node, set())
    return counts


def beatloop_loop(dataset, weights, epochs, spe):
    """beatloop's fit; returns ``(run, concrete function)``."""
    holder = {}

    def run():
        result = beatloop.fit(
            "supervised",
            data=(dataset, None),
            models={"model": eo.fresh_model(weights)},
            optimizers={"optimizer": eo.make_optimizer()},
            epochs=epochs,
            steps_per_execution=spe,
            progress=False,
        )
        holder["function"] = result.engine.parts.train_loop._multi

    return run, holder


def keras_loop(dataset, weights, epochs, spe):
    holder = {}

    def run():
        model = eo.fresh_model(weights)
        model.compile(
            optimizer=eo.make_optimizer(),
            loss=eo.make_loss(),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            steps_per_execution=spe,
        )
        model.fit(dataset, epochs=epochs, shuffle=False, verbose=0)
        holder["function"] = _keras_concrete(model, dataset)

    return run, holder


def _keras_concrete(model, dataset):
    """The concrete function Keras ``fit`` traced (its ``multi_step_on_iterator``)."""
    function = model.train_function
    for cell in getattr(function, "__closure__", None) or ():
        inner = cell.cell_contents
        if isinstance(inner, tf.types.experimental.PolymorphicFunction):
            concretes = inner._list_all_concrete_functions()
            if concretes:
                return concretes[0]
    return None


def handwritten_loop(dataset, weights, epochs, spe):
    holder = {}

    def run():
        model = eo.fresh_model(weights)
        optimizer = eo.make_optimizer()
        optimizer.build(model.trainable_variables)
        metrics = eo.TrainMetrics()
        step = eo.make_train_step(model, optimizer, metrics)
        run_epoch = eo.multi_step_epoch(step, dataset, spe)
        for _ in range(epochs):
            metrics.reset()
            run_epoch()
            metrics.results()
        holder["function"] = _closure_function(run_epoch)

    return run, holder


def _closure_function(run_epoch):
    for cell in run_epoch.__closure__ or ():
        inner = cell.cell_contents
        if isinstance(inner, tf.types.experimental.PolymorphicFunction):
            return inner._list_all_concrete_functions()[0]
    return None


BUILDERS = {"beatloop": beatloop_loop, "keras": keras_loop, "handwritten": handwritten_loop}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--examples", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--spe", type=int, default=eo.MULTI_STEP)
    parser.add_argument("--top", type=int, default=30, help="op types shown")
    args = parser.parse_args(argv)
    x, y = eo.make_arrays(args.examples)
    weights = eo.initial_weights()
    dataset = eo.make_dataset(x, y, args.batch_size)
    steps = -(-args.examples // args.batch_size) * args.epochs
    times, counts = {}, {}
    for key in LOOPS:
        eo.as_users_run()  # op determinism off, as each loop runs at its defaults
        warm, _ = BUILDERS[key](dataset, weights, 1, args.spe)
        profiled(warm)  # imports, first traces and the profiler's own start, not counted
        run, holder = BUILDERS[key](dataset, weights, args.epochs, args.spe)
        times[key] = profiled(run)
        counts[key] = graph_ops(holder["function"]) if holder.get("function") else None
    print(
        f"µs per step by op type (profiler op events; batch {args.batch_size}, "
        f"spe={args.spe}, {args.epochs} epochs of {args.examples} examples, tracing "
        "included, so rare types may hold trace-time ops)"
    )
    _table(times, lambda t, op: t.get(op, 0.0) / steps, args.top, "{:>12.2f}", EXECUTOR)
    print("\nops per step in each traced graph (while loop body, nested functions included)")
    shown = {k: v for k, v in counts.items() if v is not None}
    _table(shown, lambda c, op: c.get(op, 0), args.top, "{:>12d}")
    print("\nop types whose count differs (beatloop minus hand-written, Keras fit)")
    if {"beatloop", "handwritten", "keras"} <= set(shown):
        ops = set().union(*(set(c) for c in shown.values()))
        for op in sorted(ops):
            b, h, k = (shown[key].get(op, 0) for key in ("beatloop", "handwritten", "keras"))
            if b != h or b != k:
                print(f"{op:<34}{b - h:>+12d}{b - k:>+12d}")


def _table(columns, value, top, cell, apart: str = "") -> None:
    """Rows by op type, largest first, and a total (without ``apart``: a row that
    encloses the others)."""
    keys = list(columns)
    ops = collections.Counter()
    for key in keys:
        for op in columns[key]:
            ops[op] = max(ops[op], value(columns[key], op))
    header = f"{'op type':<34}" + "".join(f"{k:>12}" for k in keys)
    print(header)
    print("-" * len(header))
    for op, _ in ops.most_common(top):
        print(f"{op:<34}" + "".join(cell.format(value(columns[k], op)) for k in keys))
    totals = [sum(value(columns[k], op) for op in ops if op != apart) for k in keys]
    print(
        f"{'all op types' + (' (executor apart)' if apart else ''):<34}"
        + "".join(cell.format(t) for t in totals)
    )


if __name__ == "__main__":
    main()
