"""The ``parquet`` source beside the ``csv`` source on the same table: load time, rows per
second through one pass of the training pipeline, and peak memory, each run in a fresh
process.

The table: 20 float feature columns (6 significant digits) and an integer label, written
as a CSV, then read by pyarrow and written as Parquet (row groups of 100,000 rows), so
both files hold the very same values. A run loads the source (``label=label``,
``validation_fraction=0.1``: the scan, the hold-out), then reads one pass of its training
batches (the shuffle buffer of 10,000 rows, the batches parsed) and reports the seconds
of each, the pass's rows per second and the child's peak resident memory
(``ru_maxrss``). Runs are interleaved and repeated ``--repeats`` times; medians and the
spread.

    python benchmarks/parquet_source.py                    # 1e5 and 1e6 rows, 3 repeats
    python benchmarks/parquet_source.py --rows 100000 --repeats 1
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODES = ("csv", "parquet")
FEATURES = 20
CLASSES = 10
CHUNK = 10_000  # rows drawn at random once, written again until the file is long enough
ROW_GROUP = 100_000


# --- in the child process ---------------------------------------------------------------


def child(mode: str, path: str, batch_size: int) -> dict:
    from beatloop.named_data.load import make_source

    source = make_source(f"{mode}:{path}", ["label=label", "validation_fraction=0.1"])
    began = time.perf_counter()
    split = source.load(seed=0, batch_size=batch_size)
    loaded = time.perf_counter()
    rows = sum(int(batch["y"].shape[0]) for batch in split.train)
    passed = time.perf_counter()
    return {
        "load_s": loaded - began,
        "pass_s": passed - loaded,
        "rows_per_s": rows / (passed - loaded),
        "rows": rows,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# --- in the parent process --------------------------------------------------------------


def write_table(folder: Path, rows: int) -> dict[str, Path]:
    """``rows`` rows of 20 random features and a label 0..9, as a CSV and as Parquet."""
    import numpy as np
    import pyarrow.csv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    features = rng.standard_normal((CHUNK, FEATURES))
    labels = rng.integers(0, CLASSES, CHUNK)
    lines = [
        ",".join(f"{v:.6g}" for v in row) + f",{y}\n"
        for row, y in zip(features, labels, strict=True)
    ]
    paths = {"csv": folder / f"{rows}.csv", "parquet": folder / f"{rows}.parquet"}
    header = ",".join([*(f"f{i}" for i in range(FEATURES)), "label"]) + "\n"
    with paths["csv"].open("w") as handle:
        handle.write(header)
        for start in range(0, rows, CHUNK):
            handle.writelines(lines[: min(CHUNK, rows - start)])
    table = pyarrow.csv.read_csv(paths["csv"])
    pq.write_table(table, paths["parquet"], row_group_size=ROW_GROUP)
    return paths


def run_child(mode: str, path: Path, batch_size: int) -> dict:
    """One fresh child's figures, this checkout's beatloop imported."""
    from common import fresh_process

    arguments = ["--child", mode, str(path), "--batch-size", str(batch_size)]
    return fresh_process(__file__, arguments, f"{mode} {path.name}", this_checkout=True)


def report(sizes: dict, runs: dict, repeats: int, batch_size: int) -> None:
    from common import spread

    print(f"one pass of the training batches, batch {batch_size}; medians of {repeats}")
    header = f"{'rows':>9} {'kind':>8} {'file MB':>8} {'load s':>12} {'rows/s':>16} {'RSS MB':>12}"
    print(header)
    print("-" * len(header))
    for (rows, mode), results in runs.items():
        cells = []
        for key, width in (("load_s", 7), ("rows_per_s", 11), ("rss_mb", 7)):
            values = [run[key] for run in results]
            number = f"{statistics.median(values):{width},.1f}"
            cells.append(f"{number} {spread(values):>4}")
        print(f"{rows:>9} {mode:>8} {sizes[rows, mode]:8.1f} " + " ".join(cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"))
    parser.add_argument("--rows", default="100000,1000000")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.batch_size)))
        return 0
    from common import interleaved  # the parent's alone: TensorFlow stays out of a child's start

    counts = [int(float(text)) for text in args.rows.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        files = {rows: write_table(Path(folder), rows) for rows in counts}

        def run(rows: int, mode: str) -> dict:
            return run_child(mode, files[rows][mode], args.batch_size)

        runs = interleaved(counts, MODES, args.repeats, run)
        sizes = {(n, m): files[n][m].stat().st_size / 2**20 for n in counts for m in MODES}
    report(sizes, runs, args.repeats, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
