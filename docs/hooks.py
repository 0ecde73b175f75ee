"""The pages' generated sections, and the MkDocs hook that checks them.

Some parts of the pages are generated from the code, so that they list everything it has.
They are written into the Markdown files themselves, between markers, so a page reads
complete in the checkout and on GitHub as well as in the built site:

    <!-- begin: config gan -->
    ...generated, do not edit...
    <!-- end: config gan -->

- ``config RECIPE``: every field of a built-in recipe's attrs ``Config`` (name, type,
  default, and the ``doc`` in the field's metadata);
- ``callback-events``: every event in ``beatloop.core.events.callbacks.EVENTS`` with its
  method's signature and what its docstring says about when it fires;
- ``cli-help``: what ``beatloop --help`` and each command's ``--help`` print;
- ``deprecated-paths``: every old module path and name ``beatloop.moved`` keeps working,
  with its new path and the release that removes it.

After changing a recipe's config, a callback event or the command line, rewrite them from
the repository root (``--check`` only lists the stale ones, and exits 1 if there are any):

    python docs/hooks.py
    python docs/hooks.py --check

When MkDocs builds the site, ``on_page_markdown`` compares each section with what the code
generates now: a stale one is a warning naming that command (``mkdocs build --strict``,
as the tests build it, fails on it), and the site shows the section as written.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import attrs

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
COMMAND = "python docs/hooks.py"

#: A generated section: its key (``config gan``), then its body, up to its end marker.
SECTION = re.compile(
    r"^<!-- begin: (?P<key>[\w-]+(?: \w+)?) -->\n(?P<body>.*?)^<!-- end: (?P=key) -->$",
    re.M | re.S,
)
#: The line that records which Python's argparse printed a ``cli-help`` section.
ARGPARSE_OF = re.compile(r"^<!-- argparse of Python (\d+\.\d+) -->$", re.M)

log = logging.getLogger("mkdocs.hooks.generated")


def _cell(text: str) -> str:
    """Table-safe text: no line breaks, and no bare pipes (they would split the cell)."""
    return " ".join(text.split()).replace("|", "&#124;")


def _code(text: str) -> str:
    return f"<code>{_cell(text).replace('<', '&lt;').replace('>', '&gt;')}</code>"


def config_class(recipe: str) -> type:
    """The attrs ``Config`` class of a built-in recipe, found by its registered name."""
    from beatloop.plugins.registry import Registry

    return Registry(load_entry_points=False).recipe(recipe).cls.Config


def _written_type(cls: type, field: attrs.Attribute) -> str:
    """A field's type as its class's source writes it: ``field.type`` is that text only
    until something resolves the class's types (``attrs.resolve_types``), the class's
    annotations stay as written."""
    for klass in cls.__mro__:
        written = inspect.get_annotations(klass).get(field.name)
        if written is not None:
            return written if isinstance(written, str) else inspect.formatannotation(written)
    return "" if field.type is None else inspect.formatannotation(field.type)


def config_table(recipe: str) -> str:
    """A Markdown table of every field of ``recipe``'s config."""
    rows = ["| field | type | default | what it sets |", "|---|---|---|---|"]
    config = config_class(recipe)
    for field in attrs.fields(config):
        kind = _written_type(config, field)
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
    from beatloop.core.events.callbacks import EVENTS, Callback

    rows = ["| event | method and signature | when it fires |", "|---|---|---|"]
    for event in EVENTS:
        method = getattr(Callback, f"on_{event}")
        signature = f"{method.__name__}{_signature(method)}"
        rows.append(f"| `{event}` | {_code(signature)} | {_cell(inspect.getdoc(method))} |")
    return "\n".join(rows)


