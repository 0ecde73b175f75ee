"""The recipe registry: built-ins and entry-point plugins through one pluggy hook."""

import importlib
import re
import sys
import textwrap
import warnings

import keras
import pytest
import tensorflow as tf
from helpers import BUILT_IN_RECIPES, run_python

import beatloop
from beatloop import RecipeNotFoundError, RegistrationError
from beatloop.cli import main
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry
from beatloop.recipes.supervised import Supervised

TINY_RECIPE = '''
import beatloop
from beatloop.recipes.supervised import Supervised


class Tiny(Supervised):
    """A supervised variant from a test plugin."""

    name = "{name}"


@beatloop.hookimpl
def register_recipes():
    return [Tiny]
'''


@pytest.fixture
def install_plugin(tmp_path, monkeypatch):
    """Install a plugin the way pip would leave it: a module plus a dist-info folder
    declaring its ``beatloop`` entry point, on sys.path."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(distribution, module, source):
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{distribution.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n"
        )
        (info / "entry_points.txt").write_text(f"[beatloop]\n{module} = {module}\n")
        importlib.invalidate_caches()

    yield install
    for name in list(sys.modules):
        if name.startswith("bl_test_"):
            del sys.modules[name]
    registry_module.reset_registry()


def test_builtin_recipes_by_name():
    builtin = Registry(load_entry_points=False)
    assert sorted(builtin.recipes) == BUILT_IN_RECIPES
    assert {builtin.recipe(name).origin for name in builtin.recipes} == {"built-in"}
    assert beatloop.recipes() == sorted(beatloop.recipes())
    assert set(beatloop.recipes()) >= set(builtin.recipes)  # plugins may add more
    assert beatloop.get_recipe("supervised") is Supervised


def test_unknown_recipe_lists_known_names_and_the_closest():
    with pytest.raises(RecipeNotFoundError) as caught:
        beatloop.get_recipe("supervized")
    message = str(caught.value)
    assert "no recipe named 'supervized'" in message
    assert "supervised" in message.split("known recipes:")[1]
    assert "(did you mean 'supervised'?)" in message


def test_entry_point_plugin_is_registered_with_its_origin(install_plugin):
    install_plugin("bl-tiny-plugin", "bl_test_tiny", TINY_RECIPE.format(name="tiny"))
    registry = Registry()
    entry = registry.recipe("tiny")
    assert entry.origin == "bl-tiny-plugin"
    assert entry.cls.description() == "A supervised variant from a test plugin."
    assert registry.recipe("supervised").origin == "built-in"


def test_plugin_that_fails_to_import_warns_and_the_rest_loads(install_plugin):
    install_plugin("bl-broken", "bl_test_broken", "raise ImportError('missing dependency xyz')\n")
    install_plugin("bl-tiny-plugin", "bl_test_tiny", TINY_RECIPE.format(name="tiny"))
    with pytest.warns(
        RuntimeWarning, match=r"'bl_test_broken' \(bl-broken\).*missing dependency xyz"
    ):
        registry = Registry()
    assert "tiny" in registry.recipes and "supervised" in registry.recipes
    assert [f.plugin for f in registry.failures] == ["bl_test_broken"]


def test_two_plugins_registering_one_name_cost_that_name_only(install_plugin, capsys):
    """A clash is a warning naming both plugins and their packages, like a plugin that
    fails to import: the name is an error naming both, every other name works."""
    install_plugin("bl-one", "bl_test_one", TINY_RECIPE.format(name="twin"))
    install_plugin("bl-two", "bl_test_two", TINY_RECIPE.format(name="twin"))
    both = r"recipe 'twin' is registered by .*plugin 'bl_test_one' \(bl-one\)"
    both += r".*plugin 'bl_test_two' \(bl-two\)"
    with pytest.warns(RuntimeWarning, match=both):
        registry = Registry()
    assert "twin" not in registry.recipes and "supervised" in registry.recipes
    with pytest.raises(RegistrationError, match=both + ".*uninstall one of the packages"):
        registry.recipe("twin")
    registry_module.reset_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("always", RuntimeWarning)  # the command prints it, one line
        assert main(["show", "supervised"]) == 0  # every other command works
        assert re.fullmatch("beatloop: warning: " + both + ".*\n", capsys.readouterr().err)
        assert main(["show", "twin"]) == 2
        assert re.search(both, capsys.readouterr().err)
        assert main(["list", "--verbose"]) == 0
    listed = capsys.readouterr().out
    assert "\nsupervised " in listed and "conflict: recipe 'twin' is registered by" in listed


def test_hook_without_a_spec_is_refused(install_plugin):
    source = "import beatloop\n\n@beatloop.hookimpl\ndef register_recipe():\n    return []\n"
    install_plugin("bl-misspelt", "bl_test_misspelt", source)
    with pytest.warns(RuntimeWarning, match="register_recipe"):
        registry = Registry()
    assert registry.failures and "unknown hook" in registry.failures[0].error


def test_autoload_can_be_disabled(install_plugin, monkeypatch):
    install_plugin("bl-tiny-plugin", "bl_test_tiny", TINY_RECIPE.format(name="tiny"))
    monkeypatch.setenv("BEATLOOP_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry_module.reset_registry()
    assert "tiny" not in beatloop.recipes()
    monkeypatch.delenv("BEATLOOP_DISABLE_PLUGIN_AUTOLOAD")
    registry_module.reset_registry()
    assert "tiny" in beatloop.recipes()


def test_incomplete_recipe_class_is_refused_at_registration():
    class Half(beatloop.Recipe):
        name = "half"

        def losses(self):
            return {}

    with pytest.raises(RegistrationError) as caught:
        Registry(load_entry_points=False).register(Half)
    message = str(caught.value)
    assert "build_optimizers" in message and "schedule" in message
    lacks = message.split("lacks")[1]
    # default_data and build_models are optional: a run passes data= and models=.
    assert "losses" not in lacks and "default_data" not in lacks and "build_models" not in lacks


def test_register_at_run_time(monkeypatch):
    class Notebook(Supervised):
        """Defined in a notebook."""

        name = "notebook_recipe"

    registry = Registry(load_entry_points=False)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    assert beatloop.register(Notebook) is Notebook
    assert beatloop.get_recipe("notebook_recipe") is Notebook
    assert registry.recipe("notebook_recipe").origin == f"registered in {__name__}"


@pytest.mark.slow
def test_import_loads_neither_tensorflow_nor_plugins():
    code = (
        "import sys, beatloop; "
        "print('tensorflow' in sys.modules, 'beatloop.plugins.registry' in sys.modules)"
    )
    assert run_python("-c", code, fresh=True).split() == ["False", "False"]


PARTIAL_SCHEDULE = '''
import beatloop
from beatloop.recipes.supervised import Supervised


class KernelsOnly(Supervised):
    """Updates only kernels: its biases are owned by no beat."""

    name = "kernels_only"

    def schedule(self):
        beat = beatloop.Beat(loss="loss", optimizer="optimizer", updates="model:*kernel")
        return beatloop.Schedule(beat)


@beatloop.hookimpl
def register_recipes():
    return [KernelsOnly]
'''

MISSING_PARTS = '''
import beatloop


class Sketch(beatloop.Recipe):
    """Not finished."""

    name = "sketch"


@beatloop.hookimpl
def register_recipes():
    return [Sketch]
'''


def test_plugin_schedule_error_names_the_plugin(install_plugin, small_digits):
    from helpers import tuple_batches

    install_plugin("bl-partial", "bl_test_partial", PARTIAL_SCHEDULE)
    registry_module.reset_registry()
    train, _ = small_digits
    with pytest.raises(beatloop.ScheduleError) as caught:
        beatloop.fit("kernels_only", data=tuple_batches(train, 50))
    message = str(caught.value)
    origin = "recipe 'kernels_only' (plugin 'bl_test_partial' from bl-partial)"
    assert message.startswith(f"the schedule of {origin} has 2 problem(s)")
    assert "bias' of model 'model' is updated by no beat" in message


def test_plugin_recipe_missing_parts_is_refused_at_registration(install_plugin):
    install_plugin("bl-sketch", "bl_test_sketch", MISSING_PARTS)
    with pytest.warns(
        RuntimeWarning,
        match=r"Sketch from plugin 'bl_test_sketch' \(bl-sketch\) has 1 problem\(s\):\n"
        r"  - it lacks",
    ):
        registry = Registry()
    with pytest.raises(
        RecipeNotFoundError,
        match=r"(?s)failed to load: bl_test_sketch \(bl-sketch\).*build_optimizers",
    ):
        registry.recipe("sketch")


def test_recipe_whose_default_schedule_names_unknown_losses_is_refused():
    class Mislabelled(Supervised):
        name = "mislabelled"

        def schedule(self):
            return beatloop.Schedule(
                beatloop.Beat(loss="xent", optimizer="optimizer", updates="model")
            )

    with pytest.raises(
        RegistrationError, match=r"beat 'xent' uses loss 'xent', which losses\(\) does not define"
    ):
        Registry(load_entry_points=False).register(Mislabelled)


def test_registration_lists_every_problem_at_once():
    class Typos(Supervised):
        name = "not an identifier"

        def schedule(self):
            return beatloop.Schedule(
                (
                    beatloop.Beat(loss="los", optimizer="optimiser", updates="model", name="fit"),
                    beatloop.Beat(loss="loss", optimizer="adam", updates="model", name="again"),
                )
            )

    with pytest.raises(RegistrationError) as caught:
        Registry(load_entry_points=False).register(Typos)
    message = str(caught.value)
    assert "has 4 problem(s):" in message
    for problem in (
        "lacks a `name` that is a Python-style identifier (found 'not an identifier')",
        "beat 'fit' uses loss 'los' (did you mean 'loss'?), which losses() does not define",
        "beat 'fit' uses optimizer 'optimiser' (did you mean 'optimizer'?), which "
        "build_optimizers() does not define (defined: optimizer)",
        "beat 'again' uses optimizer 'adam'",
    ):
        assert problem in message, problem


def test_missing_methods_do_not_hide_the_schedules_problems():
    class Unfinished(beatloop.Recipe):
        name = "unfinished"

        def losses(self):
            return {"loss": lambda models, batch: 0.0}

        def schedule(self):
            return beatloop.Schedule(beatloop.Beat(loss="lost", optimizer="opt", updates="m"))

    with pytest.raises(RegistrationError) as caught:
        Registry(load_entry_points=False).register(Unfinished)
    message = str(caught.value)
    assert "lacks the method(s) build_optimizers\n" in message
    assert "beat 'lost' uses loss 'lost'" in message


def test_list_verbose_shows_failed_plugins(install_plugin, capsys):
    from beatloop.cli import main

    install_plugin("bl-broken", "bl_test_broken", "raise ImportError('missing dependency xyz')\n")
    registry_module.reset_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # as a user's terminal shows them
        assert main(["list", "--verbose"]) == 0
    out, err = capsys.readouterr()
    assert "failed plugin bl_test_broken [bl-broken]: import failed: ImportError: missing" in out
    assert err == (  # one line, --verbose or not
        "beatloop: warning: beatloop plugin 'bl_test_broken' (bl-broken) was not loaded: "
        "import failed: ImportError: missing dependency xyz\n"
    )
    assert "\nsupervised  " in out and out.startswith("contrastive  ")


def test_a_recipe_registered_in_a_script_or_module_is_named_by_where(monkeypatch, small_digits):
    class Ported(Supervised):
        """Registered from a script."""

        name = "ported_recipe"

    registry = Registry(load_entry_points=False)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    beatloop.register(Ported)
    with pytest.raises(beatloop.DataError) as raised:
        beatloop.fit("ported_recipe", data=tf.data.Dataset.from_tensors({"z": [1.0]}), seed=0)
    assert str(raised.value).startswith(
        f"recipe 'ported_recipe' (registered by beatloop.register in module {__name__}) "
    )
    monkeypatch.setattr(Ported, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "__file__", "/home/me/cgan_port.py", raising=False)
    registry = Registry(load_entry_points=False)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    beatloop.register(Ported)
    assert registry.recipe("ported_recipe").origin == "registered in script cgan_port.py"
    assert registry.describe_origin("ported_recipe") == (
        "recipe 'ported_recipe' (registered in script cgan_port.py)"
    )
    monkeypatch.delattr(sys.modules["__main__"], "__file__")
    assert registry.describe_origin("ported_recipe") == (
        "recipe 'ported_recipe' (registered in the interactive session)"
    )


def test_optimizers_that_raise_or_are_no_dict_are_refused_and_eager_code_is_not():
    """Registration calls the recipe's methods in a throwaway graph (no variable made):
    what it refused before it refuses still, and code that needs eager tensors is
    called again eagerly rather than refused."""

    class Raising(Supervised):
        name = "raising"

        def build_optimizers(self):
            raise RuntimeError("no optimizer today")

    class Listed(Supervised):
        name = "listed"

        def build_optimizers(self):
            return [keras.optimizers.Adam()]

    class Eager(Supervised):
        name = "eager"

        def build_optimizers(self):
            rate = tf.constant(0.01).numpy()  # raises in a graph: a symbolic tensor
            return {"optimizer": keras.optimizers.Adam(float(rate))}

    registry = Registry(load_entry_points=False)
    with pytest.raises(RegistrationError) as raised:
        registry.register(Raising)
    assert "build_optimizers() fails on the default config: RuntimeError: no optimizer" in str(
        raised.value
    )
    with pytest.raises(RegistrationError) as raised:
        registry.register(Listed)
    assert "build_optimizers() must return a dict of optimizers, got list" in str(raised.value)
    assert registry.register(Eager) is Eager


#: A script that registers a recipe at module level and looks recipes up, then gives
#: TensorFlow two logical CPU devices and trains the recipe on both.
REGISTERED_THEN_DEVICES = '''
import sys
import attrs, keras, numpy as np, tensorflow as tf
import beatloop


@attrs.frozen
class Config:
    rate: float = 0.01


class Squares(beatloop.Recipe):
    """A regression on 4 inputs."""

    name = "squares"
    Config = Config
    batch_keys = {"x": 2, "y": 2}

    def build_models(self, spec):
        return {"m": keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])}

    def build_optimizers(self):
        decay = keras.optimizers.schedules.ExponentialDecay(self.config.rate, 10, 0.9)
        return {"adam": keras.optimizers.Adam(decay)}

    def losses(self):
        return {"mse": self.mse}

    def mse(self, models, batch):
        return tf.reduce_mean(tf.square(models["m"](batch["x"]) - batch["y"]))

    def schedule(self):
        return beatloop.Schedule(beatloop.Beat(loss="mse", optimizer="adam", updates="m"))


beatloop.register(Squares)
from beatloop.plugins.registry import registry
assert "supervised" in beatloop.recipes() and "squares" in beatloop.recipes()
assert registry().recipe("gan").origin == "built-in"
assert beatloop.get_recipe("squares") is Squares
beatloop.make_recipe("squares", {"rate": 0.02}).schedule().describe()
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
data = tf.data.Dataset.from_tensor_slices({"x": x, "y": x.sum(1, keepdims=True)}).batch(16)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
result = beatloop.fit("squares", data=data, epochs=2, seed=0, strategy=strategy, progress=False)
losses = result.history["mse"]
print(strategy.num_replicas_in_sync, result.steps, losses[-1] < losses[0])
'''


@pytest.mark.slow
def test_registering_and_looking_up_leave_the_devices_to_configure(tmp_path):
    """A script's ``beatloop.register`` at module level, the registry loaded with the
    built-in plugin, ``recipes()``, ``get_recipe`` and ``make_recipe`` initialise none of
    TensorFlow's devices: the script then sets up two logical CPUs (which fails once they
    are initialised) and trains the recipe on them under a ``MirroredStrategy``."""
    script = tmp_path / "squares.py"
    script.write_text(REGISTERED_THEN_DEVICES)
    assert run_python(script).split() == ["2", "8", "True"]
