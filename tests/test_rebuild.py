"""A run dir that rebuilds itself: the models and optimizers passed to ``fit`` are kept
in it when the run starts, so ``restore``, ``evaluate``, ``export`` (Python and the
command line) and the best epoch's models need no script; what Keras cannot serialise is
said once and passed again; a checkpoint whose optimizers differ is refused by name."""

import json
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import model_weights
from text_classifier import text_arrays, text_batches, text_classifier

import beatloop
from beatloop.cli import main


def schedule():
    return keras.optimizers.schedules.CosineDecay(1e-3, 24, warmup_target=1e-2, warmup_steps=4)


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """A text classifier passed in, AdamW on warm-up + cosine, an evaluated EMA, the best
    epoch kept: the run dir and the result."""
    run_dir = tmp_path_factory.mktemp("fine_tuned") / "run"
    result = beatloop.fit(
        "supervised",
        data=(text_batches(96, 16), text_batches(48, 16, seed=1)),
        models={"model": text_classifier(0)},
        optimizers={"optimizer": keras.optimizers.AdamW(schedule())},
        config={"ema_decay": 0.5},
        epochs=3,
        seed=0,
        run_dir=run_dir,
        keep_best="val_loss:min",
    )
    return run_dir, result


def test_the_run_dir_keeps_what_it_was_passed(fine_tuned):
    run_dir, _ = fine_tuned
    recorded = json.loads((run_dir / "run.json").read_text())
    assert recorded["passed_models"] == {"model": "passed/model.keras"}
    rate = recorded["passed_optimizers"]["optimizer"]["config"]["learning_rate"]
    assert rate["class_name"] == "CosineDecay" and rate["config"]["warmup_steps"] == 4
    kept = keras.models.load_model(run_dir / "passed" / "model.keras")
    assert sorted(kept.input) == ["padding_mask", "segment_ids", "token_ids"]
    # The weights it started from (the pretrained ones a fine-tune starts at).
    for ours, started in zip(model_weights(kept), model_weights(text_classifier(0)), strict=True):
        np.testing.assert_array_equal(ours, started)


def test_restore_and_evaluate_rebuild_the_passed_parts_without_them(fine_tuned):
    run_dir, result = fine_tuned
    restored = beatloop.restore(run_dir)
    assert restored.models["model"] is not result.models["model"]
    assert isinstance(restored.optimizers["optimizer"].learning_rate, tf.Tensor | tf.Variable)
    for ours, theirs in zip(
        model_weights(restored.models["model"]), model_weights(result.models["model"]), strict=True
    ):
        np.testing.assert_array_equal(ours, theirs)
    validation = text_batches(48, 16, seed=1)
    figures = beatloop.evaluate(run_dir, validation)
    assert figures == result.evaluate(validation)
    assert figures["loss"] == result.history["val_loss"][-1]  # the average's, as run


def test_the_best_epoch_from_python_and_the_command_line(fine_tuned, tmp_path, capsys):
    run_dir, result = fine_tuned
    epoch = result.best["epoch"]
    validation = text_batches(48, 16, seed=1)
    best = beatloop.evaluate(run_dir, validation, best=True)
    assert best["loss"] == result.history["val_loss"][epoch - 1]
    copies = result.best_models()  # this result's own models are left as they are
    restored = beatloop.restore(run_dir, best=True)
    for name in ("model", "ema"):
        for ours, theirs in zip(
            model_weights(copies[name]), model_weights(restored.models[name]), strict=True
        ):
            np.testing.assert_array_equal(ours, theirs)
    assert main(["export", str(run_dir), str(tmp_path / "shell"), "--best"]) == 0
    result.export(tmp_path / "python", best=True)
    features, _ = text_arrays(8, seed=5)
    inputs = {key: tf.constant(value) for key, value in features.items()}
    served = [tf.saved_model.load(str(tmp_path / d / "model")) for d in ("shell", "python")]
    np.testing.assert_array_equal(served[0].serve(inputs), served[1].serve(inputs))
    # The exported model is the best epoch's average (the evaluated EMA), not the last's.
    np.testing.assert_allclose(served[0].serve(inputs), copies["ema"](inputs), atol=1e-6)
    if epoch < result.epochs:
        last = result.models["ema"](inputs)
        assert not np.allclose(served[0].serve(inputs), last)


def test_passing_other_parts_refuses_naming_the_optimizer(fine_tuned):
    run_dir, _ = fine_tuned
    with pytest.raises(beatloop.CheckpointError, match=r"optimizer 'optimizer' trained with"):
        beatloop.restore(run_dir, optimizers={"optimizer": keras.optimizers.AdamW(1e-3)})
    fewer = r"'optimizer' has \d+ variable\(s\) in the checkpoint but 1 now \(SGD\)"
    with pytest.raises(beatloop.CheckpointError, match=fewer):
        beatloop.restore(run_dir, optimizers={"optimizer": keras.optimizers.SGD(schedule())})
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(beatloop.CheckpointError, match=r"variable"):
        beatloop.restore(run_dir, models={"model": other})


