"""Models the user supplies (a trained teacher, a feature network): the missing ones named
in one error, ``.keras`` paths in Python and on the command line, frozen and in inference
mode unless a beat updates them, exact resume; and recipes without ``default_data`` or
``build_models``."""

import zipfile

import attrs
import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, classifier, dict_batches, model_weights

import beatloop
from beatloop.cli import main
from beatloop.core.compiled.binding import bind
from beatloop.core.schedule.supplied import SuppliedModel, model_names
from beatloop.datasets import batches, digits_arrays
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry
from beatloop.recipes.style_transfer import StyleTransfer, random_vgg

TEACHER = "a trained digits classifier (64 inputs, 10 logits)"


def teacher_model(seed: int = 2) -> keras.Model:
    """A small classifier with batch normalisation whose moving statistics are not the
    initial zeros and ones (so that a training-mode call would visibly move them)."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(12),
            keras.layers.BatchNormalization(momentum=0.5),
            keras.layers.ReLU(),
            keras.layers.Dense(10),
        ]
    )
    norm = model.layers[1]
    norm.moving_mean.assign(np.linspace(-1, 1, 12).astype(np.float32))
    norm.moving_variance.assign(np.linspace(0.5, 2, 12).astype(np.float32))
    return model


def digits_data(count: int = 120, batch_size: int = 30, shuffle: bool = False):
    train, validation = digits_arrays(0)
    train = {key: values[:count] for key, values in train.items()}
    if shuffle:
        return beatloop.DataSplit(batches(train, batch_size, shuffle_seed=0))
    return beatloop.DataSplit(
        dict_batches(train, batch_size), dict_batches(validation, batch_size, 60)
    )


class BareDistil(beatloop.Recipe):
    """A student matches a supplied teacher's logits (test recipe; no data, no models)."""

    name = "bare_distil_test"
    batch_keys = {"x": 2}
    supplied_models = {"teacher": SuppliedModel(TEACHER)}
    training: tuple[str, ...] | None = None  # the beat's training-mode models

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.05)}

    def losses(self):
        return {"match": self.match}

    def match(self, models, batch):
        student, teacher = models["student"](batch["x"]), models["teacher"](batch["x"])
        return tf.reduce_mean(tf.square(student - teacher))

    def schedule(self):
        return beatloop.Schedule(
            beatloop.Beat(loss="match", optimizer="sgd", updates="student", training=self.training)
        )


class Distil(BareDistil):
    """The same with built-in data and a built student (for the command line)."""

    name = "distil_test"

    def default_data(self, seed):
        return digits_data(shuffle=True)

    def build_models(self, batch_spec):
        return {"student": classifier(hidden=8, seed=1)}


class TwoTeachers(Distil):
    name = "two_teachers_test"
    supplied_models = {
        "teacher": SuppliedModel(TEACHER),
        "assistant": SuppliedModel("a second opinion"),
        "helper": SuppliedModel("optional help", fallback="nothing"),
    }


@pytest.fixture
def teacher_file(tmp_path):
    path = tmp_path / "teacher.keras"
    teacher_model().save(path)
    return path


@pytest.fixture
def registered(monkeypatch):
    registry = Registry(load_entry_points=False)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    for cls in (Distil, BareDistil):
        registry.register(cls)
    return registry


# --- the missing ones, in one error --------------------------------------------------------


def test_every_missing_model_is_named_with_its_description_and_how_to_pass_it():
    with pytest.raises(beatloop.ConfigError) as caught:
        beatloop.fit(TwoTeachers, data=digits_data(), models={"student": classifier()})
    message = str(caught.value)
    assert message.startswith("recipe 'two_teachers_test' needs model(s) you supply:")
    assert f"'teacher': {TEACHER}" in message and "'assistant': a second opinion" in message
    assert "helper" not in message  # it has a fallback
    assert "models={'teacher': model_or_path, 'assistant': model_or_path} in Python" in message
    assert "--model teacher=PATH.keras --model assistant=PATH.keras on the command line" in message


