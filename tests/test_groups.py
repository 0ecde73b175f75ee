"""Simultaneous groups: beats whose gradients all come from one forward pass and one
state, checked against the TensorFlow DCGAN tutorial's hand-written step."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    all_weights,
    assert_same_weights,
    gan_data,
    run_python,
    same_weights,
    tutorial_dcgan_training,
    twin_models,
)

import beatloop
from beatloop import Beat, Group, Schedule
from beatloop.core.compiled.binding import bind

WORKER = Path(__file__).parent / "workers" / "tutorial_dcgan.py"
LATENT = 8
GAN = {"architecture": "conv", "hidden": 16, "latent_dim": LATENT, "batch_size": 16}


@pytest.mark.slow
def test_simultaneous_gan_and_the_readme_recipe_match_the_tutorials_hand_written_step(
    tmp_path,
):
    """In a fresh process: grappler's arithmetic optimizer may sum a gradient in another
    order when earlier runs in the same process named its graph's nodes differently, so
    bit-for-bit comparisons run on a clean slate (see the worker's docstring)."""
    out = tmp_path / "tutorial.json"
    run_python(WORKER, out)
    report = json.loads(out.read_text())
    assert sorted(report) == ["gan spe=1", "gan spe=3", "readme dcgan"]
    for name, figures in report.items():
        assert figures["moved"] > 1e-3, name  # training moved the weights
        assert figures["max_difference"] == 0.0, name  # and both loops moved them alike


def test_alternating_gan_is_a_different_algorithm():
    """The two-beat port draws new noise and meets an updated discriminator: it must not
    match the tutorial (else the test above could not tell the two apart)."""
    data = gan_data(32, 16)
    recipe = beatloop.make_recipe("gan", GAN)
    ours, theirs = twin_models(recipe, data)
    beatloop.fit(recipe, data=data, models=ours, epochs=1, seed=7, progress=False)
    tutorial_dcgan_training(
        theirs["generator"], theirs["discriminator"], data, epochs=1, seed=7, latent=LATENT
    )
    assert not same_weights(all_weights(ours), all_weights(theirs))


def test_simultaneous_gan_resumes_bit_identically(tmp_path):
    data = gan_data(48, 16)
    config = {**GAN, "update": "simultaneous"}
    whole = beatloop.fit("gan", config=config, data=data, epochs=2, seed=4, progress=False)
    run_dir = tmp_path / "run"
    beatloop.fit("gan", config=config, data=data, epochs=1, seed=4, run_dir=run_dir)
    resumed = beatloop.fit("gan", config=config, data=data, epochs=2, run_dir=run_dir)
    assert resumed.resumed_from is not None
    assert_same_weights(all_weights(whole.models), all_weights(resumed.models))


def test_simultaneous_refuses_n_critic():
    with pytest.raises(beatloop.ConfigError, match=r"n_critic=3 .* update='alternating'"):
        beatloop.make_recipe("gan", {"update": "simultaneous", "n_critic": 3})


# --- groups as values ------------------------------------------------------------------------


def test_a_group_describes_itself_on_one_line_with_its_beats():
    group = Group(
        forward="shared",
        beats=(Beat("d_loss", "d_opt", "disc"), Beat("g_loss", "g_opt", "gen", log="last")),
        every=2,
    )
    schedule = Schedule((group, Beat("extra", "e_opt", "head")))
    first, second = schedule.describe().splitlines()
    assert first == (
        "1. shared: simultaneous forward=shared every=2 "
        "[d_loss: loss=d_loss optimizer=d_opt updates=disc] "
        "[g_loss: loss=g_loss optimizer=g_opt updates=gen log=last]"
    )
    assert second.startswith("2. extra:")
    assert [b.name for b in schedule.all_beats] == ["d_loss", "g_loss", "extra"]
    assert schedule.loss_names == ("d_loss", "g_loss", "extra")


@pytest.mark.parametrize(
    "beat, words",
    [
        (Beat("a", "o", "m", repeat=2), "sets repeat"),
        (Beat("a", "o", "m", every=3), "sets every"),
        (Beat("a", "o", "m", training=("m",)), "sets training"),
    ],
)
def test_a_group_refuses_what_only_the_group_can_set(beat, words):
    with pytest.raises(ValueError, match=f"{words}, but in a group the beats share one forward"):
        Group(forward="f", beats=(beat,))


def test_group_and_beat_names_are_unique_across_the_schedule():
    group = Group(forward="fit_a", beats=(Beat("x", "o", "a"),))
    with pytest.raises(ValueError, match="repeated: fit_a"):
        Schedule((group, Beat("fit_a", "o", "b")))


# --- binding ---------------------------------------------------------------------------------


def two_dense(seed=0):
    keras.utils.set_random_seed(seed)
    return {
        name: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)], name=name)
        for name in ("a", "b")
    }


