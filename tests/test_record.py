"""The run record: one value that says which run a run dir holds, and a refusal that
names only what differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beatloop.core.failures.errors import CheckpointError
from beatloop.core.saving.record import RunRecord

FIXTURE = Path(__file__).parent / "fixtures" / "old_checkpoints" / "gan"


def record(**changes) -> RunRecord:
    values = {
        "recipe": "gan",
        "config": {"hidden": 8, "n_critic": 2},
        "seed": 7,
        "schedule": ("1. d_loss: ... repeat=2", "2. g_loss: ..."),
        "variables": {"generator": [[4, 8], [8]], "discriminator": [[64, 8], [8]]},
        "data": {"x": "TensorSpec(shape=(None, 64), dtype=tf.float32, name=None)"},
        "precision": "float32",
    }
    return RunRecord(**{**values, **changes})


def test_a_different_recipe_is_one_line_and_nothing_else():
    stored, asked = record(), record(recipe="supervised", config={"hidden": 64}, seed=1)
    assert stored.differences(asked) == [
        "this run dir holds a 'gan' run; you asked for 'supervised'"
    ]
    with pytest.raises(CheckpointError) as refused:
        stored.refuse_if_different(asked, Path("runs/g/checkpoints"))
    assert str(refused.value) == (
        "this run dir holds a 'gan' run; you asked for 'supervised' "
        "(runs/g: use another run dir for a new run)"
    )


def test_a_different_config_names_its_fields_not_what_they_change():
    stored = record()
    asked = record(
        config={"hidden": 16, "n_critic": 2},
        variables={"generator": [[4, 16], [16]], "discriminator": [[64, 16], [16]]},
    )
    assert stored.differences(asked) == ["config.hidden is 8 in the checkpoint but 16 now"]


def test_with_the_same_config_other_models_are_named_by_their_first_different_shape():
    stored = record()
    asked = record(variables={"generator": [[4, 8], [9]], "discriminator": [[64, 8], [8]]})
    assert stored.differences(asked) == [
        "variable 1 of model 'generator' has shape (8,) in the checkpoint but (9,) now"
    ]
    assert record().differences(record()) == []


def test_records_round_trip_through_json_and_read_the_first_format():
    assert RunRecord.from_json(json.loads(json.dumps(record().to_json()))) == record()
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(FIXTURE / "checkpoints" / "ckpt-4"))
    first_format = json.loads(reader.get_tensor("record/.ATTRIBUTES/VARIABLE_VALUE"))
    assert isinstance(first_format["schedule"], str)  # one text, before run.json shared it
    old = RunRecord.from_json(first_format)
    assert old.recipe == "gan" and old.seed == 7 and len(old.schedule) == 2
    assert old.schedule[0].startswith("1. d_loss: loss=d_loss optimizer=d_optimizer")


def test_a_config_field_added_since_counts_as_its_default():
    """A checkpoint written before the gan had ``update`` resumes when the run asks for
    the default, and is refused, naming the field, when it asks for another value
    (tests/test_old_checkpoints.py resumes such a checkpoint end to end)."""
    stored = record()
    defaults = {"hidden": 128, "n_critic": 1, "update": "alternating"}
    same = record(config={"hidden": 8, "n_critic": 2, "update": "alternating"}, defaults=defaults)
    assert stored.differences(same) == []
    other = record(config={"hidden": 8, "n_critic": 2, "update": "simultaneous"}, defaults=defaults)
    assert stored.differences(other) == [
        "config.update is 'alternating' in the checkpoint but 'simultaneous' now"
    ]
    assert "defaults" not in other.to_json()