def test_a_recipe_without_build_models_names_the_other_models_in_the_same_error():
    with pytest.raises(beatloop.ConfigError) as caught:
        beatloop.fit(BareDistil, data=digits_data())
    message = str(caught.value)
    assert f"'teacher': {TEACHER}" in message
    assert (
        "recipe 'bare_distil_test' builds no models (it defines no build_models): "
        "pass models={...} with: student" in message
    )
    with pytest.raises(beatloop.ConfigError, match=r"build_models\): pass models=\{\.\.\.\} with"):
        beatloop.fit(BareDistil, data=digits_data(), models={"teacher": teacher_model()})


def test_without_default_data_a_run_must_pass_data():
    with pytest.raises(
        beatloop.ConfigError,
        match=r"^recipe 'bare_distil_test' has no built-in data \(it defines no default_data\): "
        r"pass data=\.\.\.$",
    ):
        beatloop.fit(BareDistil, models={"student": classifier(), "teacher": teacher_model()})


def test_a_recipe_without_data_or_models_registers_and_runs_on_what_it_is_given():
    assert Registry(load_entry_points=False).register(BareDistil) is BareDistil
    student = classifier(hidden=8, seed=1)
    result = beatloop.fit(
        BareDistil, data=digits_data(), models={"student": student, "teacher": teacher_model()},
        epochs=2, seed=0,
    )  # fmt: skip
    assert result.models["student"] is student
    assert result.history["match"][1] < result.history["match"][0]
    with pytest.raises(beatloop.ConfigError, match=r"with: student, teacher$"):
        BareDistil().build_models({"x": tf.TensorSpec([None, 64])})


def test_unknown_names_are_refused_with_did_you_mean():
    with pytest.raises(
        beatloop.ConfigError,
        match=r"has no model named 'studnet' \(did you mean 'student'\?\); "
        r"its models: student, teacher",
    ):
        beatloop.fit(BareDistil, data=digits_data(), models={"studnet": classifier()})
    with pytest.raises(beatloop.ConfigError, match=r"no model named 'teachr' \(did you mean"):
        beatloop.fit(Distil, models={"teachr": teacher_model()})


def test_model_names_come_from_selectors_training_and_supplied_models():
    schedule = beatloop.Schedule(
        (
            beatloop.Beat(loss="g", optimizer="o", updates="generator:dense*"),
            beatloop.Beat(loss="d", optimizer="o", updates="critic", training=("critic", "aux")),
        ),
        frozen="embedding:*",
    )
    supplied = {"teacher": SuppliedModel("t"), "critic": SuppliedModel("c", fallback="f")}
    names = model_names(schedule, supplied)
    assert names == ("generator", "critic", "embedding", "aux", "teacher")


def test_supplied_model_values_are_checked():
    with pytest.raises(ValueError, match="description must be a non-empty text"):
        SuppliedModel("  ")
    assert SuppliedModel("d").describe() == "d (required)"
    assert SuppliedModel("d", fallback="f").describe() == "d (if none is given: f)"
    plain = type("Plain", (Distil,), {"supplied_models": {"teacher": TEACHER}})
    with pytest.raises(
        beatloop.ConfigError,
        match=r"^the supplied_models of recipe 'distil_test' must map names to "
        r"beatloop.SuppliedModel values; "
        r"found \{'teacher': 'str'\}",
    ):
        beatloop.fit(plain, models={"teacher": teacher_model()})


# --- .keras paths ----------------------------------------------------------------------------


def test_a_keras_path_is_loaded_and_the_teacher_is_used_unchanged(teacher_file):
    saved = model_weights(keras.models.load_model(teacher_file, compile=False))
    for given in (teacher_file, str(teacher_file)):
        result = beatloop.fit(Distil, models={"teacher": given}, epochs=2, seed=0)
        teacher = result.models["teacher"]
        assert_same_weights(model_weights(teacher), saved)
        # The student learnt to match this teacher (not a fresh, untrained one).
        x = digits_data().train.take(1).get_single_element()["x"]
        gap = float(tf.reduce_mean(tf.square(result.models["student"](x) - teacher(x))))
        assert gap < result.history["match"][0]


