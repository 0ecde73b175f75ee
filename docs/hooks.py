"""MkDocs hooks: tables generated from the code when the site is built, so they cannot go
stale. A page asks for one with a marker on a line of its own:

- ``<!-- config: RECIPE -->``: every field of a built-in recipe's attrs ``Config`` (name,
  type, default, and the ``doc`` in the field's metadata);
- ``<!-- callback-events -->``: every event in ``beatloop.core.callbacks.EVENTS`` with
  its method's signature and what its docstring says about when it fires;
- ``<!-- cli-help -->``: what ``beatloop --help`` and each command's ``--help`` print.
"""

from __future__ import annotations

import inspect
import re

import attrs

CONFIG_MARKER = re.compile(r"^<!-- config: (\w+) -->$", re.M)
EVENTS_MARKER = "<!-- callback-events -->"


def _cell(text: str) -> str:
    """Table-safe text: no line breaks, and no bare pipes (they would split the cell)."""
    return " ".join(text.split()).replace("|", "&#124;")


def _code(text: str) -> str:
    return f"<code>{_cell(text).replace('<', '&lt;').replace('>', '&gt;')}</code>"


def config_class(recipe: str) -> type:
    """The attrs ``Config`` class of a built-in recipe, found by its registered name."""
    from beatloop.plugins.registry import Registry

    return Registry(load_entry_points=False).recipe(recipe).cls.Config


def config_table(recipe: str) -> str:
    """A Markdown table of every field of ``recipe``'s config."""
    rows = ["| field | type | default | what it sets |", "|---|---|---|---|"]
    for field in attrs.fields(config_class(recipe)):
        kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
        default = "(required)" if field.default is attrs.NOTHING else repr(field.default)
        doc = field.metadata.get("doc", "")
        rows.append(f"| `{field.name}` | {_code(kind)} | {_code(default)} | {_cell(doc)} |")
    return "\n".join(rows)


def _signature(function) -> str:
    """``(self, run: Run, epoch: int) -> None``: the annotations as written, unquoted."""
    signature = inspect.signature(function)
    parameters = [
        name if p.annotation is p.empty else f"{name}: {p.annotation}"
        for name, p in signature.parameters.items()
    ]
    returns = signature.return_annotation
    return f"({', '.join(parameters)})" + ("" if returns is signature.empty else f" -> {returns}")


def events_table() -> str:
    """A Markdown table of every callback event: its method, signature and docstring."""
    from beatloop.core.callbacks import EVENTS, Callback

    rows = ["| event | method and signature | when it fires |", "|---|---|---|"]
    for event in EVENTS:
        method = getattr(Callback, f"on_{event}")
        signature = f"{method.__name__}{_signature(method)}"
        rows.append(f"| `{event}` | {_code(signature)} | {_cell(inspect.getdoc(method))} |")
    return "\n".join(rows)


CLI_MARKER = "<!-- cli-help -->"


def cli_help() -> str:
    """``beatloop --help`` and each command's ``--help``, as code blocks."""
    import argparse
    import os

    from beatloop.cli import _parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # the width argparse wraps help to
    try:
        parser = _parser()
        (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parts = [("beatloop --help", parser.format_help())]
        parts += [
            (f"beatloop {name} --help", sub.format_help()) for name, sub in commands.choices.items()
        ]
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return "\n\n".join(f"### `{title}`\n\n```text\n{text.rstrip()}\n```" for title, text in parts)


def on_page_markdown(markdown: str, **kwargs) -> str:
    markdown = CONFIG_MARKER.sub(lambda match: config_table(match[1]), markdown)
    if EVENTS_MARKER in markdown:
        markdown = markdown.replace(EVENTS_MARKER, events_table())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_help())
    return markdown
