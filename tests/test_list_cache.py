"""``beatloop list``'s cache: written on a miss, read on a hit without TensorFlow, redone
when what it depends on changes, passed over when it cannot be read or written."""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from helpers import BUILT_IN_RECIPES as BUILT_IN
from helpers import python_env

import beatloop.plugins.registry as registry_module
from beatloop import listing
from beatloop.cli import main


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    """A cache dir of the test's own, and no registry in this process yet, so ``main``
    goes through the cache as the command does (the registry the process had comes
    back after the test)."""
    monkeypatch.setenv(listing.CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setattr(registry_module, "_REGISTRY", None)
    return tmp_path / "cache"


def listed(capsys, *options: str) -> str:
    """The output of ``beatloop list OPTIONS`` in this process, as a new process sees it
    (no registry loaded yet)."""
    registry_module.reset_registry()
    assert main(["list", *options]) == 0
    return capsys.readouterr().out


def cache_file(cache: Path) -> Path:
    (path,) = cache.glob("list-*.json")
    return path


def test_a_miss_writes_the_cache_and_a_hit_prints_from_it(cache, capsys):
    computed = listed(capsys)
    assert [line.split()[0] for line in computed.splitlines()] == BUILT_IN
    path = cache_file(cache)
    data = json.loads(path.read_text())
    assert data["key"] == listing.cache_key()
    assert [recipe["name"] for recipe in data["listing"]["recipes"]] == BUILT_IN
    at = BUILT_IN.index("gan")
    gan = data["listing"]["recipes"][at]["description"]
    assert gan.startswith("Generative adversarial network")
    # What a hit prints comes from the file: a description changed there shows.
    data["listing"]["recipes"][at]["description"] = "read from the cache"
    path.write_text(json.dumps(data))
    assert listed(capsys) == computed.replace(gan, "read from the cache")
    # --refresh loads the plugins again and rewrites the file.
    assert listed(capsys, "--refresh") == computed
    assert json.loads(path.read_text())["listing"]["recipes"][at]["description"] == gan


def test_a_changed_key_recomputes(cache, capsys):
    computed = listed(capsys)
    path = cache_file(cache)
    data = json.loads(path.read_text())
    data["listing"]["recipes"][0]["description"] = "stale"
    data["key"]["installed"].append(["beatloop-uninstalled-since", "1.0"])
    path.write_text(json.dumps(data))
    assert listed(capsys) == computed
    assert json.loads(path.read_text())["key"] == listing.cache_key()


def test_a_registry_this_process_filled_is_listed_as_it_is_and_not_cached(cache, capsys):
    from beatloop.recipes.supervised import Supervised

    class Scripted(Supervised):
        """Registered from a script."""

        name = "scripted"

    registry_module.register(Scripted)  # fills this process's registry (the fixture's own)
    assert main(["list"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "scripted" in line)
    assert line.endswith(f"Registered from a script.  [registered in {__name__}]")
    assert not cache.exists()


def test_the_key_follows_beatloop_sources_and_the_autoload_switch(monkeypatch):
    key = listing.cache_key()
    assert key == listing.cache_key()
    source = Path(listing.__file__).parent / "recipes" / "gan.py"
    stat = source.stat()
    try:  # an editable install's source edited: no version changes, the key does
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        assert listing.cache_key()["beatloop_files"] != key["beatloop_files"]
    finally:
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert listing.cache_key() == key
    monkeypatch.setenv(registry_module.DISABLE_AUTOLOAD, "1")
    assert listing.cache_key() != key


@pytest.mark.parametrize(
    "content",
    ["not json {", "[]", '{"key": "other"}', "KEY_BUT_BROKEN_LISTING", b"\xff\xfe\x00"],
)
def test_a_corrupt_cache_is_recomputed_and_rewritten(cache, capsys, content):
    computed = listed(capsys)
    path = cache_file(cache)
    if content == "KEY_BUT_BROKEN_LISTING":
        content = json.dumps({"key": listing.cache_key(), "listing": {"recipes": 3}})
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    assert listing.read_cache(listing.cache_key()) is None
    assert listed(capsys) == computed
    assert listing.read_cache(listing.cache_key()) is not None


def test_an_unwritable_cache_dir_does_not_fail_the_command(cache, monkeypatch, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where the cache dir would be")
    monkeypatch.setenv(listing.CACHE_DIR, str(blocker / "cache"))
    out = listed(capsys)
    assert [line.split()[0] for line in out.splitlines()] == BUILT_IN
    registry_module.reset_registry()
    assert main(["list", "--verbose"]) == 0
    assert "beatloop: note: the list cache was not written: " in capsys.readouterr().err
    assert blocker.read_text() == "a file where the cache dir would be"


def test_the_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(listing.CACHE_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert listing.cache_dir() == tmp_path / "xdg" / "beatloop"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert listing.cache_dir() == Path.home() / ".cache" / "beatloop"
    monkeypatch.setenv(listing.CACHE_DIR, str(tmp_path / "mine"))
    assert listing.cache_path().parent == tmp_path / "mine"


def test_a_plugin_that_fails_to_load_is_one_warning_line_verbose_or_not(
    cache, capsys, monkeypatch, tmp_path
):
    # An installed distribution whose beatloop entry point names a module that is not there.
    info = tmp_path / "site" / "brokenplug-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[beatloop]\nbroken = brokenplug_absent\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    expected = (
        "beatloop: warning: beatloop plugin 'broken' (brokenplug) was not loaded: import "
        "failed: ModuleNotFoundError: No module named 'brokenplug_absent'"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # as a user's terminal shows them
        for options in (["--verbose"], ["--verbose"], []):  # a miss, then hits
            registry_module.reset_registry()
            assert main(["list", *options]) == 0
            out, err = capsys.readouterr()
            assert err.splitlines() == [expected], err
            assert "RuntimeWarning" not in err and "warn(" not in err
            assert ("failed plugin broken [brokenplug]" in out) == bool(options)
    assert cache_file(cache).exists()


# -- as a command, in new processes ----------------------------------------------------

LIST = (
    "import sys; from beatloop.cli import main; code = main(sys.argv[1:]); "
    "print('tensorflow imported:', 'tensorflow' in sys.modules); sys.exit(code)"
)


def beatloop_list(*options: str, **env: str) -> tuple[str, list[str]]:
    """``beatloop list OPTIONS`` in a new process: its stdout (ending with whether it
    imported TensorFlow) and its ``beatloop: warning:`` lines."""
    done = subprocess.run(
        [sys.executable, "-c", LIST, "list", *options],
        capture_output=True,
        text=True,
        timeout=300,
        env=python_env(**env),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("beatloop: warning")]
    return done.stdout, warnings


@pytest.mark.slow
def test_a_hit_prints_the_same_without_importing_tensorflow(tmp_path):
    miss, _ = beatloop_list("--verbose", BEATLOOP_CACHE_DIR=str(tmp_path))
    hit, _ = beatloop_list("--verbose", BEATLOOP_CACHE_DIR=str(tmp_path))
    assert miss.endswith("tensorflow imported: True\n") and "callback progress" in miss
    assert hit == miss.replace("tensorflow imported: True", "tensorflow imported: False")
    short, _ = beatloop_list(BEATLOOP_CACHE_DIR=str(tmp_path))
    assert short.splitlines() == [
        line for line in hit.splitlines() if line.split()[0] in BUILT_IN or "imported" in line
    ]


TINY = '''
"""A plugin adding a renamed supervised recipe."""
from beatloop.plugins.hookspecs import hookimpl
from beatloop.recipes.supervised import Supervised


class Tiny(Supervised):
    """{description}"""

    name = "tiny"


@hookimpl
def register_recipes():
    return [Tiny]
'''


@pytest.mark.slow
def test_installing_changing_and_removing_a_plugin_recomputes(tmp_path):
    # A distribution with two beatloop entry points, one that cannot be imported: a
    # dist-info folder and two modules on PYTHONPATH, as pip would lay them out.
    site = tmp_path / "site"
    info = site / "tinyplug-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[beatloop]\ntiny = tinyplug\nbroken = brokenplug\n")
    (site / "tinyplug.py").write_text(textwrap.dedent(TINY).format(description="First words."))
    (site / "brokenplug.py").write_text("raise ImportError('a dependency is missing')\n")
    env = {
        "BEATLOOP_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    installed, warned = beatloop_list(**env)
    assert "tiny            First words.  [tinyplug]" in installed
    assert installed.endswith("tensorflow imported: True\n")
    assert warned == [
        "beatloop: warning: beatloop plugin 'broken' (tinyplug) was not loaded: import "
        "failed: ImportError: a dependency is missing"
    ]
    # A hit: the same lines, the same warning, no TensorFlow.
    hit, hit_warned = beatloop_list(**env)
    assert hit.endswith("tensorflow imported: False\n")
    assert hit.splitlines()[:-1] == installed.splitlines()[:-1] and hit_warned == warned
    verbose, _ = beatloop_list("--verbose", **env)
    assert verbose.endswith("tensorflow imported: False\n")
    assert "module: tinyplug  plugin: tiny" in verbose
    assert "failed plugin broken [tinyplug]: import failed: ImportError" in verbose
    # The plugin's module edited (an editable install: no version changes).
    (site / "tinyplug.py").write_text(textwrap.dedent(TINY).format(description="Other words."))
    changed, _ = beatloop_list(**env)
    assert "tiny            Other words.  [tinyplug]" in changed
    assert changed.endswith("tensorflow imported: True\n")
    # Uninstalled.
    for path in info.iterdir():
        path.unlink()
    info.rmdir()
    removed, removed_warned = beatloop_list(**env)
    assert "tiny" not in removed and removed_warned == []
    assert [line.split()[0] for line in removed.splitlines()[:-1]] == BUILT_IN
