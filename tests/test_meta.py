"""The meta recipe (MAML on sinusoid tasks): bit for bit the MAML a TensorFlow user
writes (tests/meta_hand.py) at one and several steps per call, both orders; the
first-order gradient is the query gradient at the adapted weights; adaptation lowers
the validation query loss; evaluation changes nothing; two replicas with unequal task
shares train like one device."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, run_python
from meta_hand import HandWrittenMaml, learner
from test_evaluate import snapshot, unprefixed

import beatloop
from beatloop.cli import main
from beatloop.core.compiled.forward import ModelCalls
from beatloop.recipes.meta import Meta
from beatloop.recipes.sinusoids import (
    AMPLITUDE,
    PHASE,
    mean_sinusoid,
    sinusoid_split,
    sinusoid_tasks,
    unadapted_floor,
)

SEED = 3
WORKER = Path(__file__).parent / "workers" / "meta_mirrored.py"
# 22 training tasks in batches of 4: five full batches and a short one of 2 an epoch.
SMALL = {"batch_size": 4, "train_tasks": 22, "validation_tasks": 8, "support": 5, "query": 5}


def small_split():
    """The recipe's built-in data at SMALL's sizes, built as ``fit`` builds it (after
    seeding: a seeded shuffle's order also depends on the global seed)."""
    keras.utils.set_random_seed(SEED)
    c = SMALL
    return sinusoid_split(
        SEED,
        c["train_tasks"],
        c["validation_tasks"],
        c["batch_size"],
        c["support"],
        c["query"],
    )


def optimizer_values(optimizer) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in optimizer.variables]


@pytest.mark.parametrize(
    ("order", "inner_steps", "steps_per_execution"),
    [("second", 1, 1), ("second", 2, 3), ("first", 1, 1), ("first", 2, 3)],
)
def test_meta_equals_a_hand_written_maml_loop_bit_for_bit(order, inner_steps, steps_per_execution):
    config = {**SMALL, "order": order, "inner_steps": inner_steps}
    recipe = beatloop.make_recipe("meta", config)
    keras.utils.set_random_seed(0)
    ours = recipe.build_models(small_split().train.element_spec)
    theirs = learner()
    theirs.set_weights(ours["learner"].get_weights())
    start = all_weights(ours)

    result = beatloop.fit(
        recipe, data=small_split(), models=ours, epochs=3, seed=SEED,
        steps_per_execution=steps_per_execution, progress=False,
    )  # fmt: skip
    data = small_split().train
    hand = HandWrittenMaml(theirs, data.element_spec, order=order, inner_steps=inner_steps)
    hand.fit(data, epochs=3)

    assert result.steps == 18
    assert max(np.abs(all_weights(ours)[k] - start[k]).max() for k in start) > 1e-3
    assert_same_weights(all_weights(ours), all_weights({"learner": theirs}))
    adam, hands = optimizer_values(result.optimizers["adam"]), optimizer_values(hand.optimizer)
    assert_same_weights(adam, hands)  # Adam's step count and moments


def one_batch(tasks: int = 3):
    c = SMALL
    arrays = sinusoid_tasks(np.random.default_rng(1), tasks, c["support"], c["query"])
    return {
        key: tf.constant(arrays[key]) for key in ("support_x", "support_y", "query_x", "query_y")
    }


