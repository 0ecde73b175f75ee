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
