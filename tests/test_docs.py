"""The documentation: the site builds with ``mkdocs build --strict`` (no broken link or
reference), its generated tables list everything the code has and are current in the
Markdown, and every ```python block of the README and the docs pages is run by a test."""

from __future__ import annotations

import ast
import html
import importlib
import importlib.util
import inspect
import logging
import re
import tempfile
from collections.abc import Callable
from types import SimpleNamespace

import attrs
import pytest
from helpers import DOCUMENTS, ROOT, python_blocks

import beatloop
from beatloop.core.events.callbacks import EVENTS, Callback
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry

README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: Blocks run by a test that checks their results too, by a marker in their code.
RUN_ELSEWHERE = {
    "class Autoencoder": "test_readme.py::test_write_your_own_recipe_block_runs",
    "class Distill": "test_readme.py::test_models_the_user_supplies_block_runs",
    "class CodeAndClass": "test_readme.py::test_the_plugin_guides_group_block_runs",
    "divergence=divergence": "test_readme.py::test_the_nan_guard_block_prints_what_the_page_shows",
    "class SimClr": (
        "test_all_gather.py::test_nt_xent_with_the_gather_under_a_mirrored_strategy_equals_one_"
        "device"
    ),
    "class Maml": (
        "test_forward_docs.py::test_the_maml_block_trains_like_a_hand_written_second_order_"
        "maml_loop"
    ),
    "beatloop.tune(": (
        "test_tune.py::test_a_four_trial_study_on_two_jobs_finishes_and_its_best_trial_replays_"
        "bit_for_bit"
    ),
    'run_dir="runs/digits",': "test_mlflow.py::test_the_tracking_page_block_runs",
    '"runs/finetune"': (
        "test_mlflow.py::test_the_fine_tuning_page_runs_and_its_run_dir_serves_the_shell"
    ),
    "by_beatloop": "test_sparse_updates.py::test_the_schedules_page_block_prints_what_it_shows",
    "class Dcgan": (
        "test_groups.py::test_simultaneous_gan_and_the_readme_recipe_match_the_tutorials_"
        "hand_written_step"
    ),
}


def run_elsewhere(block) -> str | None:
    tests = [test for marker, test in RUN_ELSEWHERE.items() if marker in block.code]
    assert len(tests) <= 1, f"{block.name} matches several markers"
    return tests[0] if tests else None


BLOCKS = python_blocks()
RUN_HERE = [block for block in BLOCKS if block.not_run is None and run_elsewhere(block) is None]


@pytest.fixture(scope="module")
def page_dirs() -> dict:
    """Each document's working directory, once its first block has run, and the names of
    the blocks run in it so far."""
    return {}


@pytest.mark.parametrize("block", RUN_HERE, ids=[block.name for block in RUN_HERE])
def test_python_block_runs(block, page_dirs, tmp_path_factory, monkeypatch):
    """Each block runs in a fresh namespace (a recipe it registers is not left behind for
    the other tests), in its document's own working directory under the tests' tmp dir,
    where ``tempfile`` makes its folders too: what a block writes never lands in the
    checkout. A document's blocks share that directory and run in the document's order,
    as a reader would run them (the data sources page writes images in one block and
    reads them in the next); a block run alone first runs the ones before it."""
    if block.document not in page_dirs:
        page_dirs[block.document] = (tmp_path_factory.mktemp(block.document.stem), set())
    directory, done = page_dirs[block.document]
    monkeypatch.chdir(directory)
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    earlier = [b for b in RUN_HERE if b.document == block.document and b.line < block.line]
    for each in [b for b in earlier if b.name not in done] + [block]:
        monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))
        each.run({})
        done.add(each.name)


def test_every_python_block_is_run_or_says_why_not():
    """Every ```python fence is one block found (none written in another form slips past),
    each is run here or by the named test, and a block not run says why."""
    lines = [line for document in DOCUMENTS for line in document.read_text().split("\n")]
    fences = sum(line.startswith("```py") for line in lines)
    assert fences == len(BLOCKS)
    for block in BLOCKS:
        test = run_elsewhere(block)
        if test is not None:
            module, name = test.split("::")
            assert f"def {name}(" in (ROOT / "tests" / module).read_text(), test
        if block.not_run is not None:
            assert test is None and len(block.not_run.split()) >= 3, block.name
    not_run = [block.name for block in BLOCKS if block.not_run is not None]
    assert len(not_run) <= 3, f"keep the blocks that are not run few: {not_run}"
    assert [block for block in BLOCKS if block.document == README and block.not_run is None]


