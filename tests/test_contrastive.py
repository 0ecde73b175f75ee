"""The contrastive recipe: SimCLR and BYOL pretraining then a linear probe, bit for bit
the hand-written TensorFlow loop (tests/contrastive_hand.py) at one and several steps
per call; its views; its probe beating a probe on the random encoder; under a
MirroredStrategy with unequal replica shares, one device's run; ``show``, ``evaluate``
and config errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from contrastive_hand import SMALL, HandWritten, build_models, digits_data, weights_of
from helpers import run_python

import beatloop
from beatloop.cli import main
from beatloop.recipes.views import Views, shifted

WORKER = Path(__file__).parent / "workers" / "contrastive_mirrored.py"


class InitialWeights(beatloop.Callback):
    """The run's models' weights before its first step."""

    def on_fit_start(self, run):
        self.weights = weights_of(run.models)


def fit_small(target: str, spe: int, pretrain_epochs: int = 2, epochs: int = 3):
    train, validation = digits_data(160, SMALL["batch_size"])
    initial = InitialWeights()
    config = {**SMALL, "target": target, "pretrain_epochs": pretrain_epochs}
    result = beatloop.fit(
        "contrastive", config=config, data=(train, validation), epochs=epochs, seed=4,
        steps_per_execution=spe, callbacks=[initial], progress=False,
    )  # fmt: skip
    return result, initial.weights, train


@pytest.fixture(scope="module")
def hand_written_runs() -> dict:
    """The hand-written loop's runs, one per target, shared by both steps per call."""
    return {}


def hand_written(runs: dict, target: str, initial: dict, train) -> dict:
    """The hand-written loop's final weights from the recipe's ``initial`` weights, run
    once per target: the recipe starts from the same weights at every K (checked here
    against the run's own), so both K compare with one hand-written run."""
    if target not in runs:
        models = build_models(SMALL, byol=target == "ema")
        for name, model in models.items():
            model.set_weights(initial[name])
        hand = HandWritten(models, seed=4, spec=train.element_spec, byol=target == "ema")
        hand.train(train, 2, 1)
        runs[target] = initial, weights_of(models)
    start, weights = runs[target]
    assert sorted(start) == sorted(initial)
    for name in start:
        for index, (theirs, mine) in enumerate(zip(start[name], initial[name], strict=True)):
            np.testing.assert_array_equal(mine, theirs, err_msg=f"initial {name}/{index}")
    return weights


@pytest.mark.parametrize("target", ["none", "ema"])
@pytest.mark.parametrize("spe", [1, 3])
def test_the_recipe_equals_the_hand_written_loop_bit_for_bit(target, spe, hand_written_runs):
    """Two epochs of pretraining, one of the linear probe (5 steps an epoch); the
    hand-written loop is run once per target, from the same initial weights at both K."""
    result, initial, train = fit_small(target, spe)
    theirs = hand_written(hand_written_runs, target, initial, train)
    assert sorted(theirs) == sorted(result.models)
    ours = weights_of(result.models)
    for name in theirs:
        for index, (mine, hand) in enumerate(zip(ours[name], theirs[name], strict=True)):
            np.testing.assert_array_equal(mine, hand, err_msg=f"{name}/{index}")
    moved = [not np.array_equal(ours[n][0], initial[n][0]) for n in ("encoder", "linear_probe")]
    assert all(moved)
    if target == "ema":  # the target trails the online encoder
        assert not np.array_equal(ours["target_encoder"][0], ours["encoder"][0])
        assert not np.array_equal(ours["target_encoder"][0], initial["target_encoder"][0])
    history = result.history
    loss = "byol" if target == "ema" else "nt_xent"
    assert len(history[loss]) == len(history[f"val_{loss}"]) == 2
    assert len(history["linear_probe"]) == 1 and len(history["val_probe_accuracy"]) == 3


