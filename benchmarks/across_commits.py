"""One benchmark script run on two checkouts of beatloop, interleaved: did a change move
the ratios more than the noise?

Both sides run *this* checkout's copy of the script; only the ``beatloop`` they import
differs (``PYTHONPATH`` points at each checkout). Runs alternate old/new, the order
swapped each round. Every ratio a script prints (``0.96x``; targets such as ``>= 1.00x``
are left out) is collected per run; the table gives each side's median and spread and
the change of the medians.

    git worktree add ../beatloop-old HEAD~1
    python benchmarks/across_commits.py --old ../beatloop-old --rounds 3 \\
        gan_step.py --repeats 2
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from common import spread

HERE = Path(__file__).resolve().parent
RATIO = re.compile(r"(?<!>= )(?<![\d.])(\d+\.\d+)x\b")
FIGURE = re.compile(r"±?[\d,]*\.?\d+%?x?")


def ratios(output: str) -> dict[str, list[float]]:
    """Each printed line holding ratios, by its label: its words before the first
    figure (a number, a spread, a ratio)."""
    found = {}
    for line in output.splitlines():
        values = [float(v) for v in RATIO.findall(line)]
        if values:
            words = line[: RATIO.search(line).start()].split()
            label = []
            for word in words:
                if FIGURE.fullmatch(word):
                    break
                label.append(word)
            found[" ".join(label)] = values
    return found


def run(checkout: Path, script: str, arguments: list[str]) -> dict[str, list[float]]:
    environment = {**os.environ, "PYTHONPATH": str(checkout), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, str(HERE / script), *arguments],
        cwd=HERE, env=environment, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"{script} failed on {checkout}:\n{done.stderr[-3000:]}")
    return ratios(done.stdout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the other checkout")
    parser.add_argument("--new", type=Path, default=HERE.parent, help="default: this one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("script", help="a script in benchmarks/, e.g. gan_step.py")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="passed to the script")
    args = parser.parse_args(argv)
    sides = {"old": args.old.resolve(), "new": args.new.resolve()}
    collected: dict[str, dict[str, list[list[float]]]] = {"old": {}, "new": {}}
    for round_ in range(args.rounds):
        order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
        for side in order:
            for label, values in run(sides[side], args.script, args.arguments).items():
                collected[side].setdefault(label, []).append(values)
            print(f"round {round_ + 1}/{args.rounds}: {side} done", file=sys.stderr, flush=True)
    print(f"\n{args.script} {' '.join(args.arguments)}: {args.rounds} run(s) a side, interleaved")
    print(f"old: {sides['old']}\nnew: {sides['new']}")
    print(f"{'ratio':<52}{'old':>16}{'new':>16}{'new/old':>10}")
    for label, runs in collected["new"].items():
        for column in range(len(runs[0])):
            new = [values[column] for values in runs]
            old = [values[column] for values in collected["old"].get(label, [])]
            if not old:
                continue
            name = label if len(runs[0]) == 1 else f"{label} [{column + 1}]"
            change = statistics.median(new) / statistics.median(old)
            print(
                f"{name[:51]:<52}{statistics.median(old):>9.2f}x {spread(old):<5}"
                f"{statistics.median(new):>9.2f}x {spread(new):<5}{change:>9.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
