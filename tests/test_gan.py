"""The GAN recipe: beats that touch only their own network, n_critic, the losses, the
sample-quality figure and the sample grid."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import dict_batches, gan_data, record_weights_per_loss, same_weights
from PIL import Image

import beatloop
from beatloop.cli import main
from beatloop.core.compiled.forward import ModelCalls
from beatloop.datasets import digits_arrays
from beatloop.recipes import gan_quality as quality
from beatloop.recipes.gan import Gan


def test_each_beat_changes_only_its_own_network():
    recipe = Gan()
    records = record_weights_per_loss(recipe, ["generator", "discriminator"])
    beatloop.fit(recipe, data=gan_data(64), epochs=1, seed=0, debug=True)  # 2 steps
    assert [beat for beat, _ in records][-4:] == ["d_loss", "g_loss", "d_loss", "g_loss"]
    owner = {"d_loss": "discriminator", "g_loss": "generator"}
    for (beat, before), (_, after) in itertools.pairwise(records[-4:]):
        # The beat named in the first record ran between the two records.
        for model in owner.values():
            changed = not same_weights(before[model], after[model])
            assert changed == (model == owner[beat]), (beat, model)


def test_n_critic_applies_the_discriminator_optimizer_n_times_per_step():
    result = beatloop.fit("gan", data=gan_data(96), epochs=2, seed=0, config={"n_critic": 3})
    assert result.steps == 6
    assert int(result.optimizers["d_optimizer"].iterations) == 18
    assert int(result.optimizers["g_optimizer"].iterations) == 6
    assert set(result.history) >= {"d_loss", "g_loss", "d_real", "d_fake", "sample_score"}


def constant_discriminator(logit):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1)])
    model.layers[0].kernel.assign(np.zeros((64, 1), np.float32))
    model.layers[0].bias.assign([logit])
    generator = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64)])
    models = {"generator": generator, "discriminator": model}
    return ModelCalls(models, frozenset(), tf.random.Generator.from_seed(0))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_non_saturating_losses_match_the_formula(smoothing):
    b = 0.7
    models = constant_discriminator(b)
    batch = {"x": tf.zeros([4, 64])}
    recipe = Gan(Gan.Config(label_smoothing=smoothing))
    softplus = lambda v: np.log1p(np.exp(v))  # noqa: E731
    real = (1 - smoothing) * softplus(-b) + smoothing * softplus(b)
    out = recipe.discriminator_loss(models, batch)
    assert float(out["loss"]) == pytest.approx(real + softplus(b), rel=1e-5)
    assert float(out["d_real"]) == pytest.approx(1 / (1 + np.exp(-b)), rel=1e-5)
    assert float(recipe.generator_loss(models, batch)) == pytest.approx(softplus(-b), rel=1e-5)


def test_hinge_losses_match_the_formula():
    models = constant_discriminator(0.4)
    batch = {"x": tf.zeros([4, 64])}
    recipe = Gan(Gan.Config(loss="hinge"))
    assert float(recipe.discriminator_loss(models, batch)["loss"]) == pytest.approx(0.6 + 1.4)
    assert float(recipe.generator_loss(models, batch)) == pytest.approx(-0.4)


def test_sample_quality_after_training_beats_the_untrained_generator():
    result = beatloop.fit("gan", epochs=12, seed=0)
    untrained = Gan()
    keras.utils.set_random_seed(0)
    spec = {"x": tf.TensorSpec([None, 64])}
    generator = untrained.build_models(spec)["generator"]
    before = quality.sample_quality(
        generator(untrained.fixed_latent(0)[:500], training=False).numpy(),
        quality.digits_classifier(),
    )
    after = result.history["sample_score"][-1]
    assert after > before.score + 1.0
    assert result.history["sample_confidence"][-1] > before.confidence


def test_quality_figures_on_real_digits_and_on_a_collapsed_batch():
    train, _ = digits_arrays(0, signed=True)
    classifier = quality.digits_classifier()
    real = quality.sample_quality(train["x"][:500], classifier)
    assert real.classes == 10 and real.confidence > 0.9 and real.score > 8
    collapsed = quality.sample_quality(np.repeat(train["x"][:1], 500, axis=0), classifier)
    assert collapsed.classes == 1 and collapsed.score == pytest.approx(1.0, abs=1e-6)


def stand_in_training(calls: list):
    """A stand-in for the classifier's training (seconds): weights 0.5, 1.5, ... by
    position, each call recorded."""

    def train(model):
        calls.append(model)
        model.set_weights(
            [np.full(w.shape, i + 0.5, np.float32) for i, w in enumerate(model.get_weights())]
        )

    return train


def test_the_trained_classifier_is_kept_in_beatloops_cache_for_the_next_process(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("BEATLOOP_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(quality, "_train", stand_in_training(calls))
    monkeypatch.setattr(quality, "_TRAINED_WEIGHTS", None)  # as in a new process
    shared = quality.shared_file()
    assert shared.parent == tmp_path / "cache" / "quality" and not shared.exists()
    trained = quality.digits_classifier().get_weights()
    assert len(calls) == 1 and list(shared.parent.iterdir()) == [shared]  # no partial file
    # The next process reads the weights, bit for bit, and trains nothing.
    monkeypatch.setattr(quality, "_TRAINED_WEIGHTS", None)
    loaded = quality.digits_classifier(tmp_path / "run").get_weights()
    assert len(calls) == 1
    for first, second in zip(trained, loaded, strict=True):
        np.testing.assert_array_equal(first, second)
    assert (tmp_path / "run" / quality.CLASSIFIER_FILE).is_file()  # and the run dir's copy
    # Another version of what training depends on is another file.
    monkeypatch.setattr(keras, "__version__", keras.__version__ + ".other")
    assert quality.shared_file() != shared
    monkeypatch.undo()
    monkeypatch.setenv("BEATLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(quality, "_train", stand_in_training(calls))
    # A cache file that cannot be read, or a cache dir that cannot be made: trained.
    shared.write_bytes(b"not an HDF5 file")
    monkeypatch.setattr(quality, "_TRAINED_WEIGHTS", None)
    quality.digits_classifier()
    assert len(calls) == 2 and shared.stat().st_size > 100  # written again, whole
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv("BEATLOOP_CACHE_DIR", str(tmp_path / "a file" / "cache"))
    monkeypatch.setattr(quality, "_TRAINED_WEIGHTS", None)
    assert len(quality.digits_classifier().get_weights()) == 4 and len(calls) == 3


def test_conv_architecture_on_image_shaped_data_writes_sample_grids(tmp_path):
    train, _ = digits_arrays(0, signed=True)
    images = dict_batches({"x": train["x"].reshape(-1, 8, 8)}, 32, 64)
    result = beatloop.fit(
        "gan", data=images, epochs=2, seed=0, run_dir=tmp_path, config={"architecture": "conv"}
    )
    assert result.models["generator"].output_shape == (None, 8, 8)
    assert any("conv2d_transpose" in v.path for v in result.models["generator"].weights)
    grid = result.artifacts["samples"]
    assert grid == tmp_path / "samples.png"
    first, last = (
        np.asarray(Image.open(tmp_path / "samples" / f"epoch_00{n}.png")) for n in (1, 2)
    )
    assert first.shape[0] >= 200 and not np.array_equal(first, last)
    np.testing.assert_array_equal(np.asarray(Image.open(grid)), last)  # the latest grid
    assert (tmp_path / quality.CLASSIFIER_FILE).exists()  # cached for the next run


def test_conv_architecture_refuses_images_it_cannot_halve_twice():
    odd = tf.data.Dataset.from_tensor_slices({"x": np.zeros((8, 6, 6), np.float32)}).batch(4)
    with pytest.raises(beatloop.DataError, match="divide by 4"):
        beatloop.fit("gan", data=odd, config={"architecture": "conv"})


def test_show_gan_lists_both_beats_and_their_variables(capsys):
    assert main(["show", "gan"]) == 0
    out = capsys.readouterr().out
    assert "1. d_loss: loss=d_loss optimizer=d_optimizer updates=discriminator" in out
    assert "2. g_loss: loss=g_loss optimizer=g_optimizer updates=generator" in out
    d_part, g_part = out.split("d_loss (")[1].split("g_loss (")
    assert "discriminator/" in d_part and "generator/" not in d_part
    assert "generator/" in g_part and "discriminator/" not in g_part


def test_run_prints_where_the_grid_is(tmp_path, capsys):
    code = main(
        ["run", "gan", "--epochs", "1", "--seed", "0", "--run-dir", str(tmp_path), "--quiet"]
    )
    assert code == 0
    assert f"samples: {tmp_path / 'samples.png'}" in capsys.readouterr().out
    # The file it names is the grid the run drew: 8x8 digits of 8x8 pixels, scaled up.
    grid = np.asarray(Image.open(tmp_path / "samples.png"))
    np.testing.assert_array_equal(grid, np.asarray(Image.open(tmp_path / "samples/epoch_001.png")))
    assert grid.shape[0] >= 200 and grid.std() > 10  # not a blank picture