def test_bad_paths_are_config_errors_naming_the_model_and_the_path(tmp_path):
    wrong = tmp_path / "teacher.h5"
    wrong.write_bytes(b"")
    with pytest.raises(
        beatloop.ConfigError, match=r"model 'teacher' from '.*teacher\.h5'.*\.keras"
    ):
        beatloop.fit(Distil, models={"teacher": wrong})
    absent = tmp_path / "none.keras"
    with pytest.raises(beatloop.ConfigError, match=r"'teacher' from '.*none\.keras': there is no"):
        beatloop.fit(Distil, models={"teacher": str(absent)})
    with pytest.raises(
        beatloop.ConfigError, match=r"must be a keras\.\S*Layer or the path of a \.keras"
    ):
        beatloop.fit(Distil, models={"teacher": 3})


def test_a_path_that_exists_but_is_no_keras_file_says_what_it_is(tmp_path):
    folder = tmp_path / "teacher.keras"
    folder.mkdir()
    broken = tmp_path / "broken.keras"
    broken.write_bytes(b"not a zip file")
    other_zip = tmp_path / "other.keras"
    with zipfile.ZipFile(other_zip, "w") as archive:
        archive.writestr("notes.txt", "hello")
    expected = "; a .keras file was expected (the zip archive model.save('teacher.keras') writes)"
    for path, what in (
        (folder, "it is a folder"),
        (broken, "it is not a readable zip archive (File is not a zip file)"),
        (other_zip, "the zip archive holds no config.json (it was not written by model.save)"),
    ):
        with pytest.raises(beatloop.ConfigError) as raised:
            beatloop.fit(Distil, models={"teacher": path})
        assert (
            str(raised.value) == f"cannot load model 'teacher' from {str(path)!r}: {what}{expected}"
        )
        assert raised.value.exit_code == 2
    garbled = tmp_path / "garbled.keras"
    with zipfile.ZipFile(garbled, "w") as archive:
        archive.writestr("config.json", "{not json")
    with pytest.raises(beatloop.ConfigError, match=r"cannot load model 'teacher' from '.*garbled"):
        beatloop.fit(Distil, models={"teacher": garbled})
    try:
        beatloop.fit(Distil, models={"teacher": garbled})
    except beatloop.ConfigError as error:
        assert error.__cause__ is not None  # the loader's own error, chained


def test_cli_model_option_passes_paths_through(registered, teacher_file, tmp_path, capsys):
    run = ["run", "distil_test", "--epochs", "1", "--seed", "0", "--quiet"]
    assert main([*run, "--run-dir", str(tmp_path / "a")]) == 2
    assert "--model teacher=PATH.keras on the command line" in capsys.readouterr().err
    args = [*run, "--run-dir", str(tmp_path / "b"), "--model", f"teacher={teacher_file}"]
    assert main(args) == 0
    assert "distil_test: 1 epoch(s), 4 steps" in capsys.readouterr().out
    assert main([*run, "--model", "teacher"]) == 2
    assert "--model expects NAME=PATH.keras" in capsys.readouterr().err
    assert main([*run, "--model", f"teacher={tmp_path / 'none.keras'}"]) == 2
    assert "cannot load model 'teacher'" in capsys.readouterr().err


def test_show_lists_supplied_models_and_what_a_bare_recipe_lacks(registered, capsys):
    assert main(["show", "distil_test"]) == 0
    out = capsys.readouterr().out
    assert f"\n  teacher: {TEACHER} (required)\n" in out
    assert "it builds no teacher: a run supplies it (models= or --model)" in out
    assert main(["show", "bare_distil_test"]) == 0
    out = capsys.readouterr().out
    assert "it has no built-in data (no default_data): a run passes data=..." in out
    assert "a run passes models= with student, teacher" in out
    assert main(["show", "style_transfer"]) == 0
    out = capsys.readouterr().out
    assert "features: an image network" in out and "(if none is given: a fixed, seeded" in out
    assert "total (1 variables):\n      image/style_image/pixels (1, 64, 64, 3)" in out


# --- frozen, in inference mode -------------------------------------------------------------


