"""An embedding's sparse gradient (``IndexedSlices``, a row per lookup) summed per index
(``sparse_rows.summed_per_index``: what the optimizer and the NaN guard read) is the
dense gradient, eagerly, traced and under XLA; the guard's figure is then the dense
gradient's, non-finite exactly when that is, and the compiled step computes it without
a table-sized tensor."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import beatloop
from beatloop import Engine, EngineOptions
from beatloop.core.compiled.numerics import gradient_squares
from beatloop.core.compiled.sparse_rows import summed_per_index
from beatloop.core.data.batches import as_data_split
from beatloop.core.failures.errors import NumericsError

ROWS, WIDTH = 30011, 6  # a table no other tensor of the step is shaped like


def sparse_gradient(values: np.ndarray, indices) -> tf.IndexedSlices:
    """An embedding's gradient of ``values`` rows at ``indices`` in a 1000-row table."""
    values = tf.constant(values, tf.float32)
    dense_shape = tf.constant([1000, values.shape[1]], tf.int64)
    return tf.IndexedSlices(values, tf.constant(indices, tf.int64), dense_shape)


def guard_squares(grads) -> list[tf.Tensor]:
    """The guard's squares of ``grads`` as the step reads them: each summed per index."""
    return gradient_squares([summed_per_index(g) for g in grads])


@pytest.mark.parametrize("how", ["eager", "graph", "xla"])
def test_a_sparse_gradient_summed_per_index_is_its_dense_form_and_so_are_its_squares(how):
    rng = np.random.default_rng(0)
    indices = rng.integers(0, 40, size=300)  # 300 lookups of 40 rows: many repeated
    grad = sparse_gradient(rng.uniform(0.5, 1.5, size=(300, 5)), indices)

    def summed_and_squares(grad):
        summed = summed_per_index(grad)
        return summed.values, summed.indices, gradient_squares([summed])[0]

    run = {
        "eager": summed_and_squares,
        "graph": tf.function(summed_and_squares),
        "xla": tf.function(summed_and_squares, jit_compile=True),
    }[how]
    values, found, ours = run(grad)
    dense = tf.convert_to_tensor(grad)
    # As many rows as lookups: one per distinct index, in the order they come, then zeros.
    distinct = list(dict.fromkeys(indices.tolist()))
    assert values.shape == (300, 5)
    assert found.numpy().tolist() == distinct + [0] * (300 - len(distinct))
    assert not np.any(values.numpy()[len(distinct) :])
    summed = tf.IndexedSlices(values, found, grad.dense_shape)
    np.testing.assert_array_equal(tf.convert_to_tensor(summed).numpy(), dense.numpy())
    np.testing.assert_allclose(float(ours), float(tf.nn.l2_loss(dense)), rtol=1e-6)
    # Each lookup's row alone would be another figure: repeated rows are summed first.
    assert float(ours) > 2 * float(tf.nn.l2_loss(grad.values))


def test_a_dense_gradient_keeps_its_squares():
    grad = tf.constant([[1.0, -2.0], [3.0, 0.5]])
    assert float(gradient_squares([grad])[0]) == pytest.approx(0.5 * (1 + 4 + 9 + 0.25))


@pytest.mark.parametrize(
    "bad, expected",
    [([np.nan, 1.0], "nan"), ([np.inf, 1.0], "inf"), ([np.inf, -np.inf], "nan")],
    ids=["nan", "inf", "inf-minus-inf-in-one-row"],
)
def test_a_non_finite_value_makes_the_squares_non_finite_as_the_dense_ones(bad, expected):
    values = np.ones((4, 1), np.float32)
    values[[1, 3], 0] = bad  # rows 1 and 3 of the lookups are both table row 7
    grad = sparse_gradient(values, [2, 7, 5, 7])
    ours = float(guard_squares([grad])[0])
    dense = float(tf.nn.l2_loss(tf.convert_to_tensor(grad)))
    assert str(ours) == str(dense) == expected


def lookups(ids: np.ndarray) -> tf.data.Dataset:
    """Batches of 16 rows of three ids in ``ROWS`` and a label of four classes."""
    labels = np.arange(len(ids)) % 4
    return tf.data.Dataset.from_tensor_slices({"x": ids, "y": labels}).batch(16)


def embedding_classifier() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((3,), dtype="int64"),
        keras.layers.Embedding(ROWS, WIDTH),
        keras.layers.Flatten(),
        keras.layers.Dense(4),
    ])  # fmt: skip


def graphs(graph, seen: set[int]):
    """``graph`` and every function graph it calls (a loop's body, a branch), nested."""
    yield graph
    for function in getattr(graph, "_functions", {}).values():
        inner = getattr(function, "graph", None)
        if inner is not None and id(inner) not in seen:
            seen.add(id(inner))
            yield from graphs(inner, seen)