def test_a_view_shifts_each_image_by_its_own_offset_with_zeros_shifted_in():
    images = tf.reshape(tf.range(1.0, 2 * 4 * 5 + 1), [2, 4, 5, 1])
    moved = shifted(images, tf.constant([[1, -1], [0, 2]]), 2).numpy()[..., 0]
    first, second = images.numpy()[..., 0]
    expected_first = np.zeros((4, 5), np.float32)
    expected_first[1:, :-1] = first[:-1, 1:]  # one down, one left
    expected_second = np.zeros((4, 5), np.float32)
    expected_second[:, 2:] = second[:, :-2]  # two right
    np.testing.assert_array_equal(moved, [expected_first, expected_second])


def test_views_are_drawn_per_example_flipped_only_when_asked():
    x = tf.reshape(tf.range(3 * 64, dtype=tf.float32), [3, 64])
    plain = Views(max_shift=0, noise=0.0)(x, tf.random.Generator.from_seed(1))
    np.testing.assert_array_equal(plain, x)  # nothing asked, nothing changed
    flipped = Views(max_shift=0, noise=0.0, flip=True)(
        tf.tile(x[:1], [64, 1]), tf.random.Generator.from_seed(1)
    ).numpy()
    mirror = x.numpy()[0].reshape(8, 8)[:, ::-1].reshape(64)
    kinds = {tuple(row) == tuple(x.numpy()[0]) or tuple(row) == tuple(mirror) for row in flipped}
    assert kinds == {True}
    assert 10 < sum(np.array_equal(row, mirror) for row in flipped) < 54
    noisy = Views(max_shift=1, noise=0.1)(x, tf.random.Generator.from_seed(1)).numpy()
    assert noisy.shape == (3, 64) and not np.array_equal(noisy[0], noisy[1] - 64)


@pytest.fixture(scope="module")
def random_encoder_accuracy() -> float:
    """The linear probe on the encoder as initialised: 4 epochs on the built-in digits."""
    return fit_digits(0, 4)


def fit_digits(pretrain_epochs: int, epochs: int, target: str = "none") -> float:
    config = {"hidden": 64, "batch_size": 128, "pretrain_epochs": pretrain_epochs, "target": target}
    result = beatloop.fit("contrastive", config=config, epochs=epochs, seed=0, progress=False)
    return result.history["val_probe_accuracy"][-1]


@pytest.mark.parametrize("target", ["none", "ema"])
def test_the_probe_on_the_pretrained_encoder_beats_the_random_encoder(
    target, random_encoder_accuracy
):
    """Built-in digits, small sizes: 10 epochs of SimCLR (or BYOL) then 4 of the linear
    probe, against the same 4 epochs of the probe on the encoder as initialised."""
    pretrained = fit_digits(10, 14, target)
    assert pretrained > random_encoder_accuracy + 0.05, (pretrained, random_encoder_accuracy)


def test_show_prints_both_phases_and_the_ema_targets(capsys):
    assert main(["show", "contrastive", "--set", "target=ema", "--set", "pretrain_epochs=3"]) == 0
    out = capsys.readouterr().out
    assert "phase pretrain (epochs 1-3):" in out and "phase probe (epochs 4 on):" in out
    assert (
        "1. views: simultaneous forward=views training=encoder,projector,predictor,probe,"
        "target_encoder,target_projector [byol: loss=byol optimizer=pretrain "
        "updates=encoder,projector] [predictor: loss=byol optimizer=predictor "
        "updates=predictor] [probe: loss=probe optimizer=probe updates=probe]"
    ) in out
    assert "2. target_encoder: EMA source=encoder target=target_encoder decay=0.99" in out
    assert "3. target_projector: EMA source=projector target=target_projector" in out
    assert "frozen: encoder, projector, predictor, probe, target_encoder, target_projector" in out


