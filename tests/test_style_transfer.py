"""The style transfer recipe: Gram matrices, both modes, the frozen feature network,
pixels kept in range, and a user's own feature network and images."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import beatloop
from beatloop.core.compiled.forward import ModelCalls
from beatloop.recipes.style_transfer import StyleTransfer, gram_matrix

SMALL = {"image_size": 32, "steps_per_epoch": 25}


def losses_of(recipe, models):
    """The recipe's loss parts for its default batch and the given models, now."""
    batch = next(iter(recipe.default_data(0).train.take(1)))
    out = recipe.total_loss(ModelCalls(models, frozenset()), batch)
    return {name: float(value) for name, value in out.items()}


def test_gram_matrix_matches_numpy():
    features = np.random.default_rng(0).normal(size=(2, 5, 7, 3)).astype(np.float32)
    flat = features.reshape(2, 35, 3)
    expected = np.einsum("bpc,bpd->bcd", flat, flat) / 35
    np.testing.assert_allclose(gram_matrix(tf.constant(features)), expected, rtol=1e-5)


@pytest.fixture(scope="module")
def image_run():
    recipe = StyleTransfer(StyleTransfer.Config(**SMALL))
    spec = recipe.default_data(0).train.element_spec
    keras.utils.set_random_seed(0)
    initial = recipe.build_models(spec)
    before = losses_of(recipe, initial)
    features_before = [v.numpy().copy() for v in initial["features"].weights]
    result = beatloop.fit(recipe, epochs=2, seed=0)
    return recipe, before, features_before, result


def test_image_mode_halves_the_style_loss_and_keeps_the_content(image_run):
    recipe, before, _, result = image_run
    after = losses_of(recipe, result.models)
    assert after["style_loss"] <= 0.5 * before["style_loss"]
    # Bounded: the picture stays closer to the content than the style photo is.
    style_photo = {"image": style_photo_layer(recipe), "features": result.models["features"]}
    assert after["content_loss"] < losses_of(recipe, style_photo)["content_loss"]
    assert set(result.history) == {"total", "content_loss", "style_loss", "total_variation"}


def style_photo_layer(recipe):
    """A picture layer holding the style photograph itself."""
    from beatloop.recipes.style_transfer import style_image

    batch = next(iter(recipe.default_data(0).train.take(1)))
    return style_image(batch["style"].numpy())


def test_feature_network_is_frozen_bit_for_bit(image_run):
    _, _, features_before, result = image_run
    for before, variable in zip(features_before, result.models["features"].weights, strict=True):
        np.testing.assert_array_equal(before, variable.numpy())
    assert "frozen: features" in result.schedule.describe()


def test_pixels_stay_in_range_by_the_beats_constraint(image_run):
    _, _, _, result = image_run
    pixels = result.models["image"].variable.numpy()
    assert pixels.min() >= 0.0 and pixels.max() <= 1.0
    # The constraint did work: some pixels sit exactly on a bound.
    assert np.isin(pixels, [0.0, 1.0]).sum() > 0
    assert "constraint=(clip values into [0, 1]" in result.schedule.describe()


def test_generator_mode_reduces_the_loss():
    recipe = StyleTransfer(StyleTransfer.Config(mode="generator", learning_rate=2e-3, **SMALL))
    result = beatloop.fit(recipe, epochs=2, seed=0)
    assert set(result.models) == {"features", "generator"}
    history = result.history["total"]
    assert history[1] < 0.7 * history[0]


