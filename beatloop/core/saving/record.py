"""The run record: a run's identity, written as ``run.json`` and into every checkpoint.

A run dir's checkpoints are resumed only by the same run: same recipe, config, seed, op
determinism, schedule, model shapes, batch spec and precision. The record holds exactly
those; a resume compares the checkpoint's record with the new run's once, before
anything is restored, and a refusal names only what differs.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from beatloop.core.data.paths import spec_record
from beatloop.core.failures.errors import CheckpointError
from beatloop.core.saving import op_determinism as determinism
from beatloop.core.saving.run_dir import replace_file
from beatloop.core.schedule.recipe_state import state_record


def _lines(value) -> tuple[str, ...]:
    """A schedule's description as lines (records before run.json held it as one text)."""
    if isinstance(value, str):
        return tuple(value.splitlines())
    return tuple(value)


def _json(value) -> Any:
    """``value`` as JSON gives it back (tuples become lists, other objects text)."""
    return json.loads(json.dumps(value, default=str))


@attrs.frozen
class RunRecord:
    """What a checkpoint must agree with to be resumed from.

    ``config`` holds the recipe's config as JSON values; ``schedule`` the lines of
    ``Schedule.describe()`` (of ``Phases.describe()`` for a recipe in phases);
    ``variables`` each model's variable shapes in order (shapes,
    not paths: Keras numbers layer names per process); ``data`` each training batch key's
    ``TensorSpec`` as text; ``state`` the recipe state's shapes and dtypes.
    """

    recipe: str
    config: dict = attrs.field(converter=_json)
    seed: int
    schedule: tuple[str, ...] = attrs.field(converter=_lines)
    variables: dict = attrs.field(converter=_json)
    data: dict = attrs.field(converter=_json)
    precision: str = "float32"
    #: The recipe state's variables (``Recipe.build_state``): name -> shape and dtype;
    #: written out only when there is state, so records without it read as before.
    state: dict = attrs.field(factory=dict, converter=_json)
    #: Whether TensorFlow's op determinism was on (``core/saving/op_determinism.py``); a
    #: record written before it was kept had it on as soon as it was resumed.
    op_determinism: bool = True
    #: The config's defaults: a field the stored record lacks (added to the recipe since)
    #: counts as its default. Not written out, not compared.
    defaults: dict = attrs.field(factory=dict, converter=_json, eq=False)

    @classmethod
    def of(
        cls, recipe, bound, batch_spec: Mapping, seed: int, precision: str, schedule=None
    ) -> RunRecord:
        """The record of a run of ``recipe`` bound as ``bound`` on batches of ``batch_spec``
        (op determinism as the process has it, set for the run by then);
        ``schedule``: what the recipe's ``schedule()`` gave, when it holds more than the
        bound schedule (``Phases``: every phase's lines are the record's)."""
        return cls(
            recipe=recipe.name,
            config=attrs.asdict(recipe.config),
            seed=seed,
            schedule=(bound.schedule if schedule is None else schedule).describe(),
            variables={
                name: [list(v.shape) for v in model.variables]
                for name, model in bound.models.items()
            },
            data=spec_record(batch_spec),
            precision=precision,
            op_determinism=determinism.is_on(),
            state=state_record(bound.state),
            defaults=_defaults(recipe.config),
        )

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> RunRecord:
        """A record as ``to_json`` wrote it (or as checkpoints since issue 8 hold it)."""
        fields = {field.name for field in attrs.fields(cls)}
        return cls(**{key: value for key, value in stored.items() if key in fields})

    def to_json(self) -> dict[str, Any]:
        left_out = {"defaults", *(() if self.state else ("state",))}
        stored = attrs.asdict(self, filter=lambda field, _: field.name not in left_out)
        return {**stored, "schedule": list(self.schedule)}

    def differences(self, current: RunRecord) -> list[str]:
        """What differs between this (stored) record and the run about to resume, briefly:
        a different recipe is all there is to say, and a different config is not
        repeated as the different schedule and shapes it makes."""
        if self.recipe != current.recipe:
            return [f"this run dir holds a {self.recipe!r} run; you asked for {current.recipe!r}"]
        stored_config = {**current.defaults, **self.config}
        found = _mapping_differences("config", stored_config, current.config)
        for name in ("seed", "precision", "op_determinism"):
            old, new = getattr(self, name), getattr(current, name)
            if old != new:
                found.append(f"{name} is {old!r} in the checkpoint but {new!r} now")
        if stored_config != current.config:
            return found
        if self.schedule != current.schedule:
            new = [line for line in current.schedule if line not in self.schedule]
            found.append(f"the schedule differs (now: {'; '.join(new or current.schedule)})")
        found += _shape_differences(self.variables, current.variables)
        found += _mapping_differences("data", self.data, current.data)
        found += _mapping_differences("state", self.state, current.state)
        return found

    def refuse_if_different(self, current: RunRecord, directory: Path) -> None:
        """Raise a CheckpointError naming what differs (``directory``: the checkpoints');
        return quietly when nothing does."""
        found = self.differences(current)
        if self.recipe != current.recipe:
            raise CheckpointError(
                f"{found[0]} ({Path(directory).parent}: use another run dir for a new run)"
            )
        if found:
            raise CheckpointError(
                f"the checkpoints in {directory} belong to a different run and will not be "
                f"restored: {'; '.join(found)}. Use a new run dir, or the same config and "
                "seed to resume"
            )