def test_evaluate_on_its_run_dir_gives_the_last_figures_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    config = {**SMALL, "pretrain_epochs": 1, "target": "ema"}
    result = beatloop.fit("contrastive", config=config, epochs=2, seed=1, run_dir=run_dir)
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    figures = beatloop.evaluate(run_dir)
    # the last phase's validation figures (the probe phase's: its beat and the accuracy)
    assert set(figures) == {"linear_probe", "probe_accuracy"}
    assert figures == {name: result.history[f"val_{name}"][-1] for name in figures}
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == files


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"target": "moco"}, "config field 'target' expects 'none' | 'ema', got str 'moco'"),
        ({"temperature": 0.0}, "'temperature' must be > 0"),
        ({"ema_decay": 1.0}, "'ema_decay' must be < 1"),
        ({"pretrain_epochs": -1}, "'pretrain_epochs' must be >= 0"),
        ({"tempreature": 0.1}, "no config field 'tempreature' (did you mean 'temperature'?)"),
    ],
)
def test_bad_config_is_a_config_error_naming_the_field(config, words):
    with pytest.raises(beatloop.ConfigError) as caught:
        beatloop.make_recipe("contrastive", config)
    assert words in str(caught.value)


def test_data_that_is_not_images_is_refused_before_training():
    rows = {"x": np.zeros((8, 10), np.float32), "y": np.zeros(8, np.int32)}
    data = tf.data.Dataset.from_tensor_slices(rows).batch(4)
    with pytest.raises(beatloop.BeatloopError, match=r"'x' of shape \(None, 10\) is not images"):
        beatloop.fit("contrastive", data=data, epochs=1, seed=0, progress=False)


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("contrastive") / "mirrored.json"
    run_python(WORKER, str(out), timeout=500)
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("case", ["none", "ema", "defaults"])
def test_under_a_mirrored_strategy_it_trains_as_one_device(mirrored, case):
    """Four steps per compiled call. Global batches of 9 split 5 + 4 over two logical
    CPUs, each pass ending in a short batch within the same call as full ones (training's
    of one row: one replica with none; validation's 3 + 2): the views, the gathered
    negatives (SimCLR), the EMA targets (BYOL, its synchronized batch normalisation) and
    both probes as on one device, every figure finite. ``defaults``: SimCLR at the
    recipe's default config on its default data's digits and batch size (128: 64 + 64,
    then 15 + 14 and 52 + 52), unshuffled, a full batch and the last of each split, one
    epoch of pretraining and one of the probe.
    BYOL's bound is wider: its heads' normalisation cancels a shift of its input shared
    by the whole batch, so along such shifts (a bias below it, for the units active on
    every row; every direction on the one-row batch) the layers below get a gradient that
    is zero but for round-off, which Adam scales up to steps of 1e-5."""
    report = mirrored[case]
    assert report["replicas"] == 2 and report["steps"][0] == report["steps"][1] > 0
    assert report["moved"] > 1e-3
    assert report["largest_difference"] < (1e-4 if case == "ema" else 1e-5), report
    for name, values in report["one"].items():
        np.testing.assert_allclose(report["two"][name], values, rtol=1e-5, atol=1e-6, err_msg=name)


def test_colour_images_train_with_flips_and_the_encoder_is_exported(tmp_path):
    """Images of shape (8, 8, 3), as ``--data folder:`` gives them, with ``flip=true``."""
    rng = np.random.default_rng(0)
    rows = {"x": rng.uniform(size=(24, 8, 8, 3)).astype("float32"), "y": rng.integers(0, 3, 24)}
    data = tf.data.Dataset.from_tensor_slices(rows).batch(8)
    config = {**SMALL, "flip": True, "classes": 3, "pretrain_epochs": 1}
    result = beatloop.fit("contrastive", config=config, data=data, epochs=2, seed=0,
                          progress=False)  # fmt: skip
    assert result.steps == 6 and np.isfinite(result.history["nt_xent"][0])
    assert result.models["encoder"].input_shape == (None, 8, 8, 3)
    exported = result.export(tmp_path / "export")
    assert list(exported) == ["encoder"] and exported["encoder"].is_dir()
