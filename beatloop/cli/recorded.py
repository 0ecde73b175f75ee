"""A finished run as ``export`` and ``evaluate`` read it: its recipe rebuilt from the
latest checkpoint's record, and the data it was named with (``run.json``'s
``data_source``, read again by ``beatloop.named_data.recorded``, whose functions are here too)."""

from __future__ import annotations

from pathlib import Path

from beatloop.named_data.recorded import read_recorded_source, recorded_source

__all__ = ["existing_run_dir", "read_recorded_source", "recorded_recipe", "recorded_source"]


def existing_run_dir(run_dir: Path, verb: str) -> Path:
    """``run_dir``, checked before anything is read (``core.saving.run_dir``'s check, in
    the command line's words)."""
    from beatloop.core.saving.run_dir import existing_run_dir as checked

    return checked(run_dir, verb)


def recorded_recipe(run_dir: Path, verb: str):
    """The run's record (latest readable checkpoint) and its recipe, configured as it
    was; a ``CheckpointError`` when there is none to ``verb``, a ``RecipeNotFoundError``
    naming the module its ``run.json`` records when the recipe is not registered."""
    from beatloop.core.failures.errors import CheckpointError
    from beatloop.core.saving.checkpoints import latest_record
    from beatloop.fitting import make_recipe
    from beatloop.restoring import config_overrides
    from beatloop.user_modules import recorded_module, registered_recipe

    record = latest_record(run_dir)
    if record is None:
        raise CheckpointError(f"{run_dir} holds no readable checkpoint to {verb}")
    cls = registered_recipe(record.recipe, recorded_module(run_dir))
    return record, make_recipe(cls, config_overrides(cls, record.config))
