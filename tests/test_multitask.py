"""The multi-task recipe: joint and alternating schedules, fixed, uncertainty and DWA
loss weights."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf
from helpers import dict_batches, record_weights_per_loss, same_weights

import beatloop
from beatloop.core.compiled.forward import ModelCalls
from beatloop.recipes.multitask import Multitask, dwa_weights

SPEC = {"x": tf.TensorSpec([None, 64]), "y": tf.TensorSpec([None], tf.int32)}


def small(arrays, count=256, **extra):
    """The first ``count`` digits (and ``extra`` arrays) in unshuffled batches of 64."""
    return dict_batches(arrays, 64, count, **extra)


def test_joint_beat_gives_every_backbone_and_head_variable_a_gradient(digits):
    train, _ = digits
    recipe = Multitask()
    models = recipe.build_models(SPEC)
    batch = next(iter(small(train)))
    variables = [
        v
        for name in ("backbone", "head_digit", "head_ink")
        for v in models[name].trainable_variables
    ]
    with tf.GradientTape() as tape:
        loss = recipe.joint_loss(ModelCalls(models, frozenset()), batch)["loss"]
    grads = tape.gradient(loss, variables)
    assert len(grads) == 8  # two backbone layers and two heads, a kernel and a bias each
    assert all(g is not None and float(tf.norm(g)) > 0 for g in grads)
    bound = beatloop.bind(
        recipe.schedule(), models, recipe.build_optimizers(), recipe.losses(), SPEC
    )
    (beat,) = bound.beats
    assert {id(v) for v in beat.variables} == {id(v) for v in variables}


def test_alternating_beat_leaves_the_other_heads_unchanged(digits):
    train, _ = digits
    recipe = Multitask(Multitask.Config(schedule="alternating"))
    records = record_weights_per_loss(recipe, ["backbone", "head_digit", "head_ink"])
    result = beatloop.fit(recipe, data=small(train, 128), epochs=1, seed=0, debug=True)
    assert "shared: backbone" in result.schedule.describe()
    assert [name for name, _ in records] == ["task_digit", "task_ink"] * 2

    for (beat, before), (_, after) in itertools.pairwise(records):
        task, other = ("digit", "ink") if beat == "task_digit" else ("ink", "digit")
        assert same_weights(before[f"head_{other}"], after[f"head_{other}"])
        assert not same_weights(before[f"head_{task}"], after[f"head_{task}"])
        assert not same_weights(before["backbone"], after["backbone"])


def test_fixed_weights_scale_the_task_losses(digits):
    train, _ = digits
    result = beatloop.fit(
        "multitask", data=small(train), epochs=2, seed=0, config={"weights": (1.0, 0.0)}
    )
    assert result.history["weight_digit"] == [1.0, 1.0] and result.history["weight_ink"] == [
        0.0,
        0.0,
    ]
    assert result.history["total"] == pytest.approx(result.history["digit_loss"], rel=1e-5)


def test_dwa_weights_follow_the_formula_from_the_logged_losses(digits):
    train, _ = digits
    result = beatloop.fit(
        "multitask", data=small(train), epochs=4, seed=0,
        config={"weighting": "dwa", "dwa_temperature": 2.0},
    )  # fmt: skip
    history = result.history
    assert history["weight_digit"][:2] == [1.0, 1.0] and history["weight_ink"][:2] == [1.0, 1.0]
    for epoch in (2, 3):  # weights used in an epoch come from the two epochs before it
        ratios = [
            history[f"{t}_loss"][epoch - 1] / history[f"{t}_loss"][epoch - 2]
            for t in ("digit", "ink")
        ]
        exps = [math.exp(r / 2.0) for r in ratios]
        by_hand = [2 * e / sum(exps) for e in exps]
        assert history["weight_digit"][epoch] == pytest.approx(by_hand[0], rel=1e-6)
        assert history["weight_ink"][epoch] == pytest.approx(by_hand[1], rel=1e-6)
        assert sum(by_hand) == pytest.approx(2.0)
    assert dwa_weights([1.0, 2.0], [1.0, 1.0], 1.0)[1] > 1.0  # the slower task gains weight


def test_uncertainty_weight_falls_for_a_task_whose_loss_is_inflated(digits):
    train, _ = digits
    ink = train["x"].mean(axis=1).astype(np.float32)
    config = {
        "weighting": "uncertainty",
        "tasks": ("digit", "level=regression"),
        "learning_rate": 0.01,
    }
    weights = {}
    for scale in (1.0, 30.0):
        history = beatloop.fit(
            "multitask", data=small(train, 512, level=ink * scale), epochs=4, seed=0, config=config
        ).history
        weights[scale] = history["weight_level"]
    # exp(-s): the learned variance of the inflated task grows, so its weight drops.
    assert weights[30.0][-1] < 1.0 < weights[1.0][-1]
    assert weights[30.0][-1] < weights[30.0][0]


@pytest.mark.parametrize(
    "config, message",
    [
        ({"tasks": ("digit",)}, "at least two tasks"),
        ({"tasks": ("digit", "colour=classify")}, "is not 'digit', 'ink'"),
        ({"weights": (1.0,)}, "weights gives 1 value"),
    ],
)
def test_bad_task_configs(config, message):
    with pytest.raises(beatloop.ConfigError, match=message):
        beatloop.make_recipe("multitask", config)


def test_task_keys_are_checked_against_the_data(digits):
    train, _ = digits
    with pytest.raises(beatloop.DataError, match=r"\['level', 'x', 'y'\]"):
        beatloop.fit(
            "multitask", data=small(train), config={"tasks": ("digit", "level=regression")}
        )


def test_a_users_backbone_and_head(digits):
    import keras

    train, _ = digits
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="tanh")])
    head = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1)])
    result = beatloop.fit(
        "multitask", data=small(train), epochs=2, seed=0,
        models={"backbone": backbone, "head_ink": head},
    )  # fmt: skip
    assert result.models["backbone"] is backbone and result.models["head_ink"] is head
    assert result.history["ink_loss"][1] < result.history["ink_loss"][0]
