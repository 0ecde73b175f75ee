"""Models of named inputs (a dict or tuple of tensors as ``x``, as Keras's ``fit`` takes
it): trained bit for bit as ``fit`` trains them, checked key by key, from Python and from
``--data`` sources whose keys are paths (``x/token_ids``)."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_close_weights, model_weights
from text_classifier import CLASSES, LENGTH, text_arrays, text_batches, text_classifier

import beatloop
from beatloop.cli import main
from beatloop.core.saving.op_determinism import set_for_run

RTOL, ATOL = 1e-6, 1e-7  # bit-identical here; a few ulps of room on other CPUs


def twin(seed=0):
    """Two text classifiers with the same weights: Keras's and beatloop's."""
    reference = text_classifier(seed)
    ours = text_classifier(seed)
    ours.set_weights(reference.get_weights())
    return reference, ours


class SummedSparseAdamW(keras.optimizers.AdamW):
    """AdamW handed an embedding's gradient with its repeated ids summed first, as
    beatloop hands every optimizer (docs/schedules.md, "Sparse gradients")."""

    def apply(self, grads, trainable_variables=None):
        return super().apply([summed_rows(g) for g in grads], trainable_variables)


def summed_rows(grad):
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    ids, positions = tf.unique(grad.indices)
    rows = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(ids)[0])
    return tf.IndexedSlices(rows, ids, grad.dense_shape)


@pytest.fixture
def sums_in_program_order():
    """Grappler's arithmetic optimiser off while the test runs: it orders a sum's operands
    by graph node names, which differ between any two programs (Keras's ``train_step``
    and beatloop's step), so a gradient summed over the model's fan-outs (the residual
    around attention) could differ in its last bit for that reason alone."""
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"arithmetic_optimization": True})


def test_text_classifier_of_named_inputs_matches_keras_fit(sums_in_program_order):
    """(features dict, labels) batches: the same losses, accuracies and weights as
    ``model.fit`` over three epochs, validation included. Keras's optimizers take an
    embedding's gradient a row per token occurrence, beatloop's summed per id; ``fit``
    is given an optimizer that sums them too (the one difference, documented)."""
    reference, ours = twin()
    train, validation = text_batches(96, 16, seed=0), text_batches(48, 16, seed=1)
    set_for_run(False)  # fit as users run it (an earlier test may have left it on)
    reference.compile(
        optimizer=SummedSparseAdamW(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    expected = reference.fit(
        train, validation_data=validation, epochs=3, shuffle=False, verbose=0
    ).history
    result = beatloop.fit(
        "supervised",
        data=(train, validation),
        models={"model": ours},
        optimizers={"optimizer": keras.optimizers.AdamW(1e-2)},
        epochs=3,
        seed=0,
        op_determinism=False,  # as fit ran: TensorFlow's kernels of choice
    )
    for name in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(result.history[name], expected[name], rtol=RTOL, atol=ATOL)
    assert result.history["loss"][-1] < 0.8 * result.history["loss"][0]  # it learnt
    assert_close_weights(model_weights(ours), model_weights(reference), rtol=RTOL, atol=ATOL)


def test_dict_batches_with_x_a_dict_train_as_tuples_do():
    """``{"x": {...}, "y": ...}`` batches and ``(features, y)`` tuples are one data set."""
    features, labels = text_arrays(64)
    as_dicts = tf.data.Dataset.from_tensor_slices({"x": features, "y": labels}).batch(16)
    weights = []
    for data in (text_batches(64, 16), as_dicts):
        model = text_classifier(seed=2)
        beatloop.fit("supervised", data=data, models={"model": model}, epochs=1, seed=0)
        weights.append(model_weights(model))
    assert_close_weights(weights[0], weights[1], rtol=0, atol=0)


def test_tuple_of_inputs_reaches_a_model_of_listed_inputs():
    """``x`` a tuple: a model whose inputs are a list, called with them in order."""
    first, second = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    joined = keras.layers.Concatenate()([first, second])
    model = keras.Model([first, second], keras.layers.Dense(2)(joined))
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(40, 3)).astype("float32"), rng.normal(size=(40, 2)).astype("float32"))
    y = (x[0][:, 0] > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    result = beatloop.fit(
        "supervised", data=data, models={"model": model}, config={"classes": 2}, epochs=4, seed=0
    )
    assert result.history["loss"][-1] < result.history["loss"][0]


def test_built_in_model_reads_every_named_input():
    """Given no model, the supervised recipe builds one on the dict's inputs (each cast
    and flattened, joined): it learns, and its inputs are the data's keys."""
    result = beatloop.fit(
        "supervised", data=text_batches(96, 16), config={"classes": CLASSES}, epochs=6, seed=0
    )
    model = result.models["model"]
    assert sorted(model.input) == ["padding_mask", "segment_ids", "token_ids"]
    assert result.history["loss"][-1] < result.history["loss"][0]


