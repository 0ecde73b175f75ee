"""Faults a run used to pass over in silence: a loss that runs away with the divergence
guard off, and settings that have no effect on the run they are given to."""

from __future__ import annotations

import warnings

import attrs
import numpy as np
import pytest
import tensorflow as tf
from helpers import classifier, tuple_batches

import beatloop
from beatloop.core.data.batches import DataSplit
from beatloop.core.data.source import DataSource
from beatloop.core.failures.errors import IgnoredSettingWarning, RunawayLossWarning
from beatloop.named_data.load import load_data
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry


def _fit_warnings(**options) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        beatloop.fit("supervised", seed=0, **options)
    return [str(w.message) for w in caught if w.category is RunawayLossWarning]


# --- a runaway loss --------------------------------------------------------------------------


def test_a_runaway_loss_warns_once_naming_the_beat_the_epoch_and_the_loss(small_digits):
    data = (tuple_batches(small_digits[0], 50), tuple_batches(small_digits[1], 50))
    (message,) = _fit_warnings(data=data, epochs=3, config={"learning_rate": 1e9})
    head, _, advice = message.partition("; ")
    assert head.startswith("the loss of beat 'loss' ran away in epoch 1: ")
    assert " times its first value 2.3" in head  # the untrained model's loss, about ln 10
    assert advice == (
        "the run went on because the divergence guard is off: pass divergence=10 "
        "(--divergence 10) to stop a run whose loss runs away (a learning rate too high, say)"
    )
    with pytest.raises(beatloop.NumericsError) as caught:  # the advice, followed
        beatloop.fit("supervised", data=data, seed=0, config={"learning_rate": 1e9}, divergence=10)
    assert caught.value.exit_code == 4
    assert _fit_warnings(data=data, epochs=2) == []  # a loss that falls says nothing


def test_the_runaway_rule():
    from beatloop.core.compiled.numerics import runaway_words

    assert runaway_words("g", 2, float("inf"), 1.0).startswith(
        "the loss of beat 'g' ran away in epoch 3: inf, not finite; "
    )
    assert runaway_words("d", 0, 9e5, 1e-3) is None  # a first value below 1 counts as 1
    assert runaway_words("d", 0, -2e6, 1e-3).startswith(
        "the loss of beat 'd' ran away in epoch 1: -2e+06, over 1e+06 times its first value 0.001"
    )
    assert runaway_words("d", 0, 2e13, 3e7) is None  # large from the start: its own scale


# --- settings that have no effect ------------------------------------------------------------


def _ignored(run) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run()
    return result, [str(w.message) for w in caught if w.category is IgnoredSettingWarning]


def test_validation_fraction_with_data_given_is_named_as_having_no_effect(small_digits):
    data = tuple_batches(small_digits[0], 50)
    config = {"validation_fraction": 0.3}
    result, (message,) = _ignored(lambda: beatloop.fit("supervised", data=data, config=config))
    assert message == (
        "config validation_fraction=0.3 (--set validation_fraction=0.3) has no effect: it "
        "holds out part of the built-in data of recipe 'supervised', and data= is given; pass "
        "validation data in data= (a (train, validation) pair or a DataSplit)"
    )
    assert "val_loss" not in result.history


def test_a_config_field_only_build_models_reads_is_named_when_models_are_given(small_digits):
    data = tuple_batches(small_digits[0], 50)
    config = {"hidden": 128, "dropout": 0.1, "learning_rate": 0.01, "classes": 10}
    _, messages = _ignored(
        lambda: beatloop.fit("supervised", data=data, config=config, models={"model": classifier()})
    )
    assert messages == [
        f"config {name} (--set {name.partition('=')[0]}=...) has no effect: only the "
        "build_models of recipe 'supervised' reads it, and models= gives every model the recipe "
        "uses (model); build the models you pass with it instead"
        for name in ("dropout=0.1", "hidden=128")
    ]  # learning_rate goes to the optimizer; classes names the labels' classes
    _, messages = _ignored(lambda: beatloop.fit("supervised", data=data, config=config))
    assert messages == []


@pytest.fixture
def digits_csv(tmp_path, small_digits):
    train, _ = small_digits
    path = tmp_path / "digits.csv"
    rows = [",".join([*map(str, x), str(y)]) for x, y in zip(train["x"], train["y"], strict=True)]
    header = ",".join([*(f"p{i}" for i in range(64)), "digit"])
    path.write_text("\n".join([header, *rows]) + "\n")
    return f"csv:{path}"


def test_the_recipes_validation_fraction_holds_out_part_of_a_source(digits_csv):
    recipe = beatloop.make_recipe("supervised", {"validation_fraction": 0.25})
    split, messages = _ignored(
        lambda: load_data(digits_csv, ["label=digit"], recipe=recipe, seed=0)
    )
    assert messages == []
    assert sum(int(tf.shape(b["y"])[0]) for b in split.validation) == 50  # 0.25 of 200
    own = ["label=digit", "validation_fraction=0.1"]
    split, messages = _ignored(lambda: load_data(digits_csv, own, recipe=recipe, seed=0))
    assert messages == [
        "--set validation_fraction=0.25 has no effect: --data-set validation_fraction=0.1 is "
        "the source's"
    ]
    assert sum(int(tf.shape(b["y"])[0]) for b in split.validation) == 20
    given = ["label=digit"]
    _, messages = _ignored(
        lambda: load_data(digits_csv, given, recipe=recipe, seed=0, validation=digits_csv)
    )
    assert messages == [
        f"--set validation_fraction=0.25 has no effect: --validation-data {digits_csv} gives "
        "the validation data"
    ]


@attrs.frozen
class _BareConfig:
    """No parameters at all: no validation_fraction."""


class _Bare(DataSource):
    """A source kind that holds out nothing (test kind)."""

    name = "bare"
    Config = _BareConfig

    def load(self, seed, batch_size):
        rows = {"x": np.zeros((8, 64), np.float32), "y": np.zeros(8, np.int32)}
        return DataSplit(tf.data.Dataset.from_tensor_slices(rows).batch(batch_size))


def test_a_source_kind_without_validation_fraction_says_the_recipes_has_no_effect(monkeypatch):
    registry = Registry(load_entry_points=False)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    registry.register_source(_Bare)
    recipe = beatloop.make_recipe("supervised", {"validation_fraction": 0.25})
    split, messages = _ignored(lambda: load_data("bare:-", [], recipe=recipe, seed=0))
    assert split.validation is None
    assert messages == [
        "--set validation_fraction=0.25 has no effect: data source kind 'bare' holds out no "
        "validation data (it has no validation_fraction parameter); pass --validation-data"
    ]
