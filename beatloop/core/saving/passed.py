"""The models and optimizers a run was passed (``fit(models=..., optimizers=...)``),
kept in its run dir when it starts, so ``restore``, ``evaluate``, ``export`` and the
command line rebuild the run without the script that made them.

Each passed model is written as ``RUN_DIR/passed/NAME.keras`` (Keras's own format: its
architecture, config and the weights it started from) and each passed optimizer's Keras
config (its learning-rate schedule included) goes into ``run.json``
(``passed_models``, ``passed_optimizers``). A part Keras cannot serialise is said once,
in a ``NotRecordedWarning``, and recorded as not kept, with the reason: a rebuild then
needs it passed again (``models=``/``optimizers=``), and says so.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras

from beatloop.core.failures.errors import ConfigError
from beatloop.core.saving.run_dir import writing

#: Where a run dir keeps the models it was passed.
FOLDER = "passed"
#: What ``run.json`` records of a part that could not be kept: why.
NOT_KEPT = "not_kept"


class NotRecordedWarning(UserWarning):
    """A model or optimizer passed to ``fit`` that Keras cannot serialise: the run dir
    cannot rebuild it, so ``restore``, ``evaluate`` and ``export`` need it passed again."""


def record_passed(
    run_dir: Path,
    models: Mapping[str, keras.Layer],
    optimizers: Mapping[str, keras.optimizers.Optimizer],
    recorded: Mapping[str, Any],
) -> dict[str, Any]:
    """Keep the passed ``models`` and ``optimizers`` in ``run_dir`` (those ``recorded``,
    the run's earlier ``run.json``, already holds are left as they are: a resume) and
    return what ``run.json`` records of them (nothing when none were passed)."""
    facts = {}
    kept_models = dict(recorded.get("passed_models") or {})
    for name, model in models.items():
        if name not in kept_models or not _present(run_dir, kept_models[name]):
            kept_models[name] = _kept_model(run_dir, name, model)
    if kept_models:
        facts["passed_models"] = kept_models
    kept_optimizers = dict(recorded.get("passed_optimizers") or {})
    for name, optimizer in optimizers.items():
        kept_optimizers.setdefault(name, _kept_optimizer(name, optimizer))
    if kept_optimizers:
        facts["passed_optimizers"] = kept_optimizers
    return facts


def _present(run_dir: Path, entry) -> bool:
    return not isinstance(entry, str) or (Path(run_dir) / entry).is_file()


def _kept_model(run_dir: Path, name: str, model: keras.Layer) -> str | dict:
    """``passed/NAME.keras`` written (atomically: a temporary file renamed), or why not."""
    relative = f"{FOLDER}/{name}.keras"
    path = Path(run_dir) / relative
    temporary = path.with_name(f".{name}.tmp.keras")
    with writing(path.parent, "create"):
        path.parent.mkdir(exist_ok=True)
    try:
        model.save(temporary)
    except Exception as error:  # Keras's serialisation: a subclass without get_config...
        temporary.unlink(missing_ok=True)
        return _not_kept("model", name, error)
    with writing(path):
        temporary.replace(path)
    return relative


def _kept_optimizer(name: str, optimizer: keras.optimizers.Optimizer) -> dict:
    """The optimizer's Keras config (``keras.saving.serialize_keras_object``, as JSON
    holds it: its schedule a config too), or why not."""
    try:
        text = json.dumps(keras.saving.serialize_keras_object(optimizer))
        # What a rebuild does, said now if it fails (on a copy: Keras fills in the config).
        keras.saving.deserialize_keras_object(json.loads(text))
    except Exception as error:
        return _not_kept("optimizer", name, error)
    return json.loads(text)


def _not_kept(kind: str, name: str, error: Exception) -> dict:
    reason = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    warnings.warn(
        f"{kind} {name!r} passed to fit cannot be kept in the run dir (Keras cannot "
        f"serialise it: {reason}); restore, evaluate and export of this run need it passed "
        f"again ({kind}s={{{name!r}: ...}}, or a command's --import of the module defining "
        "it when it is a registered Keras object)",
        NotRecordedWarning,
        stacklevel=5,
    )
    return {NOT_KEPT: reason}


def passed_parts(run_dir: Path, recorded: Mapping[str, Any]):
    """The models (``.keras`` paths) and optimizers (rebuilt from their configs) the run
    was passed, as ``recorded`` (its ``run.json``) names them, for a rebuild:
    ``(models, optimizers, not_kept)``, ``not_kept`` naming each part that was not kept
    and why."""
    models, optimizers, not_kept = {}, {}, {}
    for name, entry in (recorded.get("passed_models") or {}).items():
        if isinstance(entry, str):
            models[name] = Path(run_dir) / entry
        else:
            not_kept[("model", name)] = entry.get(NOT_KEPT, "not recorded")
    for name, entry in (recorded.get("passed_optimizers") or {}).items():
        if isinstance(entry, Mapping) and NOT_KEPT in entry:
            not_kept[("optimizer", name)] = entry[NOT_KEPT]
            continue
        try:
            optimizers[name] = keras.saving.deserialize_keras_object(json.loads(json.dumps(entry)))
        except Exception as error:
            raise ConfigError(
                f"optimizer {name!r} recorded in {Path(run_dir) / 'run.json'} cannot be "
                f"rebuilt ({type(error).__name__}: {error}); pass optimizers={{{name!r}: ...}}"
            ) from error
    return models, optimizers, not_kept


def refuse_not_kept(run_dir: Path, not_kept: Mapping, given: Mapping, verb: str) -> None:
    """A ``ConfigError`` naming every part the run was passed, could not keep, and is not
    given now, and how to pass each."""
    missing = {key: why for key, why in not_kept.items() if key[1] not in given[key[0]]}
    if not missing:
        return
    lines = "; ".join(
        f"{kind} {name!r} ({why}): pass {kind}s={{{name!r}: ...}}"
        for (kind, name), why in missing.items()
    )
    raise ConfigError(
        f"the run in {run_dir} was passed parts its run dir could not keep, which {verb} "
        f"needs again: {lines}"
    )