@pytest.mark.parametrize("recipe", ["risk_weighted", "multitask"])
def test_other_recipes_calling_a_model_on_x_take_named_inputs(recipe, tmp_path):
    features, labels = text_arrays(64)
    if recipe == "risk_weighted":
        batches = {"x": features, "y": labels % 2, "risk": np.ones(64, np.float32)}
        config = {}
    else:
        batches = {"x": features, "first": labels, "second": (labels + 1) % CLASSES}
        config = {"tasks": ("first=classification:3", "second=classification:3")}
    data = tf.data.Dataset.from_tensor_slices(batches).batch(16)
    result = beatloop.fit(recipe, data=(data, data), config=config, epochs=2, seed=0)
    assert all(np.isfinite(v[-1]) for v in result.history.values())
    exported = result.export(tmp_path / "out")  # the inference model takes the dict too
    (path,) = exported.values()
    loaded = tf.saved_model.load(str(path))
    served = loaded.serve({k: tf.constant(v[:4]) for k, v in features.items()})
    assert tf.nest.flatten(served)[0].shape[0] == 4


# --- checks that name the key -----------------------------------------------------------


def test_validation_batches_unlike_training_name_the_path():
    features, labels = text_arrays(32)
    other = {**features, "segment_ids": features["segment_ids"].astype(np.float32)}
    validation = tf.data.Dataset.from_tensor_slices((other, labels)).batch(16)
    with pytest.raises(beatloop.DataError, match=r"'x/segment_ids'.*float32.*int32"):
        beatloop.fit(
            "supervised", data=(text_batches(32), validation), models={"model": text_classifier()}
        )


def test_input_the_model_does_not_take_names_model_input_and_batch_path():
    features, labels = text_arrays(32)
    short = {**features, "token_ids": features["token_ids"][:, :4]}
    data = tf.data.Dataset.from_tensor_slices((short, labels)).batch(16)
    with pytest.raises(beatloop.InputMismatchError) as raised:
        beatloop.fit("supervised", data=data, models={"model": text_classifier()})
    assert raised.value.input == "token_ids" and raised.value.key == "x/token_ids"
    assert f"(None, {LENGTH})" in str(raised.value) and "(None, 4)" in str(raised.value)


def test_a_ragged_input_is_refused_naming_its_path():
    features, labels = text_arrays(16)
    ragged = {**features, "token_ids": tf.ragged.constant([[1, 2], [3]] * 8)}
    data = tf.data.Dataset.from_tensor_slices((ragged, labels)).batch(8)
    with pytest.raises(beatloop.DataError, match=r"'x/token_ids' must be a tensor.*Ragged"):
        beatloop.fit("supervised", data=data, models={"model": text_classifier()})


def test_recipe_computing_on_x_refuses_a_dict_naming_it():
    features, _ = text_arrays(16)
    data = tf.data.Dataset.from_tensor_slices({"x": features}).batch(8)
    with pytest.raises(beatloop.DataError, match=r"takes training batch 'x' as one tensor"):
        beatloop.fit("gan", data=data)