def test_every_python_block_parses():
    for block in BLOCKS:
        ast.parse(block.code, block.name)


def test_readme_is_short_keeps_the_setup_commands_and_its_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert re.search(r"^# 1\. install.*\n.*beatloop run supervised", text, re.M)
    assert re.search(r"^# 2\. install.*\n.*pytest", text, re.M)
    links = re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", text)
    assert {"docs/recipes.md", "docs/callbacks.md", "docs/api.md"} <= set(links)
    assert [link for link in links if not (ROOT / link).is_file()] == []


# The generated sections, written into the Markdown between begin/end markers.


def load_hooks():
    """``docs/hooks.py`` as a module (``docs`` is not a package)."""
    spec = importlib.util.spec_from_file_location("beatloop_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()


def test_the_generated_sections_are_current():
    """The tables and help written into the pages are what the code generates now, and
    every page that should have one has it."""
    stale = {path.name: hooks.stale_sections(path.read_text()) for path in hooks.pages()}
    stale = {name: keys for name, keys in stale.items() if keys}
    assert stale == {}, f"stale generated sections {stale}: run `{hooks.COMMAND}`"
    keys = {
        path.name: [match["key"] for match in hooks.SECTION.finditer(path.read_text())]
        for path in hooks.pages()
    }
    recipes = Registry(load_entry_points=False).recipe_names()
    assert sorted(keys["recipes.md"]) == [f"config {name}" for name in sorted(recipes)]
    assert keys["callbacks.md"] == ["callback-events"] and keys["cli.md"] == ["cli-help"]
    assert hooks.COMMAND in README.read_text()


@attrs.frozen
class _Resolved:
    weight: Callable[..., float] | None = None


def test_a_config_table_shows_types_as_written_also_once_they_are_resolved():
    """Code that resolves a Config's types (``attrs.resolve_types``) turns ``field.type``
    from the annotation's text into the type: the table keeps the text."""
    attrs.resolve_types(_Resolved)
    field = attrs.fields(_Resolved).weight
    assert not isinstance(field.type, str)
    assert hooks._written_type(_Resolved, field) == "Callable[..., float] | None"


def test_a_stale_section_is_found_rewritten_and_warned_about(caplog):
    text = (DOCS / "callbacks.md").read_text()
    stale = text.replace("| `fit_end` |", "| `fit_ended` |")
    assert stale != text and hooks.stale_sections(stale) == ["callback-events"]
    assert hooks.regenerate(stale) == text
    page = SimpleNamespace(file=SimpleNamespace(src_path="callbacks.md"))
    with caplog.at_level(logging.WARNING):
        assert hooks.on_page_markdown(stale, page=page) == stale
    (record,) = caplog.records
    message = "callbacks.md: section 'callback-events' is stale: run python docs/hooks.py"
    assert record.getMessage() == message and record.name.startswith("mkdocs.")


def test_help_printed_by_another_python_is_not_checked_here():
    """argparse lays help out differently from one Python to the next: only the Python
    that wrote the help can check it."""
    text = (DOCS / "cli.md").read_text()
    (written,) = hooks.ARGPARSE_OF.findall(text)
    other = text.replace(f"argparse of Python {written} ", "argparse of Python 2.7 ")
    changed = other.replace("usage: beatloop [-h]", "usage: beatloop [-h] [--old]")
    assert hooks.stale_sections(changed) == []
    stale = text.replace("usage: beatloop [-h]", "usage: old")
    assert hooks.stale_sections(stale) == ["cli-help"]


# The site, built once for the tests below.


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """``mkdocs build --strict``, in this process (TensorFlow is imported once): any
    warning, a broken link or an unresolved API reference among them, fails the build."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    site_dir = tmp_path_factory.mktemp("site")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NO_MKDOCS_2_WARNING", "1")
        config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(site_dir), strict=True)
        build(config)
    return site_dir


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def tables(page: str) -> list[list[list[str]]]:
    """Each table of a built page: its body rows, each a list of cell texts."""
    found = []
    for table in re.findall(r"<table>(.*?)</table>", page, re.S):
        body = table.split("<tbody>", 1)[1]
        rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
        found.append([[text_of(c) for c in re.findall(r"<td>(.*?)</td>", r, re.S)] for r in rows])
    return found


def test_the_site_builds_with_every_page_in_its_nav(site):
    nav_pages = re.findall(r"^  - [^:]+: ([\w-]+)\.md$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav_pages) == sorted(path.stem for path in DOCS.glob("*.md"))
    for page in nav_pages:
        assert (site / f"{page}.html").is_file()
    assert not (site / "hooks.py").exists()
    assert (site / "stylesheets" / "extra.css").is_file()
    assert 'href="stylesheets/extra.css"' in (site / "index.html").read_text()


def test_no_page_prints_a_sphinx_role(site):
    """Docstrings are Markdown here: a ``:func:`x``` would reach the page as literal text."""
    role = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|exc|data|obj|const|ref|term):")
    found = {
        page.name: sorted(set(role.findall(text_of(page.read_text()))))
        for page in sorted(site.glob("*.html"))
    }
    assert {name: roles for name, roles in found.items() if roles} == {}


def test_each_recipe_table_lists_every_config_field(site):
    """The tables are generated from each recipe's attrs Config, so they cannot go stale;
    this checks the generation and that every built-in recipe has its table."""
    page = (site / "recipes.html").read_text()
    registry = Registry(load_entry_points=False)
    for name in registry.recipe_names():
        section = page.split(f'<h2 id="{name}">', 1)[1].split("<h2 ", 1)[0]
        (table, *_) = tables(section)
        fields = attrs.fields(registry.recipe(name).cls.Config)
        assert [row[0] for row in table] == [field.name for field in fields], name
        for row, field in zip(table, fields, strict=True):
            default = "(required)" if field.default is attrs.NOTHING else repr(field.default)
            assert row[2] == default and row[3] == field.metadata["doc"], (name, field.name)
            assert field.metadata["doc"].strip(), (name, field.name)


def test_the_callbacks_page_gives_every_event_its_signature_and_the_epoch_numbering(site):
    page = (site / "callbacks.html").read_text()
    (events, *_) = tables(page)
    assert [row[0] for row in events] == list(EVENTS)
    for row, event in zip(events, EVENTS, strict=True):
        method = getattr(Callback, f"on_{event}")
        assert row[1].startswith(f"on_{event}(self, run: Run")
        assert list(inspect.signature(method).parameters) == re.findall(
            r"(\w+)(?::[^,)]*)?[,)]", row[1].split("->")[0]
        )
        assert row[2] == " ".join(inspect.getdoc(method).split()).replace("``", "")
    text = text_of(page)
    assert "counts from 0" in text and "count from 1" in text


def test_the_api_reference_has_everything_beatloop_exports(site):
    """Every public name (``beatloop.__all__`` and each public module's) is referenced by
    its public path, and rendered."""
    source = (DOCS / "api.md").read_text()
    referenced = re.findall(r"^::: ([\w.]+)$", source, re.M)
    public = [f"beatloop.{name}" for name in beatloop.__all__]  # public paths only
    for module_name in beatloop.PUBLIC_MODULES:
        public += [f"{module_name}.{name}" for name in importlib.import_module(module_name).__all__]
    assert sorted(referenced) == sorted(public)
    page = (site / "api.html").read_text()
    for path in public:
        assert f'id="{path}"' in page, path
    # beatloop.recipes, the function (rendered as its object, headed by its public name)
    after = page.split('id="beatloop.recipes"', 1)[1]
    assert re.match(
        r'></a>(</p>)?\s*<div class="doc doc-object doc-function">\s*<h3 id="[\w.]+"', after
    )
    heading, said = after.split("</h3>", 1)
    assert text_of(heading.split(">", 3)[3]).split()[0] == "beatloop.recipes"
    assert said.split("</p>", 1)[0].endswith("Sorted names of every registered recipe.")


def test_the_command_line_page_has_every_commands_help(site):
    page = text_of((site / "cli.html").read_text())
    for command in ("list", "show", "run", "compare", "export", "evaluate", "data"):
        assert f"usage: beatloop {command} " in page, command
    assert "exit codes:" in page
