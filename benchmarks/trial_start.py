"""The start of ``tune``'s trial processes: a small study run by the ``beatloop``
command with its trials forked from a process that imported TensorFlow (the default)
beside the same study with each trial spawned afresh (``BEATLOOP_FORK_TRIALS=0``).

Each study is a new command in a new study dir: ``--trials`` trials of ``supervised``
at ``--epochs`` epochs, one at a time (``--jobs``). Runs are interleaved, each pair
repeated ``--repeats`` times. Per study: wall seconds and the CPU seconds of the command
and every process it started (``RUSAGE_CHILDREN``); medians, spread, and the ratio
spawned / forked. Both studies' trial objectives are checked equal.

    python benchmarks/trial_start.py               # 4 trials of 1 epoch, 3 repeats
    python benchmarks/trial_start.py --repeats 5 --trials 8
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BEATLOOP = Path(sys.executable).parent / "beatloop"


def study(
    out: Path, trials: int, epochs: int, jobs: int, forked: bool
) -> tuple[float, float, list]:
    """One ``beatloop tune`` command: its wall and CPU seconds and its trials' lines."""
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "BEATLOOP_FORK_TRIALS": "1" if forked else "0",
    }
    command = [str(BEATLOOP), "tune", "supervised", "--space", "learning_rate=log:1e-3:1e-1",
               "--set", "batch_size=256", "--trials", str(trials), "--epochs", str(epochs),
               "--jobs", str(jobs), "--pruner", "none", "--out", str(out)]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"tune failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("trial "))
    return wall, cpu, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float]]] = {"forked": [], "spawned": []}
    outcomes: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            for mode in ("forked", "spawned") if repeat % 2 == 0 else ("spawned", "forked"):
                out = Path(folder) / f"{mode}-{repeat}"
                wall, cpu, lines = study(out, args.trials, args.epochs, args.jobs, mode == "forked")
                times[mode].append((wall, cpu))
                outcomes.setdefault(mode, lines)
                assert lines == outcomes[mode], "a study's trials differ between repeats"
                print(
                    f"repeat {repeat + 1} {mode:8s} wall {wall:6.1f} s  cpu {cpu:6.1f} s",
                    flush=True,
                )
    assert outcomes["forked"] == outcomes["spawned"], (outcomes["forked"], outcomes["spawned"])
    print(f"\n{args.trials} trials of supervised, {args.epochs} epoch(s), {args.jobs} job(s), "
          f"{args.repeats} repeats: median (min-max)")  # fmt: skip
    medians = {}
    for mode, pairs in times.items():
        walls, cpus = [w for w, _ in pairs], [c for _, c in pairs]
        medians[mode] = (statistics.median(walls), statistics.median(cpus))
        print(f"{mode:8s} wall {medians[mode][0]:6.1f} s ({min(walls):.1f}-{max(walls):.1f})"
              f"  cpu {medians[mode][1]:6.1f} s ({min(cpus):.1f}-{max(cpus):.1f})")  # fmt: skip
    print(
        f"spawned / forked: wall {medians['spawned'][0] / medians['forked'][0]:.2f}x, "
        f"cpu {medians['spawned'][1] / medians['forked'][1]:.2f}x"
    )
    print("trial objectives equal forked and spawned:", outcomes["forked"] == outcomes["spawned"])


if __name__ == "__main__":
    main()
