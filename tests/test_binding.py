"""Binding a schedule to models: every rule checked, every problem in one error."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from beatloop import Beat, Schedule, ScheduleError, bind


def dense_model(name, units=3, inputs=4):
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(units)], name=name)


def two_models():
    return {"encoder": dense_model("encoder", 3), "head": dense_model("head", 2, inputs=3)}


def mse_through_both(models, batch):
    prediction = models["head"](models["encoder"](batch["x"]))
    return tf.reduce_mean(tf.square(prediction - batch["y"]))


SPEC = {"x": tf.TensorSpec([None, 4], tf.float32), "y": tf.TensorSpec([None, 2], tf.float32)}


def test_bind_resolves_variables_and_builds_optimizers():
    models = two_models()
    optimizers = {"opt": keras.optimizers.Adam()}
    schedule = Schedule(Beat(loss="mse", optimizer="opt", updates=("encoder", "head")))
    bound = bind(schedule, models, optimizers, {"mse": mse_through_both}, SPEC)
    (beat,) = bound.beats
    paths = [v.path.split("/") for v in beat.variables]
    assert [(p[0], p[-1]) for p in paths] == [
        ("encoder", "kernel"),
        ("encoder", "bias"),
        ("head", "kernel"),
        ("head", "bias"),
    ]
    assert beat.updated_models == ("encoder", "head")
    assert beat.training == frozenset({"encoder", "head"})
    # Built at bind, for these variables: before any update Adam holds its iteration
    # count, its learning rate, and a momentum and a velocity per variable.
    assert optimizers["opt"].built
    assert len(optimizers["opt"].variables) == 2 + 2 * len(beat.variables)
    assert {id(v) for v in optimizers["opt"]._trainable_variables} == {
        id(v) for v in beat.variables
    }


def test_one_error_lists_every_problem():
    models = two_models()
    models["orphan"] = dense_model("orphan", 1)
    optimizers = {"opt": keras.optimizers.SGD()}
    schedule = Schedule(
        (
            Beat(loss="mse", optimizer="opt", updates=("encoder", "head")),
            Beat(loss="msee", optimizer="optt", updates="head", name="second"),
            Beat(loss="mse", optimizer="opt", updates="nobody", name="third"),
        )
    )
    with pytest.raises(ScheduleError) as caught:
        bind(schedule, models, optimizers, {"mse": mse_through_both}, SPEC)
    text = str(caught.value)
    problems = caught.value.problems
    assert "loss 'msee' (did you mean 'mse'?)" in text
    assert "optimizer 'optt' (did you mean 'opt'?)" in text
    assert "no model 'nobody'" in text
    assert sum("is updated by no beat and not declared frozen" in p for p in problems) == 2
    assert sum("not declared shared" in p for p in problems) == 2  # head kernel and bias
    assert len(problems) == 7


def test_frozen_and_shared_declarations_satisfy_the_rules():
    models = two_models()
    optimizers = {"a": keras.optimizers.SGD(), "b": keras.optimizers.SGD()}
    losses = {"mse": mse_through_both}
    schedule = Schedule(
        (
            Beat(loss="mse", optimizer="a", updates="head", name="first"),
            Beat(loss="mse", optimizer="b", updates="head:*kernel", name="second"),
        ),
        frozen="encoder",
        shared="head:*kernel",
    )
    bound = bind(schedule, models, optimizers, losses, SPEC)
    assert [len(b.variables) for b in bound.beats] == [2, 1]
    assert bound.beats[1].variables[0].path.endswith("kernel")

    contradictory = Schedule(Beat(loss="mse", optimizer="a", updates="head"), frozen="head")
    with pytest.raises(ScheduleError, match="declared frozen but"):
        bind(contradictory, two_models(), {"a": keras.optimizers.SGD()}, losses, SPEC)


def test_selector_that_matches_nothing_names_what_exists():
    models = two_models()
    schedule = Schedule(Beat(loss="mse", optimizer="opt", updates="head:conv*"), frozen="encoder")
    with pytest.raises(ScheduleError, match=r"matches no trainable variable; 'head' has: head/"):
        bind(schedule, models, {"opt": keras.optimizers.SGD()}, {"mse": mse_through_both}, SPEC)


def test_disconnected_variable_is_found_at_trace_before_any_update():
    models = two_models()
    before = [v.numpy() for m in models.values() for v in m.weights]

    def head_only(models, batch):
        # The encoder is run outside any gradient path: its variables get None.
        features = tf.stop_gradient(models["encoder"](batch["x"]))
        return tf.reduce_mean(tf.square(models["head"](features) - batch["y"]))

    schedule = Schedule(Beat(loss="mse", optimizer="opt", updates=("encoder", "head")))
    with pytest.raises(ScheduleError) as caught:
        bind(schedule, models, {"opt": keras.optimizers.SGD(1.0)}, {"mse": head_only}, SPEC)
    missing = [p for p in caught.value.problems if "gives it no gradient" in p]
    assert len(missing) == 2 and all("encoder" in p for p in missing)
    after = [v.numpy() for m in models.values() for v in m.weights]
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(b, a)


def test_optimizer_built_for_other_variables_is_refused():
    models = two_models()
    used = keras.optimizers.Adam()
    used.build(dense_model("elsewhere").trainable_variables)
    schedule = Schedule(Beat(loss="mse", optimizer="opt", updates=("encoder", "head")))
    with pytest.raises(ScheduleError, match="already built for other variables"):
        bind(schedule, models, {"opt": used}, {"mse": mse_through_both}, SPEC)


def test_optimizer_shared_by_two_beats_is_built_for_their_union():
    models = two_models()
    optimizer = keras.optimizers.Adam()
    schedule = Schedule(
        (
            Beat(loss="mse", optimizer="opt", updates="encoder", name="first"),
            Beat(loss="mse", optimizer="opt", updates="head", name="second"),
        )
    )
    bind(schedule, models, {"opt": optimizer}, {"mse": mse_through_both}, SPEC)
    assert {id(v) for v in optimizer._trainable_variables} == {
        id(v) for m in models.values() for v in m.trainable_variables
    }
