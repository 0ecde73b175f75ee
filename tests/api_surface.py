"""beatloop's public surface described line by line, for ``tests/public_api.txt``: every
public name (``beatloop.__all__`` and each public module's ``__all__``) with its kind and
call signature, an attrs class's fields, a class's own public members (a plugin
subclasses ``Recipe``, ``Callback``, ``DataSource``, ``Environment``: their methods are
part of the surface), the plugin hooks, and the deprecated paths with the release that
removes each.

``python tests/api_surface.py`` prints the description; ``--write`` replaces the record
with it (a deliberate change, committed with the code that makes it and its CHANGELOG
entry)."""

from __future__ import annotations

import enum
import inspect
import re
import sys
from pathlib import Path

import attrs

RECORD = Path(__file__).with_name("public_api.txt")

#: Defaults whose repr carries an address (a sentinel object, a function).
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _clean(text: str) -> str:
    return _ADDRESS.sub("", text)


def _signature(obj) -> str:
    try:
        return _clean(str(inspect.signature(obj)))
    except (TypeError, ValueError):
        return "(?)"


def _value(value) -> str:
    """A constant's repr when it is plain data, else its type's name."""
    plain = (str, int, float, bool, type(None))
    if isinstance(value, plain) or (
        isinstance(value, tuple | frozenset) and all(isinstance(v, plain) for v in value)
    ):
        return repr(value)
    return f"<{type(value).__name__}>"


def _kind(cls: type) -> str:
    if issubclass(cls, Warning):
        return "warning"
    if issubclass(cls, BaseException):
        return "exception"
    if issubclass(cls, enum.Enum):
        return "enum"
    if attrs.has(cls):
        frozen = getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"
        return "attrs class (frozen)" if frozen else "attrs class"
    return "class"


def _annotation(cls: type, field: attrs.Attribute) -> str | None:
    """A field's type as its class's source writes it. Not ``field.type`` alone: once
    ``attrs.resolve_types`` has run on the class (``config_fields`` does) it holds the
    resolved type, and the record would depend on what ran before it."""
    annotation = field.type
    for base in cls.__mro__:
        own = inspect.get_annotations(base)
        if field.name in own:
            annotation = own[field.name]
            break
    if annotation is None or isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):  # a class given as such: by name, as a string names it
        return annotation.__qualname__
    return _clean(repr(annotation))


def _field(cls: type, field: attrs.Attribute) -> str:
    text = f"field {field.name}"
    annotation = _annotation(cls, field)
    if annotation is not None:
        text += f": {annotation}"
    if isinstance(field.default, attrs.Factory):
        text += f" = factory {getattr(field.default.factory, '__qualname__', '?')}"
    elif field.default is not attrs.NOTHING:
        text += f" = {_clean(repr(field.default))}"
    return text + (" (keyword only)" if field.kw_only else "")


def _own_members(cls: type, public: set[type]) -> list[str]:
    """The public members ``cls`` and its beatloop bases define, each as one line; not
    Python's, Keras's or attrs's, nor those of a public base (recorded with it)."""
    lines, seen = [], set()
    fields = {f.name for f in attrs.fields(cls)} if attrs.has(cls) else set()
    for base in cls.__mro__:
        if not base.__module__.startswith("beatloop") or (base is not cls and base in public):
            continue
        for name, member in vars(base).items():
            if name.startswith("_") or name in seen or name in fields:
                continue
            seen.add(name)
            if isinstance(member, property):
                lines.append(f"property {name}")
            elif isinstance(member, classmethod | staticmethod):
                kind = type(member).__name__
                lines.append(f"{kind} {name}{_signature(getattr(cls, name))}")
            elif inspect.isfunction(member):
                lines.append(f"method {name}{_signature(member)}")
            elif isinstance(member, type):
                lines.append(f"class {name}")
            else:
                lines.append(f"attribute {name} = {_value(member)}")
    return sorted(lines)


def describe_name(name: str, obj, public: set[type]) -> list[str]:
    """The lines of one public name: its own, then its fields and members indented
    (``public``: the public classes, whose members their own lines record)."""
    if inspect.ismodule(obj):
        return [f"{name}: module"]
    if isinstance(obj, type):
        bases = ", ".join(base.__name__ for base in obj.__bases__)
        lines = [f"{name}: {_kind(obj)}({bases}) {obj.__name__}{_signature(obj)}"]
        if attrs.has(obj):
            lines += [f"    {_field(obj, field)}" for field in attrs.fields(obj)]
        if issubclass(obj, enum.Enum):
            lines += [f"    member {member.name} = {member.value!r}" for member in obj]
        else:
            lines += [f"    {line}" for line in _own_members(obj, public)]
        return lines
    if callable(obj):
        return [f"{name}: function{_signature(obj)}"]
    return [f"{name}: {_value(obj)}"]


def describe() -> list[str]:
    """The whole surface, in a stable order."""
    import importlib

    import beatloop
    from beatloop import moved
    from beatloop.plugins import hookspecs

    lines = [f"version {beatloop.__version__}", f"entry point group: {hookspecs.ENTRY_POINT_GROUP}"]
    modules = {
        name: importlib.import_module(name) for name in ("beatloop", *beatloop.PUBLIC_MODULES)
    }
    names = {
        (module, name): getattr(module, name)
        for module in modules.values()
        for name in module.__all__
    }
    public = {obj for obj in names.values() if isinstance(obj, type)}
    for module_name, module in modules.items():
        lines.append(f"module {module_name}")
        for name in sorted(module.__all__):
            lines += [f"  {line}" for line in describe_name(name, names[module, name], public)]
    lines.append(f"plugin disabling variable: {hookspecs.DISABLE_AUTOLOAD}")
    for name, function in sorted(vars(hookspecs).items()):
        if name.startswith("register_") and callable(function):
            lines.append(f"hook {name}{_signature(function)}")
    for entry in moved.MODULES:
        lines.append(
            f"deprecated module {entry.old} -> {entry.new} (removed in {entry.removed_in})"
        )
    for entry in moved.NAMES:
        lines.append(f"deprecated name {entry.old} -> {entry.new} (removed in {entry.removed_in})")
    return lines


if __name__ == "__main__":
    text = "\n".join(describe()) + "\n"
    if sys.argv[1:] == ["--write"]:
        RECORD.write_text(text, encoding="utf-8")
        print(f"wrote {RECORD} ({text.count(chr(10))} lines)")
    else:
        sys.stdout.write(text)
