"""Settings a run is given that have no effect on it, named in a warning before it
starts: the recipe's ``validation_fraction`` when ``data=`` is given, and config fields
only ``build_models`` reads when ``models=`` gives every model the recipe uses.

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

from beatloop.core.failures.errors import IgnoredSettingWarning
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
    judged."""
    changed = {name: getattr(recipe.config, name) for name in config or {}}
    label = f"recipe {recipe.name!r}"
    fraction = changed.get("validation_fraction")
    if fraction is not None and data is not None and not callable(data):
        warn(
            f"config validation_fraction={fraction} (--set validation_fraction={fraction}) has "
            f"no effect: it holds out part of {label}'s built-in data, and data= is given; "
            "pass validation data in data= (a (train, validation) pair or a DataSplit)"
        )
    names = recipe.model_names()
    if not models or not defines(recipe, "build_models") or not set(names) <= set(models):
        return
    for name in sorted(set(changed) & model_only_fields(type(recipe), recipe.label_classes())):
        warn(
            f"config {name}={changed[name]!r} (--set {name}=...) has no effect: only {label}'s "
            f"build_models reads it, and models= gives every model the recipe uses "
            f"({', '.join(names)}); build the models you pass with it instead"
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
