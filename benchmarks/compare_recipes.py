"""Every built-in recipe side by side on its default data with the same budget, plus the
GAN at n_critic=1 and 5: steps/s, examples/s, peak memory, final losses and each
recipe's quality figure (medians of repeats, each run in its own process); writes the
table's figures as JSON and the loss curves as a PNG.

    python benchmarks/compare_recipes.py                 # 3 epochs, 3 repeats
    python benchmarks/compare_recipes.py --quick         # 1 epoch, 1 repeat
"""

from __future__ import annotations

import argparse
from pathlib import Path

from beatloop.compare import Entry, compare
from beatloop.compare_report import format_table

ENTRIES = [
    Entry("supervised"),
    Entry("gan", ("n_critic=1",)),
    Entry("gan", ("n_critic=5",)),
    Entry("style_transfer"),
    Entry("risk_weighted"),
    Entry("multitask"),
    Entry("multitask", ("schedule=alternating",)),
    Entry("contrastive"),
    Entry("contrastive", ("target=ema",)),
    Entry("meta"),
    Entry("dqn"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/compare-recipes"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.repeats = 1, 1
    rows = compare(ENTRIES, epochs=args.epochs, out=args.out, repeats=args.repeats)
    print(f"\n{args.epochs} epoch(s) each, median of {args.repeats} repeat(s)\n")
    print(format_table(rows))
    print(f"\nfigures: {args.out / 'compare.json'}  loss curves: {args.out / 'loss_curves.png'}")


if __name__ == "__main__":
    main()