class Unserialisable(keras.Model):
    """A subclassed model without ``get_config``: Keras cannot save it."""

    def __init__(self, size):
        super().__init__()
        self.dense = keras.layers.Dense(10)
        self.size = size

    def call(self, x):
        return self.dense(x)


def test_a_part_keras_cannot_keep_is_said_once_then_passed_again(small_digits, tmp_path):
    train, _ = small_digits
    data = tf.data.Dataset.from_tensor_slices((train["x"], train["y"])).batch(50)
    run_dir = tmp_path / "run"
    model = Unserialisable(np.zeros(3))
    with pytest.warns(beatloop.NotRecordedWarning, match=r"model 'model' passed to fit"):
        beatloop.fit("supervised", data=data, models={"model": model}, seed=0, run_dir=run_dir)
    recorded = json.loads((run_dir / "run.json").read_text())
    assert "not_kept" in recorded["passed_models"]["model"]
    with warnings.catch_warnings():  # the resume says nothing more
        warnings.simplefilter("error")
        beatloop.fit(
            "supervised", data=data, models={"model": model}, seed=0, run_dir=run_dir, epochs=2
        )
    with pytest.raises(beatloop.ConfigError, match=r"could not keep.*model .model. .*models="):
        beatloop.restore(run_dir, data)
    again = Unserialisable(np.zeros(3))
    restored = beatloop.restore(run_dir, data, models={"model": again})
    assert restored.steps == 8 and restored.models["model"] is again


def test_a_recipe_reading_its_training_data_needs_data_to_rebuild(tmp_path):
    ratings = {
        "user": np.arange(40) % 8,
        "item": np.arange(40) % 5,
        "rating": np.linspace(1, 5, 40).astype(np.float32),
    }
    data = tf.data.Dataset.from_tensor_slices(ratings).batch(10)
    run_dir = tmp_path / "run"
    beatloop.fit("recommender", data=data, config={"top_k": 3}, seed=0, run_dir=run_dir)
    with pytest.raises(beatloop.DataError, match=r"reads its training data.*pass data="):
        beatloop.restore(run_dir)
    assert beatloop.restore(run_dir, data).steps == 4


def test_the_average_of_an_accumulating_run_ticks_once_per_update(small_digits):
    """``ema_decay`` with ``accumulate=4``: one tick per optimizer update, on the weights
    the update made (never on the unchanged weights between updates)."""
    train, _ = small_digits
    data = tf.data.Dataset.from_tensor_slices((train["x"][:128], train["y"][:128])).batch(16)
    decay = 0.5
    updated = []

    class AfterEachUpdate(beatloop.Callback):
        def on_execution_end(self, run, steps, logs):
            updated.append(model_weights(run.models["model"]))

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    first = model_weights(model)
    result = beatloop.fit(
        "supervised", data=data, models={"model": model}, seed=0, steps_per_execution=4,
        config={"ema_decay": decay, "accumulate": 4}, callbacks=[AfterEachUpdate()],
    )  # fmt: skip
    assert len(updated) == 2  # 8 batches: two updates, each call ending on one
    expected = first
    for weights in updated:
        expected = [decay * e + (1 - decay) * w for e, w in zip(expected, weights, strict=True)]
    for ours, theirs in zip(model_weights(result.models["ema"]), expected, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_the_commands_take_a_model_the_run_dir_lost(fine_tuned, tmp_path, capsys):
    """``--model NAME=PATH`` on ``evaluate`` and ``export``: the model in place of the one
    the run dir kept, here deleted (the error says it is gone and what to pass)."""
    import shutil

    run_dir = shutil.copytree(fine_tuned[0], tmp_path / "run")
    (run_dir / "passed" / "model.keras").unlink()
    assert main(["export", str(run_dir), str(tmp_path / "a")]) == 2
    error = capsys.readouterr().err
    assert "passed/model.keras, which is gone" in error and "--model model=PATH.keras" in error
    text_classifier(0).save(tmp_path / "classifier.keras")
    model = ["--model", f"model={tmp_path / 'classifier.keras'}"]
    assert main(["export", str(run_dir), str(tmp_path / "b"), "--best", *model]) == 0
    features, labels = text_arrays(48, seed=1)
    np.savez(tmp_path / "validation.npz", y=labels, **{f"x/{k}": v for k, v in features.items()})
    data = ["--data", f"npz:{tmp_path / 'validation.npz'}"]
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), *data, *model]) == 0
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines())
    expected = beatloop.evaluate(fine_tuned[0], text_batches(48, 16, seed=1))
    assert float(printed["loss"]) == pytest.approx(expected["loss"], rel=1e-3)