def outer_gradient(recipe: Meta, model, batch):
    models = ModelCalls({"learner": model}, frozenset({"learner"}), batch=batch)
    with tf.GradientTape() as tape:
        loss = recipe.query_loss_after(models, batch)["loss"]
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def test_first_order_takes_the_query_gradient_at_the_adapted_weights():
    """FOMAML's gradient, computed here task by task: adapt, then differentiate the query
    loss with respect to the adapted weights as if they were the weights."""
    keras.utils.set_random_seed(0)
    model, batch, rate = learner(), one_batch(), 0.01
    first = Meta(Meta.Config(**SMALL, order="first", inner_learning_rate=rate))

    def mse(values, x, y):
        return tf.reduce_mean(tf.square(model.stateless_call(values, [], x)[0] - y))

    expected = [np.zeros(v.shape, np.float32) for v in model.trainable_variables]
    for task in range(3):
        weights = [tf.convert_to_tensor(v) for v in model.trainable_variables]
        with tf.GradientTape() as inner:
            inner.watch(weights)
            support = mse(weights, batch["support_x"][task], batch["support_y"][task])
        adapted = [
            w - rate * g for w, g in zip(weights, inner.gradient(support, weights), strict=True)
        ]
        with tf.GradientTape() as outer:
            outer.watch(adapted)
            query = mse(adapted, batch["query_x"][task], batch["query_y"][task])
        for total, g in zip(expected, outer.gradient(query, adapted), strict=True):
            total += g.numpy() / 3

    found = outer_gradient(first, model, batch)
    for got, want in zip(found, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    second = outer_gradient(Meta(Meta.Config(**SMALL, inner_learning_rate=rate)), model, batch)
    apart = max(float(np.abs(s - f).max()) for s, f in zip(second, found, strict=True))
    assert apart > 1e-4  # the second-order terms are there, and first order drops them


def test_adaptation_lowers_the_validation_query_loss_below_any_unadapted_learners():
    """The quality claim at a small size: after two epochs the held-out tasks' query
    loss after adaptation is well below the unadapted learner's, and below the floor of
    every learner that does not adapt (the mean sinusoid's loss), and falling."""
    config = {"batch_size": 10, "train_tasks": 1000, "validation_tasks": 100}
    recipe = beatloop.make_recipe("meta", {**config, "learning_rate": 0.005})
    result = beatloop.fit(recipe, epochs=2, seed=0, progress=False)
    before, after = result.history["val_query_loss_before"], result.history["val_query_loss_after"]
    validation = list(recipe.default_data(0).validation.as_numpy_iterator())
    floor = unadapted_floor({k: np.concatenate([b[k] for b in validation]) for k in validation[0]})
    assert after[-1] < 0.75 * before[-1] and after[-1] < 0.75 * floor
    assert after[-1] < after[0]
    assert result.history["query_loss_after"][-1] < result.history["query_loss_before"][-1]


def test_the_mean_sinusoid_is_the_best_prediction_that_does_not_adapt():
    tasks = sinusoid_tasks(np.random.default_rng(5), 20000, support=1, query=10)
    floor, x, y = unadapted_floor(tasks), tasks["query_x"], tasks["query_y"]
    assert 2.7 < floor < 3.0 < float(np.mean(y**2))  # predicting 0: about E[a^2] / 2 = 4.25
    for scale in (0.9, 1.1):
        assert float(np.mean(np.square(y - scale * mean_sinusoid(x)))) > floor + 0.01
    shifted = mean_sinusoid(x + 0.1)  # the same curve a little to the side: worse too
    assert float(np.mean(np.square(y - shifted))) > floor + 0.01


def test_the_tasks_are_whole_sinusoids_drawn_from_the_seed():
    tasks = sinusoid_tasks(np.random.default_rng(4), 50, support=3, query=7)
    assert tasks["support_x"].shape == (50, 3, 1) and tasks["query_y"].shape == (50, 7, 1)
    assert AMPLITUDE[0] <= tasks["amplitude"].min() and tasks["amplitude"].max() <= AMPLITUDE[1]
    assert PHASE[0] <= tasks["phase"].min() and tasks["phase"].max() <= PHASE[1]
    a, b = tasks["amplitude"][:, None, None], tasks["phase"][:, None, None]
    for part in ("support", "query"):  # every point of a task on that task's sinusoid
        x, y = tasks[f"{part}_x"], tasks[f"{part}_y"]
        np.testing.assert_allclose(y, a * np.sin(x - b), atol=1e-5)
    again = sinusoid_tasks(np.random.default_rng(4), 50, support=3, query=7)
    assert all(np.array_equal(tasks[k], again[k]) for k in tasks)

    split = small_split()
    sizes = [int(batch["query_x"].shape[0]) for batch in split.train]
    assert sizes == [4, 4, 4, 4, 4, 2]  # batches of whole tasks
    train_x = np.concatenate([b["support_x"].numpy() for b in split.train])
    val_x = np.concatenate([b["support_x"].numpy() for b in split.validation])
    assert val_x.shape == (8, 5, 1) and not np.isin(val_x, train_x).any()  # held out


def test_evaluate_on_its_run_dir_gives_the_last_val_figures_and_changes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    result = beatloop.fit("meta", config=SMALL, epochs=2, seed=1, run_dir=run_dir, progress=False)
    files, weights = snapshot(run_dir), all_weights(result.models)
    figures = beatloop.evaluate(run_dir)
    assert set(figures) == {"query_loss_after", "query_loss_before"}
    assert figures == unprefixed(result.history)
    assert figures["query_loss_after"] < figures["query_loss_before"]
    assert main(["evaluate", str(run_dir)]) == 0
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines() if line.strip())
    assert printed == {name: f"{value:.4g}" for name, value in figures.items()}
    assert snapshot(run_dir) == files
    assert_same_weights(all_weights(result.models), weights)


def test_show_prints_the_config_and_the_one_beat(capsys):
    assert main(["show", "meta", "--set", "order=first", "--set", "hidden=8"]) == 0
    out = capsys.readouterr().out
    assert "order: 'first' | 'second' = 'first'  (default 'second')" in out
    assert "1. query_loss_after: loss=query_loss_after optimizer=adam updates=learner" in out
    assert "learner/hidden_1/kernel (1, 8)" in out and "learner/output/bias (1,)" in out


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"order": "third"}, "config field 'order' expects 'first' | 'second', got str 'third'"),
        ({"inner_steps": 0}, "'inner_steps' must be >= 1"),
        ({"inner_learning_rate": 0.0}, "'inner_learning_rate' must be > 0"),
        ({"batch_size": 0}, "'batch_size' must be >= 1"),
        ({"shots": 5}, "recipe 'meta' has no config field 'shots'"),
    ],
)
def test_bad_config_is_a_config_error_naming_the_field(config, words):
    with pytest.raises(beatloop.ConfigError) as caught:
        beatloop.make_recipe("meta", config)
    assert words in str(caught.value)


@pytest.mark.slow
def test_two_replicas_with_unequal_task_shares_train_like_one_device(tmp_path):
    out = tmp_path / "mirrored.json"
    run_python(WORKER, out)
    report = json.loads(out.read_text())
    assert report["replicas"] == 2
    for order in ("second", "first"):
        assert report[order]["moved"] > 1e-3
        assert report[order]["difference"] < 1e-5  # float32 round-off
        assert report[order]["steps"] == [15, 15]
        one, two = report[order]["one"], report[order]["two"]
        assert one.keys() == two.keys()
        for name in one:
            np.testing.assert_allclose(two[name], one[name], rtol=1e-5)
