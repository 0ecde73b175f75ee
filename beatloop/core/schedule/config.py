"""Recipe configs: build an attrs config from overrides, with errors that name the field.

Overrides come from Python (``config={"hidden": 128}``) or the command line
(``--set hidden=128``, strings converted by the field's declared type).
"""

from __future__ import annotations

import collections.abc
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from beatloop.core.failures.errors import ConfigError, did_you_mean
from beatloop.core.failures.fields import attrs_problem


def setting(default: Any, doc: str, validator=None) -> Any:
    """A config field with its one-line ``doc`` (the docs' config tables print it)."""
    return attrs.field(default=default, validator=validator, metadata={"doc": doc})


def choice(default: str, choices: tuple[str, ...], doc: str) -> Any:
    """A config field taking one of ``choices``, with its one-line ``doc``."""
    return setting(default, doc, attrs.validators.in_(choices))


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def config_fields(config_cls: type) -> tuple[attrs.Attribute, ...]:
    """The fields of an attrs config class, with their annotations resolved to types."""
    attrs.resolve_types(config_cls)
    return attrs.fields(config_cls)


def make_config(config_cls: type, overrides: Mapping[str, Any] | None, owner: str) -> Any:
    """Return ``config_cls(**overrides)``, or a ``ConfigError`` naming each bad field."""
    overrides = dict(overrides or {})
    fields = {f.name: f for f in config_fields(config_cls)}
    unknown = [key for key in overrides if key not in fields]
    problems = [
        f"{owner} has no config field {key!r}{did_you_mean(key, fields)}" for key in unknown
    ]
    if unknown:  # the fields that exist, once, however many names were wrong
        problems[-1] += f"; fields: {', '.join(fields) or '(none)'}"
    values = {}
    for key, value in overrides.items():
        if key in unknown:
            continue
        try:
            values[key] = _check_type(value, fields[key].type, key)
        except ConfigError as error:
            problems.append(str(error))
    if problems:
        raise ConfigError("; ".join(problems))
    try:
        return config_cls(**values)
    except (TypeError, ValueError) as error:
        problem = attrs_problem(error, owner) or f"invalid config for {owner}: {error}"
        raise ConfigError(problem) from None


def parse_settings(settings: Iterable[str], config_cls: type, owner: str) -> dict[str, Any]:
    """Turn ``["hidden=128", "optimizer=sgd"]`` into typed overrides for ``config_cls``."""
    fields = {f.name: f for f in config_fields(config_cls)}
    parsed = {}
    for setting in settings:
        key, sep, text = setting.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects FIELD=VALUE, got {setting!r}")
        field = fields.get(key)
        if field is None:
            raise ConfigError(
                f"{owner} has no config field {key!r}{did_you_mean(key, fields)}; "
                f"fields: {', '.join(fields) or '(none)'}"
            )
        parsed[key] = _from_text(text.strip(), field.type, key)
    return parsed


def type_name(annotation: Any) -> str:
    """A short readable name of a field's type, for `beatloop show` and messages."""
    if annotation is None or annotation is type(None):
        return "None"
    if annotation is Ellipsis:
        return "..."
    args = typing.get_args(annotation)
    if _is_union(annotation):
        return " | ".join(type_name(a) for a in args)
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if typing.get_origin(annotation) is tuple:
        return f"tuple[{', '.join(type_name(a) for a in args)}]"
    if typing.get_origin(annotation) is collections.abc.Callable:
        return "function"
    return getattr(annotation, "__name__", str(annotation))


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _check_type(value: Any, annotation: Any, key: str) -> Any:
    """Accept ``value`` if it fits ``annotation`` (ints widen to floats), else raise."""
    if annotation is None or annotation is Any:
        return value
    if _is_union(annotation):
        for option in typing.get_args(annotation):
            try:
                return _check_type(value, option, key)
            except ConfigError:
                continue
        raise _wrong_type(key, annotation, value)
    if annotation is type(None):
        if value is None:
            return None
        raise _wrong_type(key, annotation, value)
    if typing.get_origin(annotation) is typing.Literal:
        if value in typing.get_args(annotation):
            return value
        raise _wrong_type(key, annotation, value)
    if typing.get_origin(annotation) is collections.abc.Callable:
        if callable(value):
            return value
        raise _wrong_type(key, annotation, value)
    if typing.get_origin(annotation) is tuple:
        if isinstance(value, (list, tuple)):
            inner = typing.get_args(annotation)
            item_type = inner[0] if inner else Any
            return tuple(_check_type(v, item_type, key) for v in value)
        raise _wrong_type(key, annotation, value)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is int and isinstance(value, bool):
        raise _wrong_type(key, annotation, value)
    if isinstance(annotation, type) and not isinstance(value, annotation):
        raise _wrong_type(key, annotation, value)
    return value


def _from_text(text: str, annotation: Any, key: str) -> Any:
    """Convert command-line text to ``annotation``'s type."""
    if _is_union(annotation):
        options = typing.get_args(annotation)
        if type(None) in options and text.lower() in {"none", "null"}:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _from_text(text, option, key)
            except ConfigError:
                continue
        raise _wrong_type(key, annotation, text)
    if typing.get_origin(annotation) is typing.Literal:
        for choice in typing.get_args(annotation):
            if str(choice) == text:
                return choice
        raise _wrong_type(key, annotation, text)
    if typing.get_origin(annotation) is collections.abc.Callable:
        raise ConfigError(f"config field {key!r} takes a Python function; set it from Python")
    if typing.get_origin(annotation) is tuple:
        inner = typing.get_args(annotation)
        item_type = inner[0] if inner else str
        return tuple(_from_text(t.strip(), item_type, key) for t in text.split(",") if t.strip())
    try:
        if annotation is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError(text)
        if annotation in (int, float, str):
            return annotation(text)
    except ValueError:
        raise _wrong_type(key, annotation, text) from None
    return text


def _wrong_type(key: str, annotation: Any, value: Any) -> ConfigError:
    return ConfigError(
        f"config field {key!r} expects {type_name(annotation)}, "
        f"got {type(value).__name__} {value!r}"
    )
