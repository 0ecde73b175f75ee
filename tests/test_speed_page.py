"""The speed page stays a page of today's figures, and the benchmarks keep their index:
``docs/speed.md`` is short, every script in ``benchmarks/`` has its row in
``benchmarks/README.md`` and its figures on a docs page, and the speed page's sections
that other files cite by name are still there."""

from __future__ import annotations

import re

from helpers import ROOT

SPEED = ROOT / "docs" / "speed.md"
BENCHMARKS = ROOT / "benchmarks"
#: Scripts that measure nothing themselves: their rows say so instead of giving a figure.
HELPERS = {"common.py", "across_commits.py"}


def index_rows() -> dict[str, list[str]]:
    """``benchmarks/README.md``'s table: each row's cells, by the script it names."""
    rows = {}
    for line in (BENCHMARKS / "README.md").read_text().splitlines():
        match = re.match(r"^\| `([\w.]+\.py)` \|(.*)\|$", line)
        if match:
            assert match[1] not in rows, f"two rows for {match[1]}"
            rows[match[1]] = [cell.strip() for cell in match[2].split(" | ")]
    return rows


def test_the_speed_page_holds_todays_figures_in_at_most_300_lines():
    assert len(SPEED.read_text().splitlines()) <= 300


def test_every_benchmark_script_has_one_row_in_the_index_and_no_row_is_stale():
    scripts = {path.name for path in BENCHMARKS.glob("*.py")}
    rows = index_rows()
    assert sorted(scripts - rows.keys()) == [], "scripts without a row in benchmarks/README.md"
    assert sorted(rows.keys() - scripts) == [], "rows for scripts that no longer exist"
    for script, (measures, figure, command) in rows.items():
        assert measures and figure and command, script
        if script in HELPERS:
            assert measures.startswith("helper"), script
        else:
            assert command.startswith(f"`python benchmarks/{script}"), script


def test_every_benchmark_scripts_figures_are_on_a_docs_page():
    """A script that measures something is named on a page that gives its figures."""
    docs = " ".join(path.read_text() for path in (ROOT / "docs").glob("*.md"))
    unnamed = [
        path.name
        for path in sorted(BENCHMARKS.glob("*.py"))
        if path.name != "common.py" and path.name not in docs
    ]
    assert unnamed == []


def test_the_sections_other_files_cite_by_name_are_on_the_speed_page():
    """A file citing a heading of the speed page by name, in double quotes after the page's
    path on the same line, finds that heading (or a heading ending so) there."""
    headings = [h.lower() for h in re.findall(r"^#+ (.+)$", SPEED.read_text(), re.M)]
    cited = {}
    for folder in ("beatloop", "benchmarks", "docs", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for line in path.read_text().splitlines():
                if "docs/speed.md" in line:
                    after = line.split("docs/speed.md", 1)[1]
                    for name in re.findall(r'"([^"]+)"', after):
                        cited[name] = path.relative_to(ROOT)
    assert "Many devices: the equivalence matrix" in cited  # the scan finds the citations
    missing = {
        name: str(path)
        for name, path in cited.items()
        if not any(h.endswith(name.lower()) for h in headings)
    }
    assert missing == {}
