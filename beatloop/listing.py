"""What ``beatloop list`` prints, and its cache: read back without loading plugins or
importing TensorFlow while nothing that could change it has changed.

The key holds beatloop's version and the stamps (size, modification time) of its source
files, every installed distribution's name and version, each ``beatloop`` entry point
with its distribution's RECORD and the stamps of its module's files, the plugin
autoload switch and the Python version. The cache is one JSON file per Python
environment, written whole (temporary file, then rename); one that cannot be read or
written is passed over: the listing is then computed as without a cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import attrs

from beatloop import __version__
from beatloop.files import CACHE_DIR as CACHE_DIR  # the variable, named where tests read it
from beatloop.files import cache_dir
from beatloop.plugins.hookspecs import DISABLE_AUTOLOAD, ENTRY_POINT_GROUP

#: Bumped when the file's layout changes, so an older file is a miss (2: each recipe's
#: quality figure).
FORMAT = 2
#: At most this many files of one plugin are stamped (a large package: the rest unstamped).
MAX_PLUGIN_FILES = 2000


def _pair(value) -> tuple[str, str] | None:
    """A quality figure as a tuple (JSON gives a list)."""
    return None if value is None else (str(value[0]), str(value[1]))


def quality_words(quality: tuple[str, str] | None) -> str:
    """A recipe's quality figure (what ``tune`` optimises and ``run --keep-best
    quality`` keeps by default) as ``list --verbose`` and ``show`` print it."""
    if quality is None:
        return "none declared (tune needs --objective, --keep-best a FIGURE:MODE)"
    figure, mode = quality
    return f"{figure}:{mode} ({'higher' if mode == 'max' else 'lower'} is better)"


@attrs.frozen
class Listed:
    """A registered recipe, callback or data source as ``list`` shows it."""

    name: str
    module: str
    qualname: str
    origin: str  # "built-in", a distribution name, or "registered in <module>"
    plugin: str
    description: str = ""  # recipes only: the first line of the class docstring
    #: Recipes only: its ``quality_figure``, ``(figure, "min" or "max")``, or ``None``.
    quality: tuple[str, str] | None = attrs.field(default=None, converter=_pair)


@attrs.frozen
class Failure:
    """A plugin that could not be loaded, as the registry reported it."""

    plugin: str
    origin: str
    error: str

    @property
    def message(self) -> str:
        """The registry's warning for it (``Registry._fail``)."""
        return f"beatloop plugin {self.plugin!r} ({self.origin}) was not loaded: {self.error}"


@attrs.frozen
class Listing:
    """Everything ``list`` and ``list --verbose`` print, as plain strings."""

    recipes: tuple[Listed, ...]
    callbacks: tuple[Listed, ...]
    sources: tuple[Listed, ...]
    failures: tuple[Failure, ...]
    environments: tuple[Listed, ...] = ()
    #: The registry's warning for each name several plugins registered (none usable).
    conflicts: tuple[str, ...] = ()

    @classmethod
    def of(cls, registry) -> Listing:
        """The listing of a filled ``Registry``."""

        def listed(table, recipes=False):
            return tuple(
                Listed(
                    name,
                    entry.cls.__module__,
                    entry.cls.__qualname__,
                    entry.origin,
                    entry.plugin,
                    entry.cls.description() if recipes else "",
                    entry.cls.quality_figure if recipes else None,
                )
                for name, entry in sorted(table.items())
            )

        return cls(
            recipes=listed(registry.recipes, recipes=True),
            callbacks=listed(registry.callbacks),
            sources=listed(registry.sources),
            environments=listed(registry.environments),
            failures=tuple(Failure(f.plugin, f.origin, f.error) for f in registry.failures),
            conflicts=tuple(conflict.message for conflict in registry.conflicts.values()),
        )

    def lines(self, verbose: bool) -> list[str]:
        """The lines ``list`` prints (``verbose``: modules, plugins, callbacks, data
        sources, environments, failed plugins and names several plugins registered too)."""
        width = max((len(r.name) for r in self.recipes), default=4)
        lines = []
        for recipe in self.recipes:
            lines.append(f"{recipe.name:<{width}}  {recipe.description}  [{recipe.origin}]")
            if verbose:
                lines.append(f"{'':<{width}}    module: {recipe.module}  plugin: {recipe.plugin}")
                lines.append(f"{'':<{width}}    quality figure: {quality_words(recipe.quality)}")
        if verbose:
            for kind, table in (
                ("callback", self.callbacks),
                ("data source", self.sources),
                ("environment", self.environments),
            ):
                lines += [f"{kind} {e.name}: {e.module}.{e.qualname} [{e.origin}]" for e in table]
            lines += [f"failed plugin {f.plugin} [{f.origin}]: {f.error}" for f in self.failures]
            lines += [f"conflict: {message}" for message in self.conflicts]
        return lines

    def to_json(self) -> dict:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Listing:
        """The listing a cache file holds; a ``KeyError`` for a recipe without its
        ``quality`` (a file of an older layout: a miss, never a listing lacking it)."""
        if any("quality" not in item for item in data["recipes"]):
            raise KeyError("quality")
        return cls(
            recipes=tuple(Listed(**item) for item in data["recipes"]),
            callbacks=tuple(Listed(**item) for item in data["callbacks"]),
            sources=tuple(Listed(**item) for item in data["sources"]),
            environments=tuple(Listed(**item) for item in data.get("environments", ())),
            failures=tuple(Failure(**item) for item in data["failures"]),
            conflicts=tuple(data.get("conflicts", ())),
        )


