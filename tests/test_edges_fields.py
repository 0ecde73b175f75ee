"""A public class's field given a value it does not take answers in one line, as a
BeatloopError naming the field, what it takes and what it got (not attrs' tuple of its
message, the Attribute and the validator); and messages never read ``'name''s``."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

import beatloop
from beatloop import (
    Beat,
    BeatloopError,
    ClipValues,
    ConfigError,
    DataSplit,
    EngineOptions,
    Group,
    SourceConfig,
)
from beatloop.core.schedule.config import make_config

BEAT = ("loss", "opt", "model")


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: Beat(*BEAT, accumulate=1.5),
            "Beat(accumulate=...) takes an int >= 1, got 1.5 (float)",
        ),
        (
            lambda: Beat(*BEAT, accumulate="4"),
            "Beat(accumulate=...) takes an int >= 1, got '4' (str)",
        ),
        (lambda: Beat(*BEAT, accumulate=0), "Beat(accumulate=...) takes an int >= 1, got 0 (int)"),
        (lambda: Beat(*BEAT, repeat=0), "Beat(repeat=...) takes an int >= 1, got 0 (int)"),
        (lambda: Beat(*BEAT, every=0), "Beat(every=...) takes an int >= 1, got 0 (int)"),
        (
            lambda: Beat(*BEAT, log="max"),
            "Beat(log=...) takes one of 'mean', 'last', got 'max' (str)",
        ),
        (
            lambda: Beat("a loss", "opt", "model"),
            "Beat(loss=...) takes a Python-style name (letters, digits, underscores), got 'a loss'",
        ),
        (
            lambda: Group("fwd", [Beat(*BEAT)], accumulate=0),
            "Group(accumulate=...) takes an int >= 1, got 0 (int)",
        ),
        (
            lambda: ClipValues("0", 1),
            "ClipValues(low=...) takes an int or a float, got '0' (str)",
        ),
        (
            lambda: DataSplit([1, 2]),
            "DataSplit(train=...) takes a DatasetV2, got [1, 2] (list)",
        ),
        (
            lambda: EngineOptions(on_nan="skip"),
            "EngineOptions(on_nan=...) takes one of 'raise', 'rollback', got 'skip' (str)",
        ),
        (
            lambda: EngineOptions(steps_per_execution=0),
            "EngineOptions(steps_per_execution=...) takes an int >= 1 and < 1048576, or 'auto', "
            "got 0",
        ),
        (
            lambda: SourceConfig(batch_size=0),
            "SourceConfig(batch_size=...) takes a number > 0, got 0",
        ),
    ],
)
def test_a_public_class_refuses_a_value_in_one_line_naming_the_field(make, message):
    with pytest.raises(BeatloopError) as caught:
        make()
    assert str(caught.value) == message
    assert isinstance(caught.value, ConfigError)


@pytest.mark.parametrize(
    "given, message",
    [
        ({"keep_best": 123}, "fit(keep_best=...) takes None or a str, got 123 (int)"),
        ({"check_gradients": "no"}, "fit(check_gradients=...) takes a bool, got 'no' (str)"),
        ({"max_to_keep": 0}, "fit(max_to_keep=...) takes an int >= 1, got 0 (int)"),
    ],
)
def test_fit_refuses_an_engine_option_in_one_line_naming_its_argument(given, message):
    with pytest.raises(ConfigError) as caught:
        beatloop.fit("supervised", **given)
    assert str(caught.value) == message


def test_a_type_error_of_a_field_is_still_a_type_error():
    """Code that caught attrs' TypeError for a wrong type still catches it."""
    with pytest.raises(TypeError, match=r"^Beat\(accumulate=\.\.\.\) takes an int"):
        Beat(*BEAT, accumulate=2.0)


def test_a_recipe_config_field_refused_by_its_validator_reads_in_one_line():
    @attrs.frozen
    class Config:
        mode: str = beatloop.choice("a", ("a", "b"), "how")

    with pytest.raises(ConfigError) as caught:
        make_config(Config, {"mode": "c"}, "recipe 'demo'")
    assert (
        str(caught.value)
        == "config field 'mode' of recipe 'demo' takes one of 'a', 'b', got 'c' (str)"
    )


def test_no_message_puts_a_possessive_after_a_quoted_name():
    """``recipe 'x''s`` reads badly: a message says ``of recipe 'x'`` instead."""
    package = Path(beatloop.__file__).parent
    found = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"!r\}'s\b|\{label\}'s\b", line)
    ]
    assert found == []


def test_the_beat_docstring_names_every_form_of_its_condition():
    for form in (
        "fn(models, batch)",
        "fn(models, batch, loss)",
        "fn(models, batch, loss, gradients)",
    ):
        assert form in " ".join(Beat.__doc__.split())


def test_a_field_error_survives_pickling():
    import pickle

    with pytest.raises(ConfigError) as caught:
        Beat(*BEAT, every=0)
    again = pickle.loads(pickle.dumps(caught.value))
    assert str(again) == str(caught.value) and again.field == "every"