def _defaults(config) -> dict[str, Any]:
    """Each field of an attrs config that has a default, with it."""
    defaults = {}
    for field in attrs.fields(type(config)):
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            defaults[field.name] = field.default.factory()
        elif field.default is not attrs.NOTHING:
            defaults[field.name] = field.default
    return defaults


def _mapping_differences(name: str, old: Mapping, new: Mapping) -> list[str]:
    """``name.key is A in the checkpoint but B now`` for every key whose value differs."""
    return [
        f"{name}.{key} is {old.get(key)!r} in the checkpoint but {new.get(key)!r} now"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]


def _shape_differences(old: Mapping, new: Mapping) -> list[str]:
    """Per model whose variables differ: the first variable that does, or the counts."""
    found = []
    for model in sorted(set(old) | set(new)):
        before, now = old.get(model), new.get(model)
        if before == now:
            continue
        if before is None or now is None:
            where = "in the checkpoint" if now is None else "now"
            found.append(f"model {model!r} exists only {where}")
        elif len(before) != len(now):
            found.append(
                f"model {model!r} has {len(before)} variables in the checkpoint but {len(now)} now"
            )
        else:
            index = next(i for i, (a, b) in enumerate(zip(before, now, strict=True)) if a != b)
            found.append(
                f"variable {index} of model {model!r} has shape {tuple(before[index])} in the "
                f"checkpoint but {tuple(now[index])} now"
            )
    return found


def write_run_json(path: Path, record: RunRecord, **facts: Any) -> None:
    """Write ``run.json``: the record, then ``facts`` about this run (epochs, steps per
    execution, what it resumed from, the variables each beat updates and each update
    writes) and the versions that ran it. Written to a temporary file first and
    renamed, so it is whole or old."""
    import keras
    import tensorflow as tf

    versions = {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }
    _write_json(path, {**record.to_json(), **facts, "versions": versions})


def update_run_json(path: Path, **facts: Any) -> None:
    """Add or replace ``facts`` in an existing ``run.json`` (what a run learns as it goes,
    like the steps per call ``"auto"`` chose), keeping the rest as written."""
    _write_json(path, {**json.loads(path.read_text(encoding="utf-8")), **facts})


def read_run_json(path: Path) -> dict[str, Any]:
    """An existing ``run.json``'s content (``{}`` when there is none, or it is not JSON)."""
    try:
        content = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def _write_json(path: Path, content: dict) -> None:
    """Write ``content`` to a temporary file, then rename it over ``path``: the file is
    whole or old."""
    replace_file(path, json.dumps(content, indent=2, default=str) + "\n")