def shared(models, batch):
    return {"a": models["a"](batch["x"]), "b": models["b"](batch["x"])}


def mse_of(key):
    return lambda outputs, batch: tf.reduce_mean(tf.square(outputs[key] - batch["y"]))


SPEC = {"x": tf.TensorSpec([None, 4], tf.float32), "y": tf.TensorSpec([None, 1], tf.float32)}
OPTIMIZERS = ("opt_a", "opt_b")


def bind_group(group, forwards, models=None, **schedule):
    models = models or two_dense()
    optimizers = {name: keras.optimizers.SGD(0.1) for name in OPTIMIZERS}
    losses = {"fit_a": mse_of("a"), "fit_b": mse_of("b")}
    return bind(Schedule(group, **schedule), models, optimizers, losses, SPEC, forwards=forwards)


def test_binding_a_group_names_every_problem_at_once():
    group = Group(
        forward="sharde",
        beats=(Beat("fit_a", "opt_a", "a"), Beat("fit_c", "opt_b", "b")),
        training=("a", "c"),
    )
    with pytest.raises(beatloop.ScheduleError) as caught:
        bind_group(group, {"shared": shared})
    problems = caught.value.problems
    assert any("uses loss 'fit_c'" in p for p in problems)
    assert any("forward 'sharde' (did you mean 'shared'?)" in p for p in problems)
    assert any("runs 'c' in training mode" in p for p in problems)


def test_binding_a_group_keeps_the_ownership_and_gradient_rules():
    overlapping = Group(
        forward="shared", beats=(Beat("fit_a", "opt_a", "a"), Beat("fit_b", "opt_b", "a"))
    )
    with pytest.raises(beatloop.ScheduleError) as caught:
        bind_group(overlapping, {"shared": shared})
    problems = "\n".join(caught.value.problems)
    assert "not declared shared" in problems and "updated by no beat" in problems

    def a_only(models, batch):
        return {"a": models["a"](batch["x"]), "b": tf.zeros_like(batch["y"])}

    disconnected = Group(
        forward="a_only", beats=(Beat("fit_a", "opt_a", "a"), Beat("fit_b", "opt_b", "b"))
    )
    with pytest.raises(
        beatloop.ScheduleError, match=r"beat 'fit_b' claims variable .* no gradient"
    ):
        bind_group(disconnected, {"a_only": a_only})


def test_a_group_runs_the_models_its_beats_update_in_training_mode_by_default():
    group = Group(forward="shared", beats=(Beat("fit_a", "opt_a", "a"),))
    bound = bind_group(group, {"shared": shared}, frozen="b")
    (entry,) = bound.groups
    assert entry.training == frozenset({"a"})
    explicit = Group(forward="shared", beats=(Beat("fit_a", "opt_a", "a"),), training=("a", "b"))
    assert bind_group(explicit, {"shared": shared}, frozen="b").groups[0].training == {"a", "b"}


class Pair(beatloop.Recipe):
    """Models ``a`` and ``b`` fitted to ``y`` by one group (forward ``shared``): a
    test recipe whose schedule is handed in."""

    name = "pair_test"

    def __init__(self, schedule, losses=None, learning_rate=0.05):
        super().__init__()
        self._schedule, self._losses = schedule, losses
        self.learning_rate = learning_rate

    def build_optimizers(self):
        return {name: keras.optimizers.SGD(self.learning_rate) for name in OPTIMIZERS}

    def losses(self):
        return self._losses or {"fit_a": mse_of("a"), "fit_b": mse_of("b")}

    def forwards(self):
        return {"shared": shared}

    def schedule(self):
        return self._schedule

    def build_models(self, spec):
        return two_dense()


