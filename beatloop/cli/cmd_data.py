"""``beatloop data [KIND]``: the data source kinds ``--data KIND:PATH`` can name, and
each one's parameters (``--data-set NAME=VALUE``)."""

from __future__ import annotations

import argparse

from beatloop.cli.options import command_parser

NAME = "data"


class _DataHelp(argparse.Action):
    """``beatloop data --help``: the command's help, then every data source kind and its
    parameters (read from the registry only when asked: plugins load, TensorFlow too)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from beatloop.terminal import import_tensorflow_quietly

        import_tensorflow_quietly()
        print(parser.format_help())
        print("data source kinds (--data KIND:PATH --data-set NAME=VALUE):")
        for lines in source_descriptions(None):
            print("\n".join(f"  {line}" for line in lines))
        parser.exit()


def add_command(commands) -> None:
    sources = command_parser(
        commands,
        NAME,
        add_help=False,
        help="the data source kinds --data can name, and their parameters",
        description="List the data source kinds (--data KIND:PATH) and each one's "
        "parameters (--data-set NAME=VALUE), with type and default. Example: beatloop run "
        "gan --data folder:images/ --data-set image_size=28,28 --data-set color_mode=grayscale",
    )
    sources.add_argument("-h", "--help", action=_DataHelp, help="show this help and every kind")
    sources.add_argument("kind", nargs="?", default=None, help="one kind (default: every kind)")


def run(args) -> int:
    for index, lines in enumerate(source_descriptions(args.kind)):
        print(("\n" if index else "") + "\n".join(lines))
    return 0


def source_descriptions(kind: str | None) -> list[list[str]]:
    """Each kind's lines (``kind``: that one only), a plugin's marked with its origin."""
    from beatloop.plugins.registry import registry
    from beatloop.sources import describe_source

    reg = registry()
    names = reg.source_names() if kind is None else [reg.source(kind).name]
    described = []
    for name in names:
        entry = reg.sources[name]
        lines = describe_source(entry.cls)
        lines[0] += "" if entry.origin == "built-in" else f"  [{entry.origin}]"
        described.append(lines)
    return described
