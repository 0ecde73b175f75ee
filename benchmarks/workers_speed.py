"""Examples/s of a recipe trained by 1, 2 and 3 local workers, the same global batch.

One worker is a plain run (what ``beatloop run --workers 1`` is); N workers are N
processes of one ``MultiWorkerMirroredStrategy`` on 127.0.0.1, each with its
``TF_CONFIG``, as ``beatloop run --workers N`` starts them (the same ports and
``TF_CONFIG``, ``beatloop.cli.workers``), here calling ``beatloop.fit`` without a run
dir so that only training is timed. Worker 0's training time per epoch (validation not
counted: ``TrainingTimer``), epochs after the first (tracing) pooled, gives a trial's
examples/s for the whole cluster; trials rotate their order over the repeats so machine
noise falls on each count. Printed: each count's median and spread, and its ratio to one
worker.

Local workers share one machine's cores and add a collective all-reduce per step: on a
2-core CPU more workers are slower, and the figures say by how much. They are for trying
a cluster run on one machine (and for tests), not for speed.

    python benchmarks/workers_speed.py                     # supervised, 3 repeats
    python benchmarks/workers_speed.py --recipe gan        # the gan recipe
    python benchmarks/workers_speed.py --quick             # 1 repeat, 3 epochs
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common, run from anywhere

from common import spread

from beatloop.cli.workers import free_ports, tf_config

#: Per recipe: its config (the global batch) and what one epoch is.
CONFIGS = {
    "supervised": {"batch_size": 64},
    "gan": {"batch_size": 64, "quality_samples": 64},
}


def worker(spec: dict) -> None:
    """One worker (a plain run without ``TF_CONFIG``): train, write worker 0's times."""
    import tensorflow as tf

    import beatloop

    strategy = tf.distribute.MultiWorkerMirroredStrategy() if "TF_CONFIG" in os.environ else None
    timer = beatloop.TrainingTimer()
    beatloop.fit(
        spec["recipe"],
        config=CONFIGS[spec["recipe"]],
        epochs=spec["epochs"],
        seed=0,
        steps_per_execution=spec["steps"],
        progress=False,
        callbacks=[timer],
        strategy=strategy,
    )
    if spec["index"] == 0:
        report = {"seconds": timer.epoch_seconds, "examples": timer.epoch_examples}
        Path(spec["out"]).write_text(json.dumps(report))


def trial(workers: int, args, folder: Path) -> float:
    """Examples/s of one run of ``workers`` local workers (worker 0's epochs after the
    first)."""
    out = folder / f"trial-{workers}.json"
    addresses = [f"127.0.0.1:{port}" for port in free_ports(workers)]
    processes = []
    for index in range(workers):
        spec = {"recipe": args.recipe, "epochs": args.epochs, "steps": args.steps}
        spec.update(index=index, out=str(out))
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        if workers > 1:
            env["TF_CONFIG"] = tf_config(addresses, index)
        command = [sys.executable, __file__, "--worker", json.dumps(spec)]
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL))
    codes = [process.wait(timeout=600) for process in processes]
    if any(codes):
        raise SystemExit(f"a worker of the {workers}-worker trial failed: exit codes {codes}")
    report = json.loads(out.read_text())
    return sum(report["examples"][1:]) / sum(report["seconds"][1:])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=sorted(CONFIGS), default="supervised")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6, help="epochs per run, first dropped")
    parser.add_argument("--steps", type=int, default=8, help="steps per compiled call")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 3 epochs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker(json.loads(args.worker))
    if args.quick:
        args.repeats, args.epochs = 1, 3
    rates: dict[int, list[float]] = {count: [] for count in args.workers}
    counts = list(args.workers)
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            for count in counts[repeat % len(counts) :] + counts[: repeat % len(counts)]:
                rates[count].append(trial(count, args, Path(folder)))
                print(f"repeat {repeat + 1}/{args.repeats}  {count} worker(s)  "
                      f"{rates[count][-1]:10,.0f} examples/s", file=sys.stderr)  # fmt: skip
    batch = CONFIGS[args.recipe]["batch_size"]
    print(
        f"\n{args.recipe}, global batch {batch}, {args.steps} steps per call: examples/s, "
        f"median of {args.repeats} repeat(s) ({os.cpu_count()} CPU cores)"
    )
    one = statistics.median(rates[counts[0]])
    for count in counts:
        median = statistics.median(rates[count])
        print(
            f"{count} worker(s)  {median:10,.0f}  {spread(rates[count]):>5}  "
            f"{median / one:5.2f}x {counts[0]} worker(s)"
        )


if __name__ == "__main__":
    main()
