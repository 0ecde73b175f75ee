"""Peak memory of training on a CSV: the streamed ``csv`` source against the in-memory
pipeline it replaced, on files of 1e4, 1e5 and 1e6 rows, each run in a fresh process.

Each file has 20 float feature columns and an integer label (10 classes). A run trains
``supervised`` for one epoch (every row read once; ``steps_per_execution`` auto) and
reports the child process's peak resident memory (``ru_maxrss``) and the fit's seconds.
``stream`` is ``--data csv:FILE``; ``memory`` is what the source did before it streamed:
the file loaded with NumPy, then ``split_arrays`` (``from_tensor_slices``, cached,
shuffled over the whole data). Runs are interleaved and repeated ``--repeats`` times;
medians and the spread.

    python benchmarks/csv_memory.py                      # 1e4, 1e5, 1e6 rows, 3 repeats
    python benchmarks/csv_memory.py --rows 10000,100000 --repeats 1
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

MODES = ("stream", "memory")
FEATURES = 20
CLASSES = 10
CHUNK = 10_000  # rows drawn at random once, written again until the file is long enough


# --- in the child process ---------------------------------------------------------------


def child(mode: str, path: str, batch_size: int) -> dict:
    import numpy as np

    import beatloop
    from beatloop import NamedData
    from beatloop.datasets import split_arrays
    from beatloop.sources.csv import CsvConfig

    config = {"batch_size": batch_size, "classes": CLASSES}
    if mode == "stream":
        data = NamedData(f"csv:{path}", ("label=label",))
    else:

        def data(recipe, seed):
            values = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64)
            arrays = {"x": values[:, :-1].astype(np.float32), "y": values[:, -1].astype(np.int32)}
            del values
            return split_arrays(arrays, CsvConfig(), seed, batch_size, f"memory:{path}")

    began = time.perf_counter()
    result = beatloop.fit("supervised", data=data, config=config, epochs=1, seed=0, progress=False)
    return {
        "fit_s": time.perf_counter() - began,
        "steps": result.steps,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# --- in the parent process --------------------------------------------------------------


def write_csv(path: Path, rows: int) -> None:
    """``rows`` rows of 20 random features (6 significant digits) and a label 0..9."""
    import numpy as np

    rng = np.random.default_rng(0)
    features = rng.standard_normal((CHUNK, FEATURES))
    labels = rng.integers(0, CLASSES, CHUNK)
    lines = [
        ",".join(f"{v:.6g}" for v in row) + f",{y}\n"
        for row, y in zip(features, labels, strict=True)
    ]
    header = ",".join([*(f"f{i}" for i in range(FEATURES)), "label"]) + "\n"
    with path.open("w") as handle:
        handle.write(header)
        for start in range(0, rows, CHUNK):
            handle.writelines(lines[: min(CHUNK, rows - start)])


def run_child(mode: str, path: Path, batch_size: int) -> dict:
    """One fresh child's figures, this checkout's beatloop imported."""
    from common import fresh_process

    arguments = ["--child", mode, str(path), "--batch-size", str(batch_size)]
    return fresh_process(__file__, arguments, f"{mode} {path.name}", this_checkout=True)


def report(sizes: list[int], runs: dict, repeats: int, batch_size: int) -> None:
    from common import spread

    print(f"supervised, 1 epoch, batch {batch_size}, fresh process each; medians of {repeats}")
    header = f"{'rows':>9} {'file MB':>8} " + " ".join(
        f"{mode + ' ' + figure:>18}" for mode in MODES for figure in ("RSS MB", "fit s")
    )
    print(header)
    print("-" * len(header))
    for rows, file_mb in sizes:
        cells = []
        for mode in MODES:
            for key in ("rss_mb", "fit_s"):
                values = [run[key] for run in runs[rows, mode]]
                cells.append(f"{statistics.median(values):13.1f} {spread(values):>4}")
        print(f"{rows:>9} {file_mb:8.1f} " + " ".join(cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"))
    parser.add_argument("--rows", default="10000,100000,1000000")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.batch_size)))
        return 0
    from common import interleaved  # the parent's alone: TensorFlow stays out of a child's start

    counts = [int(float(text)) for text in args.rows.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        paths = {rows: Path(folder) / f"{rows}.csv" for rows in counts}
        for rows, path in paths.items():
            write_csv(path, rows)

        def run(rows: int, mode: str) -> dict:
            return run_child(mode, paths[rows], args.batch_size)

        runs = interleaved(counts, MODES, args.repeats, run)
        sizes = [(rows, path.stat().st_size / 2**20) for rows, path in paths.items()]
    report(sizes, runs, args.repeats, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