def test_binding_treats_a_supplied_models_variables_as_frozen_unless_a_beat_updates_them():
    models = {"student": classifier(), "teacher": teacher_model()}
    recipe = BareDistil()
    parts = (recipe.schedule(), models, recipe.build_optimizers(), recipe.losses())
    with pytest.raises(beatloop.ScheduleError, match="of model 'teacher' is updated by no beat"):
        bind(*parts)
    bound = bind(*parts, supplied=frozenset({"teacher"}))
    assert [v.path for v in bound.beats[0].variables] == [
        v.path for v in models["student"].trainable_variables
    ]
    both = beatloop.Schedule(
        beatloop.Beat(loss="match", optimizer="sgd", updates=("student", "teacher"))
    )
    bound = bind(
        both,
        models,
        BareDistil().build_optimizers(),
        recipe.losses(),
        supplied=frozenset({"teacher"}),
    )
    assert bound.beats[0].updated_models == ("student", "teacher")


def test_a_supplied_model_keeps_every_weight_and_its_batch_norm_statistics():
    teacher = teacher_model()
    before = model_weights(teacher)  # kernels, and the moving mean and variance
    data = digits_data()
    beatloop.fit(Distil, data=data, models={"teacher": teacher}, epochs=2, seed=0)
    assert_same_weights(model_weights(teacher), before)
    # The check can fail: a beat that runs the teacher in training mode moves them.
    training = type("Training", (Distil,), {"training": ("student", "teacher")})
    beatloop.fit(training, data=data, models={"teacher": teacher}, epochs=1, seed=0)
    norm = teacher.layers[1]
    assert not np.array_equal(norm.moving_mean.numpy(), before[2])
    assert_same_weights(model_weights(teacher)[:2], before[:2])  # still not updated


def test_style_transfer_uses_a_supplied_feature_network_and_does_not_train_it(tmp_path):
    keras.utils.set_random_seed(3)

    def conv(name):
        return keras.layers.Conv2D(4, 3, padding="same", activation="relu", name=name)

    network = keras.Sequential(
        [
            keras.Input((None, None, 3)),
            conv("block1_conv1"),
            keras.layers.AveragePooling2D(2),
            conv("block2_conv1"),
            conv("block3_conv1"),
            conv("block3_conv2"),
        ]
    )
    network.save(tmp_path / "features.keras")
    saved = model_weights(network)

    class Unfrozen(StyleTransfer):
        """Its schedule declares nothing frozen: the supplied network is frozen anyway."""

        def schedule(self):
            beat = beatloop.Beat(loss="total", optimizer="optimizer", updates="image")
            return beatloop.Schedule(beat)

    config = Unfrozen.Config(image_size=32, steps_per_epoch=10)
    result = beatloop.fit(
        Unfrozen(config), models={"features": tmp_path / "features.keras"}, epochs=2, seed=0
    )
    features = result.models["features"]
    assert model_weights(features)[0].shape == (3, 3, 3, 4)  # not the fallback's 32 filters
    assert_same_weights(model_weights(features), saved)
    assert result.history["style_loss"][1] < result.history["style_loss"][0]
    assert "frozen" not in result.schedule.describe()
    # The fallback, built when nothing is supplied, is frozen the same way.
    fallback = beatloop.fit(Unfrozen(attrs.evolve(config, steps_per_epoch=2)), seed=0)
    initial = model_weights(random_vgg(config.feature_seed))
    assert_same_weights(model_weights(fallback.models["features"]), initial)


# --- exact resume --------------------------------------------------------------------------


def test_resuming_a_run_with_a_supplied_teacher_is_bit_identical(teacher_file, tmp_path):
    common = {"models": {"teacher": teacher_file}, "seed": 0}
    beatloop.fit(Distil, epochs=1, run_dir=tmp_path / "split", **common)
    with pytest.raises(beatloop.ConfigError, match="'teacher': a trained digits"):
        beatloop.fit(Distil, epochs=2, seed=0, run_dir=tmp_path / "split")
    resumed = beatloop.fit(Distil, epochs=2, run_dir=tmp_path / "split", **common)
    whole = beatloop.fit(Distil, epochs=2, run_dir=tmp_path / "whole", **common)
    assert resumed.resumed_from is not None and resumed.steps == whole.steps == 8
    assert sorted(resumed.models) == ["student", "teacher"]
    assert_same_weights(all_weights(resumed.models), all_weights(whole.models))
    assert resumed.history["match"] == whole.history["match"]  # epoch 1 from the record