@contextmanager
def _plain_terminal():
    """argparse wraps help to ``COLUMNS`` (78 here: a code box's width in the site) and, on
    newer Pythons, may colour it."""
    saved = {name: os.environ.get(name) for name in ("COLUMNS", "NO_COLOR", "FORCE_COLOR")}
    os.environ.update(COLUMNS="78", NO_COLOR="1")
    os.environ.pop("FORCE_COLOR", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def cli_help() -> str:
    """``beatloop --help`` and each command's ``--help``, as code blocks, after a line
    naming the Python whose argparse printed them (its layout changes between versions)."""
    import argparse

    from beatloop.cli import build_parser

    with _plain_terminal():
        parser = build_parser()
        (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parts = [("beatloop --help", parser.format_help())]
        parts += [
            (f"beatloop {name} --help", sub.format_help()) for name, sub in commands.choices.items()
        ]
    version = f"<!-- argparse of Python {sys.version_info.major}.{sys.version_info.minor} -->"
    blocks = [f"### `{title}`\n\n```text\n{text.rstrip()}\n```" for title, text in parts]
    return "\n\n".join([version, *blocks])


def deprecated_paths_table() -> str:
    """A Markdown table of every deprecated path: old, new, the release removing it."""
    from beatloop import moved

    rows = ["| old path | use instead | removed in |", "|---|---|---|"]
    for entry in (*moved.MODULES, *moved.NAMES):
        rows.append(f"| `{entry.old}` | `{entry.new}` | {entry.removed_in} |")
    return "\n".join(rows)


def generate(key: str) -> str:
    """The Markdown of the section named ``key`` (``config gan``, ``callback-events``, ...)."""
    kind, _, argument = key.partition(" ")
    generators: dict[str, Callable[[], str]] = {
        "config": lambda: config_table(argument),
        "callback-events": events_table,
        "cli-help": cli_help,
        "deprecated-paths": deprecated_paths_table,
    }
    if kind not in generators:
        raise KeyError(f"unknown generated section {key!r}: expected one of {sorted(generators)}")
    return generators[kind]()


def _body(text: str) -> str:
    return f"\n{text}\n\n"


def _current(key: str, body: str) -> bool:
    """Whether a section's written body is what the code generates now. Help printed by
    another Python's argparse is taken as current: only that Python can check it."""
    written = ARGPARSE_OF.search(body) if key == "cli-help" else None
    if written and written[1] != f"{sys.version_info.major}.{sys.version_info.minor}":
        return True
    return body == _body(generate(key))


def stale_sections(text: str) -> list[str]:
    """The keys of the sections of a page's ``text`` that differ from what the code makes."""
    return [
        match["key"]
        for match in SECTION.finditer(text)
        if not _current(*match.group("key", "body"))
    ]


def regenerate(text: str) -> str:
    """A page's ``text`` with each generated section written anew from the code."""
    return SECTION.sub(
        lambda match: (
            f"<!-- begin: {match['key']} -->\n{_body(generate(match['key']))}"
            f"<!-- end: {match['key']} -->"
        ),
        text,
    )


def pages() -> list[Path]:
    """Every page of the docs, in name order."""
    return sorted(DOCS.glob("*.md"))


#: Public names the reference cannot render by their path, with the object rendered under
#: that heading: ``beatloop.recipes`` (the function) is also the package of the built-in
#: recipes, which is what the path resolves to when the docs are built.
RENDERED_AS = {"beatloop.recipes": "beatloop.plugins.registry.recipes"}


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    """MkDocs hook: warn about each stale section (a failure under ``--strict``); render a
    ``::: NAME`` of ``RENDERED_AS`` as its object, headed and anchored by the public name."""
    for key in stale_sections(markdown):
        log.warning(f"{page.file.src_path}: section '{key}' is stale: run {COMMAND}")
    for public, rendered in RENDERED_AS.items():
        markdown = markdown.replace(
            f"\n::: {public}\n",
            f'\n<a id="{public}"></a>\n\n::: {rendered}\n    options:\n      heading: {public}\n',
        )
    return markdown


def main(argv: list[str]) -> int:
    """``python docs/hooks.py [--check]``: rewrite every page's stale sections, or list them."""
    sys.path.insert(0, str(ROOT))  # generate from this checkout's code
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    check = argv == ["--check"]
    if argv not in ([], ["--check"]):
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    stale = []
    for path in pages():
        text = path.read_text()
        keys = stale_sections(text)
        stale += [f"{path.relative_to(ROOT)}: {key}" for key in keys]
        if keys and not check:
            path.write_text(regenerate(text))
    done = "stale" if check else "rewritten"
    print("\n".join(f"{done}: {line}" for line in stale) or "every generated section is current")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
