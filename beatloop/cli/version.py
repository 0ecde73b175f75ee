"""``beatloop --version``: beatloop's, TensorFlow's, Keras's and Python's versions, read
from the installed distributions' metadata so that TensorFlow is not imported."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform

#: The distributions TensorFlow is installed as, in the order they are looked for.
TENSORFLOW_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-macos",
    "tensorflow-intel",
    "tf-nightly",
)


def versions() -> list[str]:
    """The lines ``--version`` prints: ``beatloop X.Y.Z`` first."""
    lines = [f"beatloop {_beatloop_version()}"]
    tensorflow = _first_installed(TENSORFLOW_DISTRIBUTIONS)
    if tensorflow is None:
        lines.append("TensorFlow: not installed")
    else:
        name, version = tensorflow
        lines.append(f"TensorFlow {version}" + ("" if name == "tensorflow" else f" ({name})"))
    keras = _first_installed(("keras",))
    lines.append("Keras: not installed" if keras is None else f"Keras {keras[1]}")
    lines.append(f"Python {platform.python_version()}")
    return lines


def _beatloop_version() -> str:
    """The installed distribution's version; a checkout that is not installed has the
    package's own ``__version__``."""
    try:
        return importlib.metadata.version("beatloop")
    except importlib.metadata.PackageNotFoundError:
        from beatloop import __version__

        return __version__


def _first_installed(names) -> tuple[str, str] | None:
    """The first of ``names`` that is installed, with its version."""
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


class VersionAction(argparse.Action):
    """``--version``: print the versions on standard output and exit 0."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("help", "show beatloop's, TensorFlow's and Keras's versions and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print("\n".join(versions()))
        parser.exit()
