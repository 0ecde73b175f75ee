"""No test silently lost (or added): the tests collected per file equal the record in
``tests/collected.json``. A test removed or a parametrisation shrunk fails here until the
record is rewritten on purpose: ``python tests/test_suite_size.py --write``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from conftest import COLLECTED

TESTS = Path(__file__).resolve().parent
RECORD = TESTS / "collected.json"


def collected_in_a_fresh_process() -> dict[str, int]:
    """Every test file's count, from ``pytest --collect-only`` over the whole folder."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", str(TESTS)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=TESTS.parent,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    counts: dict[str, int] = {}
    for line in done.stdout.splitlines():
        found = re.match(r"(?:tests/)?(test_[\w]+\.py)::", line)
        if found:
            counts[found[1]] = counts.get(found[1], 0) + 1
    return counts


def collected(config) -> dict[str, int]:
    """This session's counts when it collected every test file whole, else a fresh count."""
    counts = config.stash.get(COLLECTED, {})
    files = {path.name for path in TESTS.glob("test_*.py")}
    whole = not any("::" in arg for arg in config.args)
    return counts if whole and set(counts) == files else collected_in_a_fresh_process()


def differences(found: dict[str, int], recorded: dict[str, int]) -> list[str]:
    """Each file whose count is not the recorded one, in words."""
    return [
        f"{name}: {recorded.get(name, 0)} recorded, {found.get(name, 0)} collected"
        for name in sorted(set(found) | set(recorded))
        if found.get(name, 0) != recorded.get(name, 0)
    ]


def test_the_comparison_sees_a_lost_test():
    assert differences({"test_a.py": 2}, {"test_a.py": 3, "test_b.py": 1}) == [
        "test_a.py: 3 recorded, 2 collected",
        "test_b.py: 1 recorded, 0 collected",
    ]


def test_every_recorded_test_is_collected(request):
    recorded = json.loads(RECORD.read_text())
    found = collected(request.config)
    assert sum(found.values()) > 0
    assert differences(found, recorded) == [], (
        "the tests collected differ from tests/collected.json; if on purpose, rewrite it: "
        "python tests/test_suite_size.py --write"
    )


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    counts = collected_in_a_fresh_process()
    RECORD.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
    print(f"{sum(counts.values())} tests in {len(counts)} files written to {RECORD}")
