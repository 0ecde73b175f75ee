"""Binding a schedule to models: every rule checked, every problem in one error."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import beatloop
from beatloop import Beat, Schedule, ScheduleError, bind
from beatloop.core.compiled.phased import bind_schedule


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


# --- random draws and exact resume ---------------------------------------------------------

SEEDED = keras.random.SeedGenerator(1)
GENERATOR = tf.random.Generator.from_seed(1)
DROPOUT = keras.layers.Dropout(0.5, seed=1)
NOISE = keras.layers.GaussianNoise(0.1, seed=1)


@pytest.mark.parametrize(
    "draw, expected",
    [
        (lambda x: x + tf.random.normal([4]), ["RandomStandardNormal"]),
        (lambda x: x + tf.random.uniform([4]), ["RandomUniform"]),
        (lambda x: x + tf.random.truncated_normal([4]), ["TruncatedNormal"]),
        (lambda x: tf.random.categorical(x[None], 2), ["Multinomial"]),
        (lambda x: tf.random.shuffle(x), ["RandomShuffle"]),
        (lambda x: tf.nn.dropout(x, 0.5), ["RandomUniform"]),
        (
            lambda x: tf.cond(x[0] > 0, lambda: tf.random.gamma([4], 1.0), lambda: x),
            ["RandomGamma"],
        ),
        (lambda x: x + GENERATOR.normal([4]) + GENERATOR.uniform([4]), []),
        (lambda x: DROPOUT(x, training=True), []),
        (lambda x: NOISE(x, training=True), []),
        (lambda x: x + keras.random.normal([4], seed=SEEDED), []),
        (lambda x: tf.random.stateless_normal([4], [1, 2]), []),
    ],
)
def test_global_random_ops_are_recognised(draw, expected):
    from beatloop.core.compiled.randomness import global_random_ops, new_operations

    def traced(x):
        with new_operations() as created:
            draw(x)
        found.extend(global_random_ops(created))
        return x

    found = []
    tf.function(traced).get_concrete_function(tf.TensorSpec([4], tf.float32))
    assert found == expected


def test_a_loss_drawing_global_random_numbers_warns_naming_its_beat():
    def noisy(models, batch):
        noise = tf.random.normal(tf.shape(batch["x"]))
        return mse_through_both(models, {**batch, "x": batch["x"] + noise})

    schedule = Schedule(
        (
            Beat(loss="noisy", optimizer="opt", updates="encoder"),
            Beat(loss="mse", optimizer="opt", updates="head"),
        )
    )
    losses = {"noisy": noisy, "mse": mse_through_both}
    with pytest.warns(beatloop.ResumeWarning) as caught:
        bind(schedule, two_models(), {"opt": keras.optimizers.SGD()}, losses, SPEC, "mine")
    (warning,) = caught
    assert str(warning.message).startswith(
        "mine: the loss of beat 'noisy' draws from TensorFlow's global random ops "
        "(RandomStandardNormal)"
    )
    assert "models.random.normal(shape)" in str(warning.message)


@pytest.mark.parametrize(
    "name, config",
    [
        ("supervised", {"dropout": 0.5}),
        ("gan", {}),
        ("multitask", {}),
        ("risk_weighted", {}),
        ("style_transfer", {}),
        ("dqn", {}),
        ("contrastive", {}),
        ("contrastive", {"target": "ema"}),
        ("meta", {}),
        ("meta", {"order": "first"}),
        ("ppo", {}),
        ("ppo", {"shared_torso": True}),
    ],
)
def test_builtin_recipes_draw_from_the_runs_generator_only(name, config):
    recipe = beatloop.make_recipe(name, config)
    spec = recipe.default_data(0).train.element_spec
    models = recipe.build_models(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error", beatloop.ResumeWarning)
        bind_schedule(  # every phase's, for a recipe in phases
            recipe.schedule(), models, recipe.build_optimizers(), recipe.losses(), spec,
            forwards=recipe.forwards(), state=recipe.build_state(),
        )  # fmt: skip


def test_binding_does_not_advance_the_runs_generator():
    """Binding only traces the losses: the generator's state is the seed's."""

    def noisy(models, batch):
        noise = models.random.normal(tf.shape(batch["x"]))
        return mse_through_both(models, {**batch, "x": batch["x"] + noise})

    random = tf.random.Generator.from_seed(7)
    schedule = Schedule(Beat(loss="noisy", optimizer="opt", updates=("encoder", "head")))
    optimizers = {"opt": keras.optimizers.SGD()}
    bind(schedule, two_models(), optimizers, {"noisy": noisy}, SPEC, random=random)
    np.testing.assert_array_equal(
        random.state.numpy(), tf.random.Generator.from_seed(7).state.numpy()
    )


class LazyNoisy(beatloop.Recipe):
    """One model, built lazily (no ``Input``) unless ``built``; its loss draws noise from
    ``models.random`` (test recipe)."""

    name = "lazy_noisy_test"

    def __init__(self, built: bool):
        super().__init__()
        self.built = built

    def default_data(self, seed):
        raise NotImplementedError("a test passes its data")

    def build_models(self, batch_spec):
        inputs = [keras.Input((4,))] if self.built else []
        return {"m": keras.Sequential([*inputs, keras.layers.Dense(2)])}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.1)}

    def losses(self):
        return {"noisy": self.noisy}

    def noisy(self, models, batch):
        noise = models.random.normal(tf.shape(batch["x"]))
        return tf.reduce_mean(tf.square(models["m"](batch["x"] + noise) - batch["y"]))

    def schedule(self):
        return Schedule(Beat(loss="noisy", optimizer="sgd", updates="m"))


@pytest.mark.parametrize("built", [True, False])
def test_a_runs_generator_starts_at_its_seed_when_training_starts(built):
    from beatloop.core.data.batches import as_data_split
    from beatloop.core.running.engine import Engine

    rows = {"x": np.ones((8, 4), np.float32), "y": np.zeros((8, 2), np.float32)}
    data = as_data_split(tf.data.Dataset.from_tensor_slices(rows).batch(4))
    engine = Engine(LazyNoisy(built), data, seed=7)  # built, bound, loops traced
    np.testing.assert_array_equal(
        engine.parts.bound.random.state.numpy(), tf.random.Generator.from_seed(7).state.numpy()
    )
