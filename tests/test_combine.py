"""Gradient transforms and combinations users write: ``Beat(transform=fn)``,
``Group(combine=fn)`` and the built-in ``PCGrad``, checked against hand-written loops
(in a fresh process, bit for bit), by hand-computed updates, and through a SIGKILL."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    TwoModels,
    all_weights,
    assert_same_weights,
    dict_batches,
    history_records,
    run_python,
    same_weights,
    start_python,
    worker,
)

import beatloop
from beatloop import Beat, Group, PCGrad, Schedule

WORKERS = Path(__file__).parent / "workers"
pcgrad_run = worker("pcgrad_run")

# --- transforms and combinations as values ----------------------------------------------


def clip_rows(gradients, variables):
    return [tf.clip_by_norm(g, 1.0) for g in gradients]


def test_describe_names_the_users_functions_and_the_built_ins():
    beat = Beat("fit_a", "opt", "a", transform=clip_rows)
    assert beat.describe() == "fit_a: loss=fit_a optimizer=opt updates=a transform=clip_rows"
    clipped = Beat("fit_a", "opt", "a", transform=beatloop.ClipByNorm(1.0))
    assert clipped.describe().endswith("transform=(clip each tensor to norm 1)")
    beats = (Beat("fit_a", "opt", "a"), Beat("fit_b", "opt", "a"))
    group = Group("shared", beats, combine=PCGrad())
    assert group.describe().startswith("shared: simultaneous forward=shared combine=PCGrad [")
    mean = Group("shared", beats, combine=PCGrad(reduction="mean"))
    assert "combine=PCGrad(reduction=mean) [" in mean.describe()
    assert "combine=clip_rows [" in Group("shared", beats, combine=clip_rows).describe()


@pytest.mark.parametrize(
    "bad, words",
    [
        ("clip", "got 'clip' (a str), which is not callable"),
        (lambda gradients: gradients, "got <lambda>, whose signature (gradients) cannot take two"),
        (
            beatloop.ClipByNorm,
            "got ClipByNorm, a class, not an instance: pass one, e.g. ClipByNorm(",
        ),
    ],
)
def test_a_wrong_transform_or_combine_is_a_beatloop_error_naming_it(bad, words):
    with pytest.raises(beatloop.BeatloopError) as caught:
        Beat("fit_a", "opt", "a", transform=bad)
    assert isinstance(caught.value, beatloop.ScheduleError)
    message = str(caught.value)
    assert "beat 'fit_a': transform= must be a callable fn(gradients, variables)" in message
    assert words in message
    with pytest.raises(beatloop.ScheduleError, match="group 'shared': combine= must be a"):
        Group("shared", (Beat("fit_a", "opt", "a"),), combine=bad)


def test_the_built_in_clips_take_the_variables_too():
    grads = [tf.constant([3.0, 4.0])]
    assert np.allclose(beatloop.ClipByNorm(1.0)(grads, [None])[0], [0.6, 0.8])
    assert np.allclose(beatloop.ClipByValue(1.0)(grads)[0], [1.0, 1.0])


def numpy_pcgrad(tasks: list[np.ndarray]) -> np.ndarray:
    """Yu et al.'s projection in numpy, the other tasks visited in index order."""
    projected = []
    for i, g in enumerate(tasks):
        g = g.astype(np.float64).copy()
        for j, other in enumerate(tasks):
            if j != i and g @ other < 0:
                g = g - (g @ other) / (other @ other) * other
        projected.append(g)
    return np.sum(projected, axis=0)


def test_pcgrad_projects_conflicting_task_gradients_in_a_fixed_order():
    rng = np.random.default_rng(0)
    tasks = [rng.normal(size=7).astype(np.float32) for _ in range(3)]
    assert any(tasks[i] @ tasks[j] < 0 for i in range(3) for j in range(i))  # conflicts
    # Split over two "variables" of shapes (2, 2) and (3,), as a beat's gradients come.
    grads = [[tf.reshape(t[:4], (2, 2)), tf.constant(t[4:])] for t in tasks]
    combined = PCGrad()(grads, [None, None])
    assert [tuple(g.shape) for g in combined] == [(2, 2), (3,)]
    flat = np.concatenate([np.ravel(g) for g in combined])
    np.testing.assert_allclose(flat, numpy_pcgrad(tasks), rtol=1e-5)
    assert not np.allclose(flat, np.sum(tasks, axis=0), rtol=1e-3)  # surgery happened
    mean = PCGrad(reduction="mean")(grads, [None, None])
    np.testing.assert_allclose(np.concatenate([np.ravel(g) for g in mean]), flat / 3, rtol=1e-6)
    agreeing = [[tf.constant([1.0, 2.0])], [tf.constant([2.0, 1.0])]]
    np.testing.assert_array_equal(PCGrad()(agreeing, [None])[0], [3.0, 3.0])  # just the sum