def test_a_users_feature_network_and_images(tmp_path):
    rng = np.random.default_rng(1)
    for name in ("content", "style"):
        pixels = (rng.uniform(size=(40, 50, 3)) * 255).astype(np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"{name}.png")
    keras.utils.set_random_seed(0)
    network = keras.Sequential(
        [
            keras.Input((None, None, 3)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="low"),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="high"),
        ]
    )
    config = {
        **SMALL,
        "content_path": str(tmp_path / "content.png"),
        "style_path": str(tmp_path / "style.png"),
        "content_layer": "high",
        "style_layers": ("low", "high"),
    }
    result = beatloop.fit(
        "style_transfer", config=config, models={"features": network}, epochs=2, seed=0,
        run_dir=tmp_path / "run",
    )  # fmt: skip
    assert result.models["features"] is network
    assert result.history["style_loss"][1] < result.history["style_loss"][0]
    saved = np.asarray(Image.open(result.artifacts["stylised image"]))
    assert saved.shape[:2] == (256, 256) and saved.shape[2] == 3
    assert (tmp_path / "run" / "stylised" / "epoch_002.png").exists()


def test_unknown_layer_and_missing_image_are_config_errors(tmp_path):
    with pytest.raises(
        beatloop.ConfigError, match=r"no layer\(s\) \['pool9'\]; its layers: \['block1_conv1'"
    ):
        beatloop.fit("style_transfer", config={**SMALL, "content_layer": "pool9"})
    with pytest.raises(beatloop.ConfigError, match="no image file at"):
        beatloop.fit("style_transfer", config={**SMALL, "style_path": str(tmp_path / "none.png")})


def test_run_prints_where_the_stylised_image_is(tmp_path, capsys):
    from beatloop.cli import main

    args = ["run", "style_transfer", "--epochs", "2", "--seed", "0", "--quiet"]
    args += ["--set", "image_size=32", "--set", "steps_per_epoch=3", "--run-dir", str(tmp_path)]
    assert main(args) == 0
    assert f"stylised image: {tmp_path / 'stylised.png'}" in capsys.readouterr().out
    # The file it names is the picture as the run left it: epoch 2's, not epoch 1's.
    first, last, named = (
        np.asarray(Image.open(tmp_path / name))
        for name in ("stylised/epoch_001.png", "stylised/epoch_002.png", "stylised.png")
    )
    np.testing.assert_array_equal(named, last)
    assert not np.array_equal(first, last)


def test_a_replica_with_no_pair_computes_zero_and_no_gradient():
    """On two replicas the built-in batch of one pair leaves one replica none: its loss
    is zero with a zero gradient, and no convolution runs on the empty batch (with
    oneDNN, TensorFlow 2.21's Conv2D returns an empty batch's input shape, and the
    step failed with "Incompatible shapes")."""
    recipe = StyleTransfer(StyleTransfer.Config(**SMALL))
    spec = recipe.default_data(0).train.element_spec
    models = recipe.build_models(spec)
    image = models["image"].variable
    signature = {key: tf.TensorSpec((None, 32, 32, 3)) for key in ("content", "style")}

    @tf.function(input_signature=[signature])
    def loss_and_gradient(batch):
        with tf.GradientTape() as tape:
            out = recipe.total_loss_of_any_rows(ModelCalls(models, frozenset()), batch)
        return out, tape.gradient(out["loss"], image)

    empty = {key: tf.zeros((0, 32, 32, 3)) for key in ("content", "style")}
    out, gradient = loss_and_gradient(empty)
    assert {name: float(value) for name, value in out.items()} == dict.fromkeys(out, 0.0)
    np.testing.assert_array_equal(gradient, np.zeros(image.shape))
    batch = next(iter(recipe.default_data(0).train.take(1)))
    out, gradient = loss_and_gradient(batch)
    assert float(out["loss"]) > 0 and np.abs(gradient).max() > 0


def test_mixed_float16_trains_with_float32_losses():
    """Under ``mixed_float16`` the feature network's activations are float16; the losses
    are computed in float32 (adding them to the float32 variation term once failed)."""
    config = {"image_size": 32, "steps_per_epoch": 3}
    result = beatloop.fit("style_transfer", precision="mixed_float16", config=config, seed=0)
    history = result.history
    assert all(np.isfinite(history[name][0]) for name in ("total", "style_loss"))
    assert history["style_loss"][0] > 0 and history["total_variation"][0] > 0