def pair_data(rows=8, batch=4, y=2.0):
    x = np.linspace(-1, 1, rows * 4, dtype=np.float32).reshape(rows, 4)
    targets = np.full((rows, 1), y, np.float32)
    return tf.data.Dataset.from_tensor_slices({"x": x, "y": targets}).batch(batch)


def both(**group):
    return Group(
        forward="shared",
        beats=(Beat("fit_a", "opt_a", "a"), Beat("fit_b", "opt_b", "b")),
        **group,
    )


def test_a_groups_every_and_repeat_count_whole_group_updates():
    data = pair_data(rows=16)  # four steps
    every = beatloop.fit(Pair(Schedule(both(every=2))), data=data, epochs=1, seed=0)
    repeat = beatloop.fit(Pair(Schedule(both(repeat=3))), data=data, epochs=1, seed=0)
    for result, applied in ((every, 2), (repeat, 12)):
        iterations = [int(result.optimizers[name].iterations) for name in OPTIMIZERS]
        assert iterations == [applied, applied]


def test_a_groups_beats_keep_their_transforms_and_constraints():
    beats = (
        Beat("fit_a", "opt_a", "a", transform=beatloop.ClipByValue(1e-3)),
        Beat("fit_b", "opt_b", "b", constraint=beatloop.ClipValues(-0.01, 0.01)),
    )
    data = pair_data(rows=4)  # one step
    result = beatloop.fit(Pair(Schedule(Group(forward="shared", beats=beats))), data=data)
    start = two_dense()
    moved = np.abs(result.models["a"].get_weights()[0] - start["a"].get_weights()[0])
    np.testing.assert_allclose(moved, 0.05 * 1e-3, rtol=1e-3)  # every gradient clipped
    assert np.abs(result.models["b"].get_weights()[0]).max() <= 0.01 + 1e-7


def test_the_nan_guard_names_the_group_beat_that_failed():
    def exploding(outputs, batch):
        return tf.reduce_mean(outputs["b"]) / 0.0 * 0.0  # nan

    recipe = Pair(Schedule(both()), losses={"fit_a": mse_of("a"), "fit_b": exploding})
    with pytest.raises(beatloop.NumericsError, match="beat 'fit_b' produced a non-finite loss"):
        beatloop.fit(recipe, data=pair_data(), epochs=1, seed=0)
    with pytest.raises(beatloop.NumericsError, match="beat 'fit_b' produced a non-finite loss"):
        beatloop.fit(recipe, data=pair_data(), epochs=1, seed=0, debug=True)


def test_a_group_in_debug_mode_and_under_mixed_precision():
    data = gan_data(32, 16)
    config = {**GAN, "update": "simultaneous"}
    recipe = beatloop.make_recipe("gan", config)
    compiled_models, eager_models = twin_models(recipe, data)
    beatloop.fit(recipe, data=data, models=compiled_models, seed=2, progress=False)
    beatloop.fit(recipe, data=data, models=eager_models, seed=2, debug=True, progress=False)
    # Eager kernels and compiled graphs may round differently; the algorithm is the same.
    for name, values in all_weights(compiled_models).items():
        np.testing.assert_allclose(all_weights(eager_models)[name], values, rtol=1e-4, atol=1e-5)
    mixed = beatloop.fit("gan", config=config, data=data, seed=2, precision="mixed_float16")
    assert all(
        isinstance(o, keras.optimizers.LossScaleOptimizer) for o in mixed.optimizers.values()
    )
    assert np.isfinite(mixed.history["g_loss"][0]) and np.isfinite(mixed.history["d_loss"][0])


def test_show_prints_a_group_as_one_line(capsys):
    from beatloop.cli import main

    assert main(["show", "gan", "--set", "update=simultaneous"]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if "simultaneous" in line and "[" in line]
    assert line.strip().startswith("1. gan_forward: simultaneous forward=gan_forward")
    assert "[g_loss: loss=g_loss" in line and "[d_loss: loss=d_loss" in line


