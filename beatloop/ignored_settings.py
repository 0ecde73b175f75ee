"""Settings a run is given that have no effect on it, named in a warning before it
starts: the recipe's ``validation_fraction`` when ``data=`` is given, and config fields
only ``build_models`` reads when ``models=`` gives every model the recipe uses. Data a
recipe would never read (``--data`` for a recipe whose own loop makes its data) is
refused instead: ``run.json`` would record it as the training data.

A setting counts as given to ``fit`` when its ``config=`` (``--set``) names it; for a
``--data`` source (``beatloop.sources``), when its value differs from its default. Which
fields ``build_models`` alone reads is read from the recipe class's source
(``self.config.NAME`` in ``build_models`` and the methods only it calls, against every
other method and the fields ``label_classes()`` names); a class whose source cannot be
read is not judged.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import keras

from beatloop.core.data.batches import as_data_split
from beatloop.core.data.data_origin import is_loop_data
from beatloop.core.failures.errors import BeatloopError, ConfigError, IgnoredSettingWarning
from beatloop.core.running.recipe import Recipe, defines


def changed_settings(recipe: Recipe) -> dict[str, Any]:
    """The recipe's config fields whose value differs from the field's default."""
    config = recipe.config
    if not attrs.has(type(config)):
        return {}
    changed = {}
    for field in attrs.fields(type(config)):
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory(config) if default.takes_self else default.factory()
        value = getattr(config, field.name)
        if default is attrs.NOTHING or value != default:
            changed[field.name] = value
    return changed


def warn(message: str) -> None:
    """One ``IgnoredSettingWarning``."""
    warnings.warn(message, IgnoredSettingWarning, stacklevel=3)


def warn_ignored_settings(
    recipe: Recipe, config: Mapping[str, Any] | None, *, data: object, models: Mapping | None
) -> None:
    """Warn of each field of ``config`` (``fit``'s overrides of ``recipe``'s config: what
    the call itself sets) that ``fit(data=..., models=...)`` ignores. A recipe configured
    before the call (its models perhaps built with its own ``build_models``) is not
    judged. Data the recipe would never read is refused (``refuse_unread_data``)."""
    refuse_unread_data(recipe, data)
    changed = {name: getattr(recipe.config, name) for name in config or {}}
    label = f"recipe {recipe.name!r}"
    fraction = changed.get("validation_fraction")
    if fraction is not None and data is not None and not callable(data):
        warn(
            f"config validation_fraction={fraction} (--set validation_fraction={fraction}) has "
            f"no effect: it holds out part of the built-in data of {label}, and data= is given; "
            "pass validation data in data= (a (train, validation) pair or a DataSplit)"
        )
    names = recipe.model_names()
    if not models or not defines(recipe, "build_models") or not set(names) <= set(models):
        return
    for name in sorted(set(changed) & model_only_fields(type(recipe), recipe.label_classes())):
        warn(
            f"config {name}={changed[name]!r} (--set {name}=...) has no effect: only the "
            f"build_models of {label} reads it, and models= gives every model the recipe uses "
            f"({', '.join(names)}); build the models you pass with it instead"
        )


def warn_precision_unused(models: Mapping | None, precision: str) -> None:
    """Warn of each model passed in ``models=`` that computes in float32 although the run
    is mixed-precision: the policy applies to the models a recipe builds, not to the
    user's, which then train in float32 (under loss scaling, for float16)."""
    if precision == "float32":
        return
    half = precision.removeprefix("mixed_")
    for name, model in sorted((models or {}).items()):
        if not isinstance(model, keras.Layer):
            continue  # a .keras path: loaded with the policies it was saved with
        layers = [model, *getattr(model, "layers", ())]
        if any(layer.dtype_policy.compute_dtype == half for layer in layers):
            continue
        scaled = ", under loss scaling" if half == "float16" else ""
        warn(
            f"precision={precision!r} has no effect on model {name!r} passed in models=: it "
            f"was built under the float32 policy, so it computes in float32{scaled}; build "
            f"it under the policy (keras.mixed_precision.set_global_policy({precision!r}) "
            f"before creating it) to compute in {half}"
        )