def test_a_resume_on_other_named_inputs_names_the_path(tmp_path):
    run_dir = tmp_path / "run"
    beatloop.fit(
        "supervised", data=text_batches(32), models={"model": text_classifier()}, seed=0,
        run_dir=run_dir,
    )  # fmt: skip
    recorded = json.loads((run_dir / "run.json").read_text())["data"]
    assert sorted(recorded) == ["x/padding_mask", "x/segment_ids", "x/token_ids", "y"]
    features, labels = text_arrays(32)
    wider = {**features, "padding_mask": features["padding_mask"].astype(np.int32)}
    data = tf.data.Dataset.from_tensor_slices((wider, labels)).batch(16)
    with pytest.raises(beatloop.CheckpointError, match=r"data\.x/padding_mask is"):
        beatloop.fit(
            "supervised", data=data, models={"model": text_classifier()}, epochs=2, seed=0,
            run_dir=run_dir,
        )  # fmt: skip


# --- from the command line ---------------------------------------------------------------


def text_csv(path, count=64):
    features, labels = text_arrays(count)
    rows = ["first,second,length,label"]
    columns = (features["token_ids"], features["padding_mask"], labels)
    for tokens, mask, label in zip(*columns, strict=True):
        rows.append(f"{tokens[0]},{tokens[1]},{mask.mean():.2f},{label}")
    path.write_text("\n".join(rows) + "\n")
    return path


def tabular_model(seed=0):
    """Three named scalar inputs, two of them ids for an embedding."""
    keras.utils.set_random_seed(seed)
    first, second = (keras.Input((), dtype="int32", name=n) for n in ("first", "second"))
    length = keras.Input((), dtype="float32", name="length")
    embedded = keras.layers.Embedding(40, 4)(keras.ops.stack([first, second], axis=1))
    joined = keras.layers.Concatenate()([keras.layers.Flatten()(embedded), length[:, None]])
    logits = keras.layers.Dense(CLASSES)(joined)
    return keras.Model({"first": first, "second": second, "length": length}, logits)


def test_csv_columns_named_as_x_paths_feed_a_keras_file_of_named_inputs(tmp_path, capsys):
    """``--data-set keys=COLUMN:x/NAME`` makes x a dict; ``--model`` a .keras file of
    named inputs takes it; run.json records each path."""
    table = text_csv(tmp_path / "text.csv")
    tabular_model().save(tmp_path / "tabular.keras")
    run_dir = tmp_path / "run"
    code = main([
        "run", "supervised", "--data", f"csv:{table}", "--data-set", "label=label",
        "--data-set", "keys=first:x/first,second:x/second,length:x/length",
        "--data-set", "validation_fraction=0.25", "--model", f"model={tmp_path / 'tabular.keras'}",
        "--set", f"classes={CLASSES}", "--epochs", "2", "--seed", "0", "--run-dir", str(run_dir),
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    recorded = json.loads((run_dir / "run.json").read_text())["data"]
    assert "int32" in recorded["x/first"] and "float32" in recorded["x/length"]
    assert sorted(recorded) == ["x/first", "x/length", "x/second", "y"]


def test_npz_arrays_named_as_paths_nest_into_x(tmp_path):
    features, labels = text_arrays(48)
    arrays = {f"x/{name}": value for name, value in features.items()}
    np.savez(tmp_path / "text.npz", y=labels, **arrays)
    from beatloop.named_data.load import NamedData

    data = NamedData(f"npz:{tmp_path / 'text.npz'}", ("validation_fraction=0.25",))
    model = text_classifier()
    result = beatloop.fit(
        "supervised", data=data, models={"model": model}, seed=0, run_dir=tmp_path / "run"
    )
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["data"]
    assert sorted(recorded) == [f"x/{name}" for name in sorted(features)] + ["y"]
    assert result.history["loss"][0] > 0


def test_a_path_key_under_a_plain_key_is_refused(tmp_path):
    table = text_csv(tmp_path / "text.csv")
    from beatloop.named_data.load import NamedData

    settings = ("label=label", "keys=first:risk,second:risk/second")
    with pytest.raises(beatloop.DataError, match=r"'risk/second' puts a tensor inside 'risk'"):
        beatloop.fit("supervised", data=NamedData(f"csv:{table}", settings))
