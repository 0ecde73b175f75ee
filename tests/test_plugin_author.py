"""Issue 63's item 10, what a plugin author met writing a first plugin from the docs: a
quality figure in the form the docs print, two plugins registering one name, `export`
of a recipe without inference models, `models.random` under a strategy, a source that
reads no file, a plugin source's parameter help, `PUBLIC_MODULES`, the public paths the
reference names and the SavedModel the command line page loads.

Plugins are added in this process through the registry's pluggy plugin manager (the
path an installed package's entry point takes), never installed."""

from __future__ import annotations

import types

import attrs
import keras
import numpy as np
import pytest
import tensorflow as tf

import beatloop
from beatloop.cli import main
from beatloop.core.devices.replicas import ReplicaRandom
from beatloop.datasets import split_arrays
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry


@pytest.fixture
def fresh(monkeypatch):
    """A registry of the built-ins alone, as the process's, for this test only."""
    registry = Registry(load_entry_points=False)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    return registry


class Tiny(beatloop.Recipe):
    """A linear regression on made-up data, for the registry's and commands' checks."""

    name = "tiny"

    def default_data(self, seed):
        x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(-1, 1)
        data = tf.data.Dataset.from_tensor_slices({"x": x, "y": 3 * x})
        return beatloop.DataSplit(data.batch(16), data.batch(16))

    def build_models(self, spec):
        return {"line": keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])}

    def build_optimizers(self):
        return {"sgd": keras.optimizers.SGD(0.1)}

    def losses(self):
        return {"fit": self.fit}

    def fit(self, models, batch):
        return tf.reduce_mean(tf.square(models["line"](batch["x"]) - batch["y"]))

    def schedule(self):
        return beatloop.Schedule(beatloop.Beat("fit", "sgd", "line"))


@attrs.frozen
class RingConfig(beatloop.SourceConfig):
    """``count``: how many points the ring has."""

    count: int = 32
    radius: float = beatloop.setting(1.0, "the ring's radius")


class Ring(beatloop.DataSource):
    """Points on a ring, made up: it reads no file."""

    name = "ring"
    Config = RingConfig
    needs_path = False

    def load(self, seed, batch_size):
        angle = np.linspace(0, 2 * np.pi, self.config.count, endpoint=False, dtype=np.float32)
        x = self.config.radius * np.stack([np.cos(angle), np.sin(angle)], axis=1)
        y = (angle > np.pi).astype(np.int32)
        return split_arrays({"x": x, "y": y}, self.config, seed, batch_size, self.label)


def subclass(base: type, **members) -> type:
    """A subclass of ``base`` made here (its module this test's), with ``members``."""
    return type(base.__name__, (base,), {"__module__": __name__, **members})


# --- (a) quality_figure = "FIGURE:MODE", the form the docs print ------------------------


def test_a_quality_figure_written_as_the_docs_print_it_works_in_show_list_and_keep_best(
    fresh, capsys, tmp_path
):
    cls = beatloop.register(subclass(Tiny, name="tiny_q", quality_figure="val_fit:min"))
    assert cls.quality_figure == ("val_fit", "min")  # one form for every reader
    assert main(["show", "tiny_q"]) == 0
    assert "val_fit:min (lower is better)" in capsys.readouterr().out
    assert main(["list", "--verbose"]) == 0
    listed = capsys.readouterr().out.split("\ntiny_q ", 1)[1]
    assert "quality figure: val_fit:min (lower is better)" in listed.split("\n\n")[0]
    result = beatloop.fit("tiny_q", epochs=2, seed=0, run_dir=tmp_path, keep_best="quality")
    assert result.history["val_fit"][-1] < result.history["val_fit"][0]


@pytest.mark.parametrize(
    "quality", ["val_fit", "val_fit:best", ":max", ("val_fit", "up"), ("val_fit",), 3]
)
def test_any_other_quality_figure_is_refused_at_registration_naming_both_forms(fresh, quality):
    with pytest.raises(beatloop.RegistrationError) as raised:
        beatloop.register(subclass(Tiny, name="tiny_bad", quality_figure=quality))
    assert "its quality_figure must be 'FIGURE:min' or 'FIGURE:max'" in str(raised.value)
    assert f"found {quality!r}" in str(raised.value)


# --- (b) two plugins registering one name: that name only is lost -----------------------


def test_a_plugin_source_named_as_a_built_in_costs_that_name_only(monkeypatch):
    """A plugin added through pluggy as an entry point's would be: its ``npz`` clashes
    with the built-in one, its ``ring`` and every other kind load."""

    @attrs.frozen
    class NpzLike(beatloop.SourceConfig):
        pass

    clash = subclass(Ring, name="npz", Config=NpzLike)
    plugin = types.SimpleNamespace(register_data_sources=beatloop.hookimpl(lambda: [clash, Ring]))
    monkeypatch.setattr(
        Registry, "_load_entry_points", lambda self: self._add_plugin(plugin, "bl_p", "bl-dist")
    )
    both = r"data source 'npz' is registered by .*NpzSource from beatloop \(built-in\) and by "
    both += rf"{__name__}.Ring from plugin 'bl_p' \(bl-dist\)"
    with pytest.warns(RuntimeWarning, match=both):
        registry = Registry()
    assert registry.source("ring").cls is Ring and registry.source("csv").origin == "built-in"
    with pytest.raises(beatloop.RegistrationError, match=both):
        registry.source("npz")