def test_group_gradients_come_from_the_state_before_any_update():
    """Two beats both updating ``a`` (declared shared) in one group: each gradient is
    taken before either update, so the result is the sum of both from the same weights
    — unlike two beats in a row."""
    x = np.ones((4, 4), np.float32)
    y = np.full((4, 1), 2.0, np.float32)
    data = tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(4)

    class Twice(beatloop.Recipe):
        name = "twice_test"

        def build_optimizers(self):
            return {name: keras.optimizers.SGD(0.05) for name in OPTIMIZERS}

        def losses(self):
            return {"fit_a": mse_of("a"), "fit_b": mse_of("a")}

        def forwards(self):
            return {"shared": shared}

        def schedule(self):
            beats = (Beat("fit_a", "opt_a", "a"), Beat("fit_b", "opt_b", "a"))
            return Schedule(Group(forward="shared", beats=beats), shared="a", frozen="b")

        def build_models(self, spec):
            return two_dense()

        def default_data(self, seed):
            return None

    result = beatloop.fit(Twice(), data=data, epochs=1, seed=0, progress=False)
    start = two_dense()["a"]
    prediction = start(x)
    gradient = tf.reduce_mean(2 * (prediction - y)) * np.ones((4, 1), np.float32)
    expected_kernel = start.get_weights()[0] - 2 * 0.05 * gradient.numpy()
    np.testing.assert_allclose(
        result.models["a"].get_weights()[0], expected_kernel, rtol=1e-6, atol=1e-7
    )


def test_a_fit_traces_a_groups_forward_once_and_that_trace_finds_a_missing_gradient():
    traces = []

    def counted(models, batch):
        traces.append(len(traces))
        return shared(models, batch)

    class Counted(Pair):
        def forwards(self):
            return {"shared": counted}

    beatloop.fit(Counted(Schedule(both())), data=pair_data(), epochs=2, seed=0)
    assert len(traces) == 1  # the training loop's trace checks the gradients too

    def a_only(models, batch):
        return {"a": models["a"](batch["x"]), "b": tf.zeros_like(batch["y"])}

    class Disconnected(Pair):
        def forwards(self):
            return {"shared": a_only}

    for debug in (False, True):  # compiled: the loop's trace; debug: bind's own
        with pytest.raises(beatloop.ScheduleError) as caught:
            beatloop.fit(Disconnected(Schedule(both())), data=pair_data(), seed=0, debug=debug)
        assert len(caught.value.problems) == 2  # b's kernel and bias, each once
        assert all(
            p.startswith("beat 'fit_b' claims variable 'b/dense") and "no gradient" in p
            for p in caught.value.problems
        )


def test_an_engine_built_not_to_train_traces_its_training_loop_and_checks_it_on_first_call():
    from beatloop.core.data.batches import DataSplit
    from beatloop.core.running.engine import Engine

    def a_only(models, batch):
        return {"a": models["a"](batch["x"]), "b": tf.zeros_like(batch["y"])}

    class Disconnected(Pair):
        def forwards(self):
            return {"shared": a_only}

    split = DataSplit(pair_data(), pair_data())
    engine = Engine(Disconnected(Schedule(both())), split, trains=False)  # no error yet
    assert engine.parts.train_loop.trace_count == 0
    x = np.concatenate([batch["x"] for batch in pair_data().as_numpy_iterator()])
    a_loss = np.mean((engine.parts.bound.models["a"](x).numpy() - 2.0) ** 2)
    figures = engine.evaluate()  # its validation loop, traced as it was built
    assert figures == {"fit_a": pytest.approx(a_loss, rel=1e-6), "fit_b": 4.0}
    before = [w.numpy() for model in engine.parts.bound.models.values() for w in model.weights]
    with pytest.raises(beatloop.ScheduleError) as caught:
        engine.fit(1)
    assert len(caught.value.problems) == 2  # b's kernel and bias, as a training run says
    assert all("beat 'fit_b' claims variable" in p for p in caught.value.problems)
    after = [w.numpy() for model in engine.parts.bound.models.values() for w in model.weights]
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(b, a)
    trained = Engine(Pair(Schedule(both())), split, trains=False)
    trained.fit(2)  # traced now, trains as a run built to train does
    fitted = beatloop.fit(Pair(Schedule(both())), data=split, epochs=2, seed=0, progress=False)
    for name in ("a", "b"):
        ours, theirs = trained.parts.bound.models[name].weights, fitted.models[name].weights
        assert len(ours) == len(theirs) == 2
        for b, a in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(b.numpy(), a.numpy())