def test_the_compiled_step_makes_no_table_sized_tensor_of_an_embeddings_gradient():
    ids = np.random.default_rng(1).integers(0, ROWS, size=(64, 3))
    recipe = beatloop.make_recipe("supervised", {"optimizer": "sgd", "learning_rate": 0.1})
    model = embedding_classifier()
    before = model.layers[0].embeddings.numpy()
    engine = Engine(
        recipe, as_data_split((lookups(ids), None)), models={"model": model},
        options=EngineOptions(steps_per_execution=2),
    )  # fmt: skip
    engine.fit(1)
    tables = [
        (op.type, op.name)
        for graph in graphs(engine.train_loop.graph, set())
        for op in graph.get_operations()
        if op.type != "ReadVariableOp"  # the table itself, read for the lookups
        for out in op.outputs
        if out.shape.rank == 2 and out.shape[0] == ROWS
    ]
    # The guard's squares of the dense gradient were an UnsortedSegmentSum of the whole
    # table every step; SGD's update of the looked-up rows is a scatter.
    assert tables == []
    changed = np.flatnonzero(np.any(model.layers[0].embeddings.numpy() != before, axis=1))
    assert set(changed) == set(ids.ravel())  # the run trained: every looked-up row moved


class RootOfRows(beatloop.Recipe):
    """The mean square root of the absolute values of the rows an id looks up (test
    recipe): finite for a row of zeros, whose gradient is NaN (infinity times zero)."""

    name = "root_of_rows_test"
    batch_keys = {"x": 2}

    def build_models(self, batch_spec):
        keras.utils.set_random_seed(0)
        return {"table": keras.Sequential([keras.Input((3,), dtype="int64"),
                                           keras.layers.Embedding(ROWS, WIDTH)])}  # fmt: skip

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.01)}

    def losses(self):
        return {"roots": lambda models, batch: tf.reduce_mean(tf.sqrt(tf.abs(
            models["table"](batch["x"]))))}  # fmt: skip

    def schedule(self):
        return beatloop.Schedule(beatloop.Beat(loss="roots", optimizer="sgd", updates="table"))


def test_a_nan_in_an_embeddings_gradient_stops_the_run_naming_the_beat_and_step():
    ids = np.random.default_rng(2).integers(1, ROWS, size=(64, 3))
    ids[37, 1] = 0  # in the third batch of 16: table row 0, made zeros
    recipe = RootOfRows()
    engine = Engine(recipe, as_data_split((lookups(ids), None)),
                    options=EngineOptions(steps_per_execution=4))  # fmt: skip
    table = engine.bound.models["table"].layers[0].embeddings
    table.assign(tf.tensor_scatter_nd_update(table, [[0]], tf.zeros([1, WIDTH])))
    message = r"beat 'roots' produced a non-finite gradient global norm \(nan\) at step 3 "
    with pytest.raises(NumericsError, match=message):
        engine.fit(1)
    assert int(engine.state.step) == 3  # the call of 4 steps stopped at the third


def test_without_the_gradient_check_a_nan_gradient_is_found_at_the_loss_it_spoils():
    """``check_gradients=False``: the step reduces no gradient (no ``L2Loss`` traced); the
    NaN update of step 3 goes unseen until step 4 looks the spoilt row up again."""
    ids = np.random.default_rng(2).integers(1, ROWS, size=(64, 3))
    ids[37, 1] = 0  # in the third batch of 16: table row 0, made zeros
    ids[50, 2] = 0  # and in the fourth, where the NaN row makes the loss NaN
    found = {}
    for check in (True, False):
        options = EngineOptions(steps_per_execution=4, check_gradients=check)
        engine = Engine(RootOfRows(), as_data_split((lookups(ids), None)), options=options)
        table = engine.bound.models["table"].layers[0].embeddings
        table.assign(tf.tensor_scatter_nd_update(table, [[0]], tf.zeros([1, WIDTH])))
        with pytest.raises(NumericsError) as caught:
            engine.fit(1)
        ops = {op.type for graph in graphs(engine.train_loop.graph, set())
               for op in graph.get_operations()}  # fmt: skip
        found[check] = (str(caught.value), int(engine.state.step), "L2Loss" in ops)
    assert found[True][1:] == (3, True) and "non-finite gradient global norm" in found[True][0]
    assert found[False][1:] == (4, False)
    assert found[False][0].startswith("beat 'roots' produced a non-finite loss (nan) at step 4 ")


def test_a_run_without_the_gradient_check_trains_bit_for_bit_as_with_it(small_digits):
    from helpers import dict_batches

    train, validation = small_digits
    digit_batches = dict_batches(train, 25), dict_batches(validation, 50)
    weights = {}
    for check in (True, False):
        options = {"steps_per_execution": 8, "check_gradients": check, "progress": False}
        result = beatloop.fit("supervised", data=digit_batches, epochs=1, seed=3, **options)
        weights[check] = [w.numpy() for w in result.models["model"].weights]
    for with_check, without in zip(weights[True], weights[False], strict=True):
        np.testing.assert_array_equal(with_check, without)