# --- in a run --------------------------------------------------------------------------------


def halve(gradients, variables):
    return [0.5 * g for g in gradients]


def digits_batches(digits, rows=128):
    train, _ = digits
    return dict_batches(train, 32, rows)


def test_a_plain_function_transform_sees_the_beats_gradients_and_variables(digits):
    seen = []

    def halve_and_look(gradients, variables):
        seen.append([v.path for v in variables])
        return halve(gradients, variables)

    data = digits_batches(digits)
    schedule = Schedule(TwoModels.beat("a", transform=halve_and_look), frozen="b")
    halved = beatloop.fit(TwoModels(schedule, learning_rate=0.02), data=data, seed=0)
    assert seen and seen[0] == ["a/dense/kernel", "a/dense/bias"]
    # SGD on half the gradient is SGD at half the rate: the same bits (powers of two).
    plain = Schedule(TwoModels.beat("a"), frozen="b")
    slower = beatloop.fit(TwoModels(plain, learning_rate=0.01), data=data, seed=0)
    assert_same_weights(all_weights(halved.models), all_weights(slower.models))
    assert not same_weights(all_weights(halved.models), all_weights(TwoModels().build_models({})))


def test_a_transform_returning_the_wrong_number_of_gradients_fails_at_trace(digits):
    def first_only(gradients, variables):
        return gradients[:1]

    schedule = Schedule(TwoModels.beat("a", transform=first_only), frozen="b")
    with pytest.raises(beatloop.ScheduleError, match=r"returned 1 item\(s\) for 2 variable"):
        beatloop.fit(TwoModels(schedule), data=digits_batches(digits, 32), seed=0)


def test_a_users_transform_that_raises_is_a_user_code_error(digits):
    def broken(gradients, variables):
        raise RuntimeError("no clipping today")

    schedule = Schedule(TwoModels.beat("a", transform=broken), frozen="b")
    with pytest.raises(beatloop.UserCodeError, match="no clipping today") as caught:
        beatloop.fit(TwoModels(schedule), data=digits_batches(digits, 32), seed=0)
    assert isinstance(caught.value.__cause__, RuntimeError)


class Shared(beatloop.Recipe):
    """Model ``a`` (and its own head ``b``) fitted to ``y`` by two beats in one combining
    group: ``fit_a`` updates ``a``; ``fit_ab`` updates ``a`` and ``b`` (test recipe)."""

    name = "shared_combine_test"

    def __init__(self, combine, optimizers=("opt", "opt"), learning_rate=0.05):
        super().__init__()
        self.combine, self.optimizer_names = combine, optimizers
        self.learning_rate = learning_rate

    def build_models(self, spec):
        keras.utils.set_random_seed(0)
        return {
            "a": keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)], name="a"),
            "b": keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)], name="b"),
        }

    def build_optimizers(self):
        return {name: keras.optimizers.SGD(self.learning_rate) for name in ("opt", "other")}

    def forwards(self):
        def both(models, batch):
            a = models["a"](batch["x"])
            return {"a": a, "ab": models["b"](a)}

        return {"both": both}

    def losses(self):
        def fit(key):
            return lambda outputs, batch: tf.reduce_mean(tf.square(outputs[key] - batch["y"]))

        return {"fit_a": fit("a"), "fit_ab": fit("ab")}

    def schedule(self):
        first, second = self.optimizer_names
        beats = (Beat("fit_a", first, "a"), Beat("fit_ab", second, ("a", "b")))
        return Schedule(Group("both", beats, combine=self.combine), shared="a")


def shared_data(rows=4, x=None):
    if x is None:
        x = np.linspace(-1, 1, rows * 4, dtype=np.float32).reshape(rows, 4)
    return tf.data.Dataset.from_tensor_slices({"x": x, "y": np.full((rows, 1), 2.0, np.float32)})


def test_a_combine_gets_each_beats_gradient_of_the_shared_variables_and_applies_once():
    seen = []

    def first_minus_half_second(gradients, variables):
        seen.append(([len(g) for g in gradients], [v.path for v in variables]))
        return [g1 - 0.5 * g2 for g1, g2 in zip(*gradients, strict=True)]

    data = shared_data().batch(4)  # one step
    result = beatloop.fit(Shared(first_minus_half_second), data=data, seed=0)
    assert seen[0] == ([2, 2], ["a/dense/kernel", "a/dense/bias"])
    assert int(result.optimizers["opt"].iterations) == 1  # one apply for the whole group

    start = Shared(None).build_models({})
    batch = next(iter(data))
    with tf.GradientTape(persistent=True) as tape:
        a = start["a"](batch["x"])
        ab = start["b"](a)
        fit_a = tf.reduce_mean(tf.square(a - batch["y"]))
        fit_ab = tf.reduce_mean(tf.square(ab - batch["y"]))
    shared = start["a"].trainable_variables
    combined = [
        g1 - 0.5 * g2
        for g1, g2 in zip(tape.gradient(fit_a, shared), tape.gradient(fit_ab, shared), strict=True)
    ]
    head = tape.gradient(fit_ab, start["b"].trainable_variables)
    for got, before, grad in zip(
        result.models["a"].weights + result.models["b"].weights,
        shared + start["b"].trainable_variables,
        combined + head,
        strict=True,
    ):
        np.testing.assert_allclose(got.numpy(), before.numpy() - 0.05 * grad.numpy(), rtol=1e-6)