def refuse_unread_data(recipe: Recipe, data: object) -> None:
    """A ConfigError for ``data`` given to a recipe whose own loop makes its data (its
    ``default_data`` is ``loop_data()``'s ticks, with a ``steps_per_epoch``): a data
    source (``--data``) or batches other than ticks, which it would never read but
    ``run.json`` would record as its training data. Called before anything is read
    or written; data ``fit`` cannot take is left to it."""
    if data is None or recipe.steps_per_epoch is None or not defines(recipe, "default_data"):
        return
    if not is_loop_data(recipe.default_data(0).train):
        return
    label = f"recipe {recipe.name!r}"
    why = (
        f"{label} makes its own data (its default_data is beatloop.loop_data()'s ticks, "
        "which only drive its steps: its acts make what it learns from), so it reads none"
    )
    if callable(data):
        named = getattr(data, "source", None)
        given = f"--data {named}" if isinstance(named, str) else "data= (a function)"
        raise ConfigError(
            f"{why}: {given} would be ignored, yet recorded in run.json as the training "
            "data (a change to it would then refuse the run's resume); run it without --data"
        )
    try:
        train = as_data_split(data).train
    except BeatloopError:
        return  # refused as fit reads it
    if not is_loop_data(train):
        spec = train.element_spec
        keys = ", ".join(map(repr, spec)) if isinstance(spec, Mapping) else type(spec).__name__
        raise ConfigError(
            f"{why}: data= gives batches ({keys}) it would never read; pass no data=, or "
            "ticks (e.g. beatloop.loop_data().train.take(10) as validation data)"
        )


def model_only_fields(cls: type, label_fields: Mapping[str, str] | None = None) -> set[str]:
    """The config fields only ``build_models`` and the methods only it calls read, by
    the source of ``cls`` and its bases below ``Recipe``; fields ``label_fields`` names
    (``label_classes()``) count as read elsewhere. Empty when a source cannot be read."""
    methods = _methods(cls)
    if methods is None or "build_models" not in methods:
        return set()
    building = _reached(methods, ["build_models"])
    others = _reached(methods, [name for name in methods if name not in building])
    elsewhere = _fields(methods, others) | set((label_fields or {}).values())
    return _fields(methods, building) - elsewhere


def _methods(cls: type) -> dict[str, ast.AST] | None:
    """Each method of ``cls`` (the one its MRO resolves) as a syntax tree."""
    methods: dict[str, ast.AST] = {}
    for klass in reversed([k for k in cls.__mro__ if issubclass(k, Recipe) and k is not Recipe]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            return None
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                methods[node.name] = node
    return methods


def _reached(methods: Mapping[str, ast.AST], roots: Iterable[str]) -> set[str]:
    """The methods ``roots`` name, and those they reach through ``self.NAME``."""
    reached, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in reached or name not in methods:
            continue
        reached.add(name)
        todo += [
            node.attr
            for node in ast.walk(methods[name])
            if isinstance(node, ast.Attribute) and _is_name(node.value, "self")
        ]
    return reached


def _fields(methods: Mapping[str, ast.AST], names: Iterable[str]) -> set[str]:
    """The config fields the methods ``names`` read: ``self.config.NAME``, through a
    local ``config = self.config`` too, or ``getattr(self.config, "NAME")``."""
    fields = set()
    for name in names:
        tree = methods[name]
        aliases = {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and _is_config(node.value, set())
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_config(node.value, aliases):
                fields.add(node.attr)
            elif (
                isinstance(node, ast.Call)
                and _is_name(node.func, "getattr")
                and len(node.args) >= 2
                and _is_config(node.args[0], aliases)
                and isinstance(node.args[1], ast.Constant)
            ):
                fields.add(str(node.args[1].value))
    return fields


def _is_config(node: ast.AST, aliases: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in aliases
    return (
        isinstance(node, ast.Attribute) and node.attr == "config" and _is_name(node.value, "self")
    )


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name