# -- the key ----------------------------------------------------------------------------


def cache_key() -> dict | None:
    """What the listing depends on, read without importing any plugin (``importlib``'s
    metadata and ``find_spec`` of top-level modules, file stamps); ``None`` when it
    cannot be read (a broken distribution's metadata): no cache then."""
    try:
        return _key()
    except Exception:  # the cache must never be why the command fails
        return None


def _key() -> dict:
    installed = sorted({_name_and_version(d) for d in importlib.metadata.distributions()})
    plugins = sorted(
        [
            entry_point.name,
            entry_point.value,
            entry_point.dist.name if entry_point.dist else "",
            entry_point.dist.version if entry_point.dist else "",
            _digest(entry_point.dist.read_text("RECORD") or "") if entry_point.dist else "",
            _module_stamp(entry_point.module),
        ]
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    )
    return {
        "format": FORMAT,
        "beatloop": __version__,
        "beatloop_files": _tree_stamp(Path(__file__).resolve().parent, limit=None),
        "python": sys.version,
        "autoload": os.environ.get(DISABLE_AUTOLOAD, ""),
        "installed": [list(item) for item in installed],
        "plugins": plugins,
    }


def _name_and_version(distribution: importlib.metadata.Distribution) -> tuple[str, str]:
    """The ``Name`` and ``Version`` headers of a distribution's metadata, read from its
    header lines (``Distribution.name`` and ``.version`` parse the whole file as an
    e-mail, which takes most of a cache hit's time with a hundred distributions)."""
    text = distribution.read_text("METADATA") or distribution.read_text("PKG-INFO") or ""
    found = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the end of the headers
        field, _, value = line.partition(":")
        if field in ("Name", "Version") and field not in found:
            found[field] = value.strip()
    return found.get("Name", ""), found.get("Version", "")


def _module_stamp(module: str) -> str:
    """The stamp of the files of ``module``'s top-level package (or module), found
    without importing it; empty when it cannot be found."""
    try:
        spec = importlib.util.find_spec(module.partition(".")[0])
    except (ImportError, ValueError):
        return ""
    if spec is None:
        return ""
    if spec.submodule_search_locations:
        return _digest(
            "".join(
                _tree_stamp(Path(location), limit=MAX_PLUGIN_FILES)
                for location in spec.submodule_search_locations
            )
        )
    return _digest(_stamps([Path(spec.origin)])) if spec.origin else ""


def _tree_stamp(root: Path, limit: int | None) -> str:
    """A digest of the path, size and modification time of every ``.py`` file under
    ``root`` (the first ``limit`` found)."""
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
        found += [Path(directory, name) for name in sorted(files) if name.endswith(".py")]
        if limit is not None and len(found) >= limit:
            found = found[:limit]
            break
    return _digest(str(root) + _stamps(found))


def _stamps(paths: list[Path]) -> str:
    lines = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        lines.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n")
    return "".join(lines)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


# -- the file ---------------------------------------------------------------------------


def cache_path() -> Path:
    """This Python environment's cache file (one per environment: environments sharing
    a cache directory do not overwrite each other's)."""
    environment = _digest(f"{sys.prefix}\n{sys.executable}")[:16]
    return cache_dir() / f"list-{environment}.json"


def read_cache(key: dict) -> Listing | None:
    """The cached listing if the file holds one for ``key``; ``None`` otherwise (no
    file, another key, or a file that cannot be read or understood)."""
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("key") != key:
            return None
        return Listing.from_json(data["listing"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cache(key: dict, listing: Listing) -> str | None:
    """Write ``listing`` for ``key``, whole or not at all; the reason when it could not
    be written (``None`` when it was)."""
    path = cache_path()
    text = json.dumps({"key": key, "listing": listing.to_json()}, indent=1)
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False
        ) as file:
            temporary = file.name
            file.write(text)
        os.replace(temporary, path)
    except (OSError, ValueError) as error:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        return f"{type(error).__name__}: {error}"
    return None