def test_binding_refuses_a_combining_group_with_two_optimizers_in_one_error():
    recipe = Shared(PCGrad(), optimizers=("opt", "other"))
    with pytest.raises(beatloop.ScheduleError) as caught:
        beatloop.fit(recipe, data=shared_data().batch(4), seed=0)
    (problem,) = caught.value.problems
    assert "group 'both' combines its beats' gradients (combine=PCGrad)" in problem
    assert "beat 'fit_a' uses 'opt', beat 'fit_ab' uses 'other'" in problem


def test_binding_refuses_a_combining_group_whose_beats_share_nothing():
    beats = (TwoModels.beat("a"), TwoModels.beat("b"))
    schedule = Schedule(Group("both", beats, combine=PCGrad()))
    models = TwoModels().build_models({})
    optimizers = TwoModels().build_optimizers()
    with pytest.raises(beatloop.ScheduleError) as caught:
        beatloop.bind(schedule, models, optimizers, {"fit_a": None, "fit_b": None})
    problems = "\n".join(caught.value.problems)
    assert "no variable is updated by two or more of its beats" in problems
    assert "must use one optimizer" in problems  # opt_a and opt_b: both rules, one error


def first_clipped(gradients, variables):
    """The first beat's gradients, clipped to ±1e-3 (the second beat's are ignored)."""
    return [tf.clip_by_value(g, -1e-3, 1e-3) for g in gradients[0]]


def clip_values(gradients, variables):
    return [tf.clip_by_value(g, -1e-3, 1e-3) for g in gradients]


def applied(optimizer) -> int:
    """How many updates a loss-scaling optimizer applied (it skips overflowing steps)."""
    return int(optimizer.inner_optimizer.iterations)


def test_under_loss_scaling_a_combine_and_a_transform_see_true_gradients():
    """With a loss scale of 2**15 a function that saw scaled gradients would clip at a
    32768th of the true threshold; the updates show the true one. (The first steps
    overflow in float16 and are skipped, as the scale falls: only applied ones count.)"""
    data = shared_data(64, x=np.full((64, 4), 0.5, np.float32)).batch(4)  # same sign each step
    result = beatloop.fit(Shared(first_clipped), data=data, seed=0, precision="mixed_float16")
    optimizer = result.optimizers["opt"]
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and applied(optimizer)
    start = Shared(None).build_models({})["a"].get_weights()[0]
    moved = result.models["a"].get_weights()[0] - start
    np.testing.assert_allclose(np.abs(moved), applied(optimizer) * 0.05 * 1e-3, rtol=1e-3)

    clipped = Schedule(TwoModels.beat("a", transform=clip_values), frozen="b")
    x = np.ones((64, 64), np.float32) / 64
    nines = tf.data.Dataset.from_tensor_slices({"x": x, "y": np.full(64, 9, np.int32)}).batch(4)
    mixed = beatloop.fit(TwoModels(clipped), data=nines, seed=0, precision="mixed_float16")
    optimizer = mixed.optimizers["opt_a"]
    start = TwoModels().build_models({})["a"].get_weights()[0]
    moved = mixed.models["a"].get_weights()[0] - start
    np.testing.assert_allclose(np.abs(moved), applied(optimizer) * 0.1 * 1e-3, rtol=1e-3)


# --- the multitask recipe ---------------------------------------------------------------------


def test_multitask_pcgrad_learns_and_differs_from_the_summed_joint_step(digits):
    train, _ = digits
    data = dict_batches(train, 64, 512)
    config = {"hidden": 16, "learning_rate": 0.01}
    pcgrad = beatloop.fit("multitask", data=data, epochs=3, seed=0,
                          config={**config, "combine": "pcgrad"})  # fmt: skip
    summed = beatloop.fit("multitask", data=data, epochs=3, seed=0, config=config)
    for figure in ("digit_loss", "ink_loss"):
        assert pcgrad.history[figure][-1] < pcgrad.history[figure][0]
    assert pcgrad.history["digit_loss"] != summed.history["digit_loss"]
    assert not same_weights(all_weights(pcgrad.models), all_weights(summed.models))
    assert "combine=PCGrad" in pcgrad.schedule.describe()
    assert int(pcgrad.optimizers["optimizer"].iterations) == 3 * 8  # one apply a step


