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
    """Each kind's lines (``kind``: that one only), a plugin's marked with its origin;
    for every kind, the paragraph on the parameters they share first, once."""
    from beatloop.core.data.source import SourceConfig
    from beatloop.named_data.load import describe_source, shared_parameters
    from beatloop.plugins.registry import registry

    reg = registry()
    names = reg.source_names() if kind is None else [reg.source(kind).name]
    entries = [reg.sources[name] for name in names]
    once = kind is None and any(issubclass(e.cls.Config, SourceConfig) for e in entries)
    described = [shared_parameters()] if once else []
    for entry in entries:
        lines = describe_source(entry.cls, shared=not once)
        lines[0] += "" if entry.origin == "built-in" else f"  [{entry.origin}]"
        described.append(lines)
    return described
