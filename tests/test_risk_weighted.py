"""The risk-weighted recipe: weighted per-sample losses, clipped gradients, AUC and KS."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_close_weights, dict_batches
from scipy.stats import ks_2samp

import beatloop
from beatloop import datasets as data
from beatloop.core.compiled.forward import ModelCalls
from beatloop.core.failures.errors import RunawayLossWarning
from beatloop.metrics import KSStatistic
from beatloop.recipes.risk_weighted import RiskWeighted


@pytest.fixture(scope="module")
def cases():
    return data.breast_cancer_arrays(0)


def gradients(recipe, model, batch):
    with tf.GradientTape() as tape:
        loss = recipe.weighted_loss(ModelCalls({"model": model}, frozenset()), batch)["loss"]
    return tape.gradient(loss, model.trainable_variables)


@pytest.fixture
def recipe_and_model(cases):
    recipe = RiskWeighted()
    keras.utils.set_random_seed(0)
    model = recipe.build_models({"x": tf.TensorSpec([None, 30])})["model"]
    return recipe, model


def batch_of(train, rows, weights=None):
    batch = {key: tf.constant(value[rows]) for key, value in train.items()}
    if weights is not None:
        batch["risk"] = tf.constant(weights, tf.float32)
    return batch


def test_a_weight_zero_sample_contributes_nothing(cases, recipe_and_model):
    recipe, model = recipe_and_model
    train, _ = cases
    rows = np.arange(8)
    weights = train["risk"][rows].copy()
    weights[3] = 0.0
    with_it = gradients(recipe, model, batch_of(train, rows, weights))
    without = gradients(recipe, model, batch_of(train, np.delete(rows, 3)))
    for a, b in zip(with_it, without, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert max(float(tf.norm(g)) for g in with_it) > 1e-3  # a real gradient, not zeros


def test_doubling_every_weight_doubles_the_gradient(cases, recipe_and_model):
    recipe, model = recipe_and_model
    train, _ = cases
    rows = np.arange(16)
    once = gradients(recipe, model, batch_of(train, rows))
    twice = gradients(recipe, model, batch_of(train, rows, 2 * train["risk"][rows]))
    for a, b in zip(once, twice, strict=True):
        np.testing.assert_allclose(2 * a.numpy(), b, rtol=1e-5, atol=1e-7)


def test_clipping_bounds_every_gradient_tensor(cases, recipe_and_model):
    recipe, model = recipe_and_model
    train, _ = cases
    rows = np.arange(32)
    grads = gradients(recipe, model, batch_of(train, rows, 100 * train["risk"][rows]))
    assert max(float(tf.norm(g)) for g in grads) > 10  # clipping has work to do
    clipped = recipe.schedule().beats[0].transform(grads)
    assert all(float(tf.norm(g)) <= 1.0 + 1e-5 for g in clipped)


def test_the_engine_applies_the_clip_before_each_update(cases):
    train, _ = cases
    heavy = {**train, "risk": train["risk"] * 1000}
    result = beatloop.fit(
        "risk_weighted",
        data=data.batches({k: v[:64] for k, v in heavy.items()}, 32),
        config={"clip_norm": 0.01, "optimizer": "sgd", "learning_rate": 1.0},
        seed=0,
        steps_per_execution=1,
    )
    keras.utils.set_random_seed(0)
    initial = RiskWeighted().build_models({"x": tf.TensorSpec([None, 30])})["model"]
    # Two SGD(1.0) steps of per-tensor norm <= 0.01 move each tensor by <= 0.02.
    for before, after in zip(initial.weights, result.models["model"].weights, strict=True):
        moved = float(np.linalg.norm(after.numpy() - before.numpy()))
        assert 0.005 < moved <= 0.02 + 1e-6


def test_ks_metric_equals_scipy_across_batches():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    scores = 1 / (1 + np.exp(-(rng.normal(size=500) + labels)))
    metric = KSStatistic()
    for start in range(0, 500, 64):
        metric.update_state(labels[start : start + 64], scores[start : start + 64])
    expected = ks_2samp(scores[labels == 1], scores[labels == 0]).statistic
    assert float(metric.result()) == pytest.approx(expected, abs=1e-6)
    metric.reset_state()
    assert float(metric.result()) == 0.0


def test_default_run_reports_auc_and_ks_of_its_validation_scores():
    result = beatloop.fit("risk_weighted", epochs=3, seed=0)
    history = result.history
    assert set(history) == {"loss", "auc", "ks", "val_loss", "val_auc", "val_ks"}
    assert history["val_auc"][-1] > 0.95
    _, validation = data.breast_cancer_arrays(0)
    scores = tf.sigmoid(result.models["model"](validation["x"])[:, 0]).numpy()
    labels = validation["y"]
    expected = ks_2samp(scores[labels == 1], scores[labels == 0]).statistic
    assert history["val_ks"][-1] == pytest.approx(expected, abs=1e-6)


def test_outliers_explode_training_without_clipping_and_not_with_it(cases):
    train, validation = cases
    noisy = data.with_outliers(train, count=5, weight=100.0, scale=10.0, seed=0)

    def run(clip):
        return beatloop.fit(
            "risk_weighted",
            data=(data.batches(noisy, 32, shuffle_seed=0), data.batches(validation, 32)),
            epochs=6,
            seed=0,
            config={"clip": clip},
        ).history

    with pytest.warns(RunawayLossWarning, match="ran away"):  # and the run says so
        runs = {"none": run("none")}
    runs["norm"] = run("norm")
    unclipped, clipped = runs["none"]["loss"], runs["norm"]["loss"]
    assert max(unclipped) > 1000 * max(clipped)
    assert max(clipped) < 100 and runs["norm"]["val_auc"][-1] > 0.95


def test_risk_from_a_function_of_the_batch_and_multiclass(cases):
    train, _ = cases
    no_risk = dict_batches({"x": train["x"], "y": train["y"]}, 64)
    with pytest.raises(beatloop.DataError, match=r"keys \['risk', 'x', 'y'\]"):
        beatloop.fit("risk_weighted", data=no_risk)
    by_function = beatloop.fit(
        "risk_weighted", data=no_risk, seed=0,
        config={"risk": lambda batch: 1.0 + batch["x"][:, 0] ** 2},
    )  # fmt: skip
    # The same weights as a risk column (they vary, from 1 to about 17): the same run.
    column = {"x": train["x"], "y": train["y"], "risk": 1.0 + train["x"][:, 0] ** 2}
    by_column = beatloop.fit("risk_weighted", data=dict_batches(column, 64), seed=0)
    for name, values in by_column.history.items():
        np.testing.assert_allclose(by_function.history[name], values, rtol=1e-6, err_msg=name)
    assert_close_weights(
        all_weights(by_function.models), all_weights(by_column.models), rtol=1e-6, atol=1e-7
    )

    digits, _ = data.digits_arrays(0)
    ten = dict_batches(digits, 64)
    result = beatloop.fit(
        "risk_weighted",
        data=ten,
        epochs=2,
        seed=0,
        config={"classes": 10, "optimizer": "adam", "learning_rate": 0.01,
                "risk": lambda batch: tf.ones_like(batch["y"], tf.float32)},
    )  # fmt: skip
    assert set(result.history) == {"loss", "auc"} and result.history["auc"][-1] > 0.9


def test_risk_function_cannot_come_from_the_command_line(capsys):
    from beatloop.cli import main

    assert main(["run", "risk_weighted", "--set", "risk=lambda b: 1"]) == 2
    assert "expects function | None" in capsys.readouterr().err