def test_multitask_pcgrad_in_debug_mode_runs_the_same_algorithm(digits):
    train, _ = digits
    data = dict_batches(train, 64, 128)
    config = {"combine": "pcgrad", "hidden": 16, "learning_rate": 0.01}
    compiled = beatloop.fit("multitask", data=data, seed=0, config=config, progress=False)
    eager = beatloop.fit("multitask", data=data, seed=0, config=config, debug=True)
    # Eager kernels and compiled graphs may round differently; the algorithm is the same.
    for name, values in all_weights(compiled.models).items():
        np.testing.assert_allclose(all_weights(eager.models)[name], values, rtol=1e-4, atol=1e-6)


def test_multitask_pcgrad_runs_under_mixed_precision_and_refuses_alternating(digits):
    train, _ = digits
    result = beatloop.fit(
        "multitask", data=dict_batches(train, 64, 128), seed=0, precision="mixed_float16",
        config={"combine": "pcgrad", "weighting": "uncertainty", "hidden": 16},
    )  # fmt: skip
    assert np.isfinite(result.history["task_digit"][0]) and np.isfinite(
        result.history["task_ink"][0]
    )
    assert all(np.isfinite(w).all() for w in all_weights(result.models).values())
    with pytest.raises(beatloop.ConfigError, match=r"combine='pcgrad' .* use schedule='joint'"):
        beatloop.make_recipe("multitask", {"combine": "pcgrad", "schedule": "alternating"})


# --- against hand-written loops, and through a SIGKILL ---------------------------------------


@pytest.fixture(scope="module")
def worker_reports(tmp_path_factory) -> dict[str, dict]:
    """One fresh process for the two tests below: ``workers/pcgrad_mirrored.py``, which
    first runs ``workers/combine_reference.py``'s comparisons (before it traces anything
    else), then its own; each report by the worker's name."""
    folder = tmp_path_factory.mktemp("combine_workers")
    mirrored, reference = folder / "mirrored.json", folder / "report.json"
    run_python(WORKERS / "pcgrad_mirrored.py", mirrored, reference, timeout=600)  # two runs' time
    names = {"combine_reference": "report.json", "pcgrad_mirrored": "mirrored.json"}
    return {name: json.loads((folder / file).read_text()) for name, file in names.items()}


@pytest.mark.slow
def test_a_transform_and_three_task_pcgrad_match_hand_written_loops_bit_for_bit(worker_reports):
    """In a fresh process (see ``workers/combine_reference.py``): a plain function as
    ``transform=``, and the multitask recipe's PCGrad over three tasks at
    steps_per_execution 1 and 4, each against its ``tf.function`` loop for 2 epochs."""
    report = worker_reports["combine_reference"]
    assert sorted(report) == ["pcgrad spe=1", "pcgrad spe=4", "transform"]
    for name, figures in report.items():
        assert figures["moved"] > 1e-3, name  # training moved the weights
        assert figures["max_difference"] == 0.0, name  # and both loops moved them alike
    assert report["transform"]["transform_mattered"] > 1e-3  # the clip changed the run


@pytest.mark.slow
def test_three_task_pcgrad_killed_mid_epoch_resumes_bit_identical(tmp_path):
    """10 steps an epoch, checkpoints every 4 (4, 8, 10, 12, 16, 20); the kill at step 14
    loses two steps."""
    base = {"epochs": 2, "checkpoint_every": 4}
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    worker = WORKERS / "pcgrad_run.py"
    spec = {**base, "run_dir": str(killed_dir), "out": "unused", "kill_at": 14}
    killed = start_python(worker, json.dumps(spec))
    try:  # the uninterrupted run and the resume are fitted here: no process needed
        full = pcgrad_run.fit({**base, "run_dir": str(full_dir)})
    finally:
        _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    resumed = pcgrad_run.fit({**base, "run_dir": str(killed_dir)})
    assert resumed.resumed_from is not None and resumed.steps == 20
    assert_same_weights(all_weights(resumed.models), all_weights(full.models))
    assert history_records(killed_dir) == history_records(full_dir)


@pytest.mark.slow
def test_three_task_pcgrad_on_two_replicas_equals_one_device(worker_reports):
    """MirroredStrategy over two logical CPUs: PCGrad combines the global batch's task
    gradients, not each replica's (per-replica PCGrad ends ~1e-1 away), so the runs
    differ by float32 round-off only (two half-batch sums instead of one)."""
    report = worker_reports["pcgrad_mirrored"]
    assert report["replicas"] == 2
    assert report["max_move"] > 1e-2
    assert report["max_difference"] < 1e-6
