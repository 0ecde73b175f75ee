"""``beatloop list`` start-up: cold (no cache: plugins load, TensorFlow is imported, the
cache is written) beside warm (read from the cache), as the wall time of a new process.

Each repeat removes the cache, times one cold run, then ``--warm`` warm runs; the figures
are medians over all runs of a kind, with their spread. A temporary cache directory is
used (``BEATLOOP_CACHE_DIR``), never the user's.

    python benchmarks/list_speed.py                  # 3 repeats, 3 warm runs each
    python benchmarks/list_speed.py --repeats 1 --warm 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import spread

TARGET = 1.0  # seconds, warm


def timed_list(cache: str, options: list[str]) -> tuple[float, str]:
    """Wall time and standard output of ``python -m beatloop list OPTIONS``."""
    env = {**os.environ, "BEATLOOP_CACHE_DIR": cache, "TF_CPP_MIN_LOG_LEVEL": "2"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "beatloop", "list", *options],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    return time.perf_counter() - start, done.stdout


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold runs (each then warm ones)")
    parser.add_argument("--warm", type=int, default=3, help="warm runs after each cold one")
    parser.add_argument("--verbose", action="store_true", help="time `list --verbose`")
    args = parser.parse_args(argv)
    options = ["--verbose"] if args.verbose else []
    cold, warm = [], []
    cache = tempfile.mkdtemp(prefix="beatloop-list-cache-")
    try:
        for repeat in range(args.repeats):
            shutil.rmtree(cache, ignore_errors=True)
            seconds, computed = timed_list(cache, options)
            cold.append(seconds)
            for _ in range(args.warm):
                seconds, cached = timed_list(cache, options)
                warm.append(seconds)
                if cached != computed:
                    raise SystemExit("a warm run printed something else than the cold run")
            print(
                f"repeat {repeat + 1}: cold {cold[-1]:.2f} s, warm "
                + ", ".join(f"{s:.2f}" for s in warm[-args.warm :])
                + " s",
                file=sys.stderr,
            )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    cold_median, warm_median = statistics.median(cold), statistics.median(warm)
    command = "beatloop list" + (" --verbose" if args.verbose else "")
    print(f"\n`{command}`, wall time of a new process (median, spread)")
    print(f"{'cold (no cache)':<24} {'warm (cache hit)':<24} {'cold / warm':>11}  target")
    print(
        f"{f'{cold_median:.2f} s {spread(cold)}':<24} {f'{warm_median:.2f} s {spread(warm)}':<24} "
        f"{cold_median / warm_median:10.1f}x  warm < {TARGET:.0f} s: "
        + ("met" if warm_median < TARGET else "NOT met")
    )
    print(f"({len(cold)} cold run(s), {len(warm)} warm run(s))")


if __name__ == "__main__":
    main()
