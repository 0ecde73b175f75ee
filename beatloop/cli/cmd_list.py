"""``beatloop list``: the registered recipes (``-v``: modules, plugins, quality figures,
callbacks, data sources, failures), from the list cache while its key holds."""

from __future__ import annotations

import sys

from beatloop.cli.options import command_parser

NAME = "list"


def add_command(commands) -> None:
    command_parser(
        commands,
        NAME,
        help="registered recipes and where they come from (-v: modules, plugins, quality "
        "figures, callbacks, data sources, environments, failures); read from a cache while "
        "nothing installed has changed",
    ).add_argument(
        "--refresh",
        action="store_true",
        help="load every plugin and rewrite the cache, even if nothing seems to have changed",
    )


def run(args) -> int:
    """Print the registered recipes (``-v``: and more) from the cache when its key still
    holds; otherwise load the plugins (TensorFlow too) and rewrite the cache. A registry
    this process has already filled is listed as it is (it may hold registrations of
    its own), and neither read from nor written to the cache."""
    from beatloop import listing
    from beatloop.terminal import warning_line

    module = sys.modules.get("beatloop.plugins.registry")
    loaded = module.loaded_registry() if module is not None else None
    if loaded is not None:
        found = listing.Listing.of(loaded)
    else:
        key = listing.cache_key()
        found = None if args.refresh or key is None else listing.read_cache(key)
        if found is None:
            found = _loaded(args, key)
        else:  # the warnings loading the plugins gave, one line each as they came
            for failure in found.failures:
                print(warning_line(failure.message), file=sys.stderr)
            for message in found.conflicts:
                print(warning_line(message), file=sys.stderr)
    for line in found.lines(args.verbose):
        print(line)
    return 0


def _loaded(args, key):
    """The listing of the plugins loaded now (each one that fails to load a one-line
    warning), written to the cache under ``key``."""
    from beatloop import listing
    from beatloop.terminal import import_tensorflow_quietly, one_line_warnings

    if not args.verbose:
        import_tensorflow_quietly()
    with one_line_warnings():
        from beatloop.plugins.registry import registry

        found = listing.Listing.of(registry())
    problem = "its key could not be read"
    if key is not None:
        problem = listing.write_cache(key, found)
    if problem is not None and args.verbose:
        print(f"beatloop: note: the list cache was not written: {problem}", file=sys.stderr)
    return found
