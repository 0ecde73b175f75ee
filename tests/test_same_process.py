"""Same seed, same bits, in one process: a run's graphs do not depend on what the process
built before it (Keras's automatic names are counted per run), and models the user
passes whose names would order the graph otherwise are warned about."""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

import keras
import pytest
from helpers import (
    all_weights,
    assert_same_weights,
    classifier,
    dict_batches,
    load_npz,
    run_python,
)

import beatloop
from beatloop.core.running.naming import RunNames, history_named
from beatloop.plugins.registry import registry

WORKERS = Path(__file__).parent / "workers"
WORKER = WORKERS / "same_process.py"
sys.path.insert(0, str(WORKERS))
import same_process  # noqa: E402  (the worker's recipes and runs, fitted here in-process)

#: The automatic names the runs below take (Keras counts each prefix on its own).
PREFIXES = (
    "sequential", "input_layer", "dense", "conv2d", "conv2d_transpose", "batch_normalization",
    "leaky_re_lu", "reshape", "flatten", "dropout", "sgd", "adam",
)  # fmt: skip


@contextlib.contextmanager
def numbered_from(number: int = 8):
    """Inside the block Keras numbers every prefix's next name from ``number``, as in a
    process that built that many of each before. From 8, five models are named
    ``sequential_8`` .. ``sequential_12``, which sort otherwise than a fresh process's
    ``sequential`` .. ``sequential_4`` (``_10`` before ``_8``). Names stay unique after."""
    taken = RunNames()
    taken.counters.update(dict.fromkeys(PREFIXES, number))
    with taken.scope():
        yield


@pytest.fixture
def ensemble_registered(monkeypatch):
    """The worker's ``Ensemble`` recipe registered for this test only."""
    table = registry()
    monkeypatch.setattr(table, "recipes", dict(table.recipes))
    beatloop.register(same_process.Ensemble)


@pytest.fixture(scope="module")
def fresh_runs(tmp_path_factory):
    """Each case's final weights, fitted first thing in a fresh process of its own."""
    folder = tmp_path_factory.mktemp("fresh")

    def weights(case: str):
        out = folder / f"{case}.npz"
        if not out.exists():
            run_python(WORKER, case, out)
        return load_npz(out)

    return weights


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ensemble", "supervised", "gan_group"])
def test_fits_in_one_process_end_as_a_fresh_process_run(
    case, fresh_runs, ensemble_registered, tmp_path
):
    """By name, by instance, and resumed from a run dir, each after the process built
    other models first (so Keras's counters would number the run's models in another
    order than a fresh process): every run ends with the fresh process's weights, bit
    for bit. Without per-run names the ensemble's runs end 1 ulp off."""
    fresh = fresh_runs(case)
    with numbered_from(8):
        assert_same_weights(all_weights(same_process.fit(case, by="name").models), fresh)
    with numbered_from(98):
        assert_same_weights(all_weights(same_process.fit(case, by="instance").models), fresh)
    run_dir = tmp_path / "run"
    with numbered_from(8):
        same_process.fit(case, epochs=1, run_dir=run_dir)
    with numbered_from(998):
        resumed = same_process.fit(case, run_dir=run_dir)
    assert resumed.resumed_from is not None
    assert_same_weights(all_weights(resumed.models), fresh_runs(case))


def test_a_runs_graph_has_the_same_node_names_whatever_the_process_built_before(
    small_digits,
):
    """Node names of the training loop's graph and of the functions it calls (whose
    own names carry TensorFlow's process-wide counter, and are left out)."""
    train, _ = small_digits
    data = dict_batches(train, 50)

    def node_names() -> list[str]:
        result = beatloop.fit(
            same_process.Ensemble(), data=data, seed=1, steps_per_execution=2, progress=False
        )
        graph = result.engine.parts.train_loop.graph.as_graph_def()
        functions = [function.node_def for function in graph.library.function]
        return sorted(node.name for nodes in [graph.node, *functions] for node in nodes)

    first = node_names()
    with numbered_from(8):
        assert node_names() == first
    # Counted from zero: the fifth model is sequential_4 (the graph suffixes a scope again).
    assert "while/sequential_4_1/dense_4_1/MatMul" in first


def test_run_names_count_from_zero_and_later_names_stay_unique():
    taken = {keras.layers.Dense(1).name for _ in range(3)}
    names = RunNames()
    with names.scope():
        inside = [keras.layers.Dense(1).name for _ in range(2)]
    with names.scope():  # the run's counters go on where they stopped
        inside.append(keras.layers.Dense(1).name)
    assert inside == ["dense", "dense_1", "dense_2"]
    after = keras.layers.Dense(1).name
    assert after not in taken | set(inside)


def test_models_whose_names_sort_otherwise_than_a_fresh_process_gives_are_warned_of():
    with numbered_from(9):  # dense_9, dense_10: "dense_10" sorts first
        model = classifier()
    assert [layer.name for layer in model.layers] == ["dense_9", "dense_10"]
    assert history_named({"model": model}) == ["dense_9", "dense_10"]
    with pytest.warns(beatloop.ReproducibilityWarning, match=r"models= \(model\).*dense_9"):
        beatloop.fit(
            "supervised", models={"model": model}, epochs=1, seed=0,
            steps_per_epoch=1, progress=False,
        )  # fmt: skip


def test_models_named_in_the_same_order_as_in_a_fresh_process_are_not_warned_of():
    with numbered_from(2):  # dense_2, dense_3: sorted as dense, dense_1 are
        numbered = classifier()
        named = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(16, name="h_9"),
                keras.layers.Dense(10, name="h_10"),
            ]
        )
    assert history_named({"a": numbered, "b": named}) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", beatloop.ReproducibilityWarning)
        beatloop.fit(
            "supervised", models={"model": numbered}, epochs=1, seed=0,
            steps_per_epoch=1, progress=False,
        )  # fmt: skip