# --- (e) a source that reads no file: --data KIND alone ----------------------------------


def test_a_source_that_reads_no_path_is_named_by_its_kind_alone(fresh, capsys):
    beatloop.register_data_source(Ring)
    recipe = beatloop.make_recipe("supervised")
    alone = beatloop.load_data("ring", ["count=16", "shuffle=false"], recipe=recipe, seed=0)
    assert sum(int(b["y"].shape[0]) for b in alone.train) == 16
    given = beatloop.load_data(
        "ring:-", ["count=16", "shuffle=false"], recipe=recipe, seed=0
    )  # still works
    assert [b["x"].numpy().tolist() for b in given.train] == [
        b["x"].numpy().tolist() for b in alone.train
    ]
    assert main(["data", "ring"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "  --data ring  (it reads no path)"
    with pytest.raises(beatloop.ConfigError, match=r"got 'csv'; kind 'csv' reads a path"):
        beatloop.load_data("csv", recipe=recipe, seed=0)
    with pytest.raises(beatloop.DataError, match=r"data source 'ring' gives \['x', 'y'\]"):
        beatloop.load_data("ring", recipe=beatloop.make_recipe("risk_weighted"), seed=0)


# --- (f) a plugin source's parameter help is its own ------------------------------------


def test_a_plugin_sources_help_says_its_own_parameters(fresh, capsys):
    @attrs.frozen
    class Undocumented(beatloop.SourceConfig):
        count: int = 8

    beatloop.register_data_source(Ring)
    beatloop.register_data_source(subclass(Ring, name="bare", Config=Undocumented))
    assert main(["data", "ring"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ring: Points on a ring, made up: it reads no file.  [registered")
    assert lines[2].startswith("  Parameters every built-in source has.")
    assert "  count: how many points the ring has." in lines
    assert lines[-2:] == ["  count: int = 32", "  radius: float = 1.0  (the ring's radius)"]
    assert main(["data", "bare"]) == 0  # no docstring: the shared paragraph, said once
    out = capsys.readouterr().out
    assert out.count("Parameters every built-in source has.") == 1
    assert out.endswith("  count: int = 8\n")
    assert main(["data"]) == 0  # every kind: the shared paragraph once, first
    out = capsys.readouterr().out
    assert out.count("Parameters every built-in source has.") == 1
    ring = out.split("\nring: ", 1)[1].split("\n\n", 1)[0]
    assert "  count: how many points the ring has." in ring.splitlines()


# --- (c) export of a recipe without inference models names the method -------------------


def test_export_without_inference_models_names_the_method_to_define(fresh, tmp_path):
    result = beatloop.fit(Tiny(), epochs=1, seed=0)
    with pytest.raises(beatloop.BeatloopError) as raised:
        result.export(tmp_path / "out")
    assert str(raised.value) == (
        "recipe 'tiny' has no inference model to export: it defines no "
        "inference_models(models), the method returning the trained models to keep by "
        "name (e.g. return {'classifier': models['classifier']})"
    )
    assert not (tmp_path / "out").exists()
    empty = subclass(Tiny, inference_models=lambda self, models: {})
    with pytest.raises(beatloop.BeatloopError, match=r"its inference_models\(models\) returned"):
        beatloop.fit(empty(), epochs=1, seed=0).export(tmp_path / "out")


# --- (d) models.random under a strategy has make_seeds, as the plugins page promises -----


class NoisyTiny(Tiny):
    """Tiny with input noise from stateless ops seeded by ``models.random.make_seeds``."""

    name = "noisy_tiny"

    def fit(self, models, batch):
        seed = models.random.make_seeds()[:, 0]
        noise = tf.random.stateless_normal(tf.shape(batch["x"]), seed)
        return tf.reduce_mean(tf.square(models["line"](batch["x"] + noise) - batch["y"]))


def test_make_seeds_under_a_strategy_gives_one_devices_seeds_and_weights():
    view = ReplicaRandom(tf.random.Generator.from_seed(7), None)
    seeds = view.make_seeds(3)
    assert seeds.numpy().tolist() == tf.random.Generator.from_seed(7).make_seeds(3).numpy().tolist()
    with pytest.raises(AttributeError, match=r"normal, uniform, .*make_seeds .*no 'binomial'"):
        view.binomial  # noqa: B018
    weights = {}
    for strategy in (None, tf.distribute.MirroredStrategy(["/cpu:0"])):
        result = beatloop.fit(NoisyTiny(), epochs=1, seed=0, strategy=strategy)
        weights[strategy is None] = [w.numpy() for w in result.models["line"].weights]
    for one, other in zip(weights[True], weights[False], strict=True):
        np.testing.assert_array_equal(one, other)
