"""The recommender at real catalogue sizes: beatloop's ``recommender`` recipe beside a
hand-written TensorFlow loop of the same two-tower model whose evaluation streams a
running top-K over item chunks (the TF Recommenders pattern), each in its own process.

Data (generated here, seeded; integer ids as MovieLens has): users rate at least 20 items,
how many drawn from a log-normal (a long tail of heavy raters), which items from a Zipf
popularity (a long tail of rare items); each user's rated pairs distinct, 5 of them held
out for validation. Shapes:

- ``movielens``: MovieLens-25M's, 162,541 users, 62,423 items, about 25M ratings;
- ``catalogue``: 1,000,000 items, 100,000 users, about 3.3M ratings;
- ``--users`` overrides the users (the evaluation's memory at two sizes).

Each side reads its vocabularies (beatloop: one pass over the training pipeline, as the
recipe does with any data; the hand-written loop: ``np.unique`` on the arrays it holds),
trains ``--steps`` steps of batch ``--batch`` (the in-batch softmax with log-Q, the rating
MSE, one Adam; beatloop with ``train_recall=false``: its recall@K is the validation's),
then evaluates recall@10 over every item its user did not rate on the held-out rows of
``--eval-users`` users (all: ``0``). Printed per side, medians of ``--repeats``
interleaved runs, and beatloop's figure over the hand-written loop's (below 1: less time
or memory): the set-up to the end of the first step, the epoch time (one epoch's steps at
the measured step time, tracing excluded), the evaluation's time per 1,000 rows and in
all, the evaluation's own memory (peak resident memory during it less that before it) and
the process's peak.

    python benchmarks/recommender_scale.py --shape movielens
    python benchmarks/recommender_scale.py --shape catalogue --eval-users 20000
    python benchmarks/recommender_scale.py --shape catalogue --users 25000,100000 --quick
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from common import machine, spread, summed_per_id

SHAPES = {
    "movielens": {"users": 162_541, "items": 62_423, "ratings": 25_000_095},
    "catalogue": {"users": 100_000, "items": 1_000_000, "ratings": 3_300_000},
}
HELD_OUT, FEWEST, K, EMBEDDING, CHUNK = 5, 20, 10, 32, 4096
SIDES = ("beatloop", "hand-written")


# --- the data ---------------------------------------------------------------------------


def generate(users: int, items: int, ratings: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Distinct (user, item) pairs with long tails on both sides, and a rating each."""
    rng = np.random.default_rng(seed)
    activity = rng.lognormal(0.0, 1.0, size=users)
    counts = FEWEST + np.floor(activity / activity.sum() * (ratings - FEWEST * users))
    counts = np.minimum(counts.astype(np.int64), items // 2)
    popularity = 1.0 / np.arange(1, items + 1) ** 1.0
    cumulative = np.cumsum(popularity[rng.permutation(items)])
    cumulative /= cumulative[-1]
    user = np.repeat(np.arange(users, dtype=np.int64), 2 * counts)  # twice: repeats go
    item = np.searchsorted(cumulative, rng.random(user.size)).clip(max=items - 1)
    pairs = np.unique(user * items + item)  # a repeated draw is kept once
    user, item = np.divmod(pairs, items)
    order = np.lexsort((rng.random(user.size), user))  # each user's pairs in random order
    user, item = user[order], item[order]
    rank = np.arange(user.size) - np.searchsorted(user, user, side="left")
    kept = rank < counts[user]
    user, item, rank = user[kept], item[kept], rank[kept]
    held = rank < HELD_OUT
    rating = np.clip(np.round(3.5 + rng.normal(size=user.size)), 1, 5).astype(np.float32)
    columns = {"user": user.astype(np.int64), "item": item.astype(np.int64), "rating": rating}
    shuffle = rng.permutation(int((~held).sum()))
    train = {f"train_{k}": v[~held][shuffle] for k, v in columns.items()}
    return {**train, **{f"val_{k}": v[held] for k, v in columns.items()}}


def datasets(path: str, batch: int, eval_users: int):
    """The training rows shuffled in a 100,000-row buffer, the held-out rows of the first
    ``eval_users`` users (all when 0), both batched."""
    import tensorflow as tf

    arrays = np.load(path)
    train = {k[6:]: arrays[k] for k in arrays.files if k.startswith("train_")}
    validation = {k[4:]: arrays[k] for k in arrays.files if k.startswith("val_")}
    if eval_users:
        validation = {k: v[validation["user"] < eval_users] for k, v in validation.items()}
    train_data = (
        tf.data.Dataset.from_tensor_slices(train)
        .shuffle(100_000, seed=0)
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    val_data = tf.data.Dataset.from_tensor_slices(validation).batch(batch).prefetch(2)
    return train, validation, train_data, val_data


# --- memory while evaluating ----------------------------------------------------------------


class ResidentPeak:
    """The peak resident memory between ``start`` and ``stop``, sampled every 10 ms."""

    def __init__(self):
        self.peak = self.before = 0
        self._done = threading.Event()

    def start(self) -> None:
        self.before = self.peak = resident()
        self._done.clear()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.01):
            self.peak = max(self.peak, resident())

    def stop(self) -> float:
        """Megabytes the evaluation added at its peak."""
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, resident())
        return (self.peak - self.before) / 2**20


def resident() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


# --- the two sides, each in a child process -------------------------------------------------


def run_beatloop(path: str, steps: int, batch: int, eval_users: int) -> dict:
    import beatloop
    from beatloop import DataSplit

    _, validation, train_data, val_data = datasets(path, batch, eval_users)
    timer = Timer()
    config = {"train_recall": False, "batch_size": batch, "recall_chunk": CHUNK, "top_k": K}
    began = time.perf_counter()
    result = beatloop.fit(
        "recommender", data=DataSplit(train_data, val_data), epochs=1, seed=0,
        steps_per_epoch=steps, config=config, progress=False, callbacks=[timer],
        op_determinism=False,
    )  # fmt: skip
    return {
        **timer.figures(),
        "setup_s": timer.calls[0][0] - began,
        "rows": len(validation["user"]),
        "recall": result.history["val_recall_at_k"][-1],
    }


class Timer:
    """beatloop's callback points timed: steps after the first call, the validation."""

    def __new__(cls):
        import beatloop

        class _Timer(beatloop.Callback):
            def __init__(self):
                self.calls, self.memory = [], ResidentPeak()

            def on_execution_end(self, run, steps, logs):
                self.calls.append((time.perf_counter(), run.step))

            def on_validation_start(self, run):
                self.memory.start()
                self.began = time.perf_counter()

            def on_validation_end(self, run, logs):
                self.eval_s = time.perf_counter() - self.began
                self.eval_mb = self.memory.stop()

            def figures(self) -> dict:
                (t0, s0), (t1, s1) = self.calls[0], self.calls[-1]
                return {"step_s": (t1 - t0) / (s1 - s0), "eval_s": self.eval_s,
                        "eval_mb": self.eval_mb}  # fmt: skip

        return _Timer()


def run_handwritten(path: str, steps: int, batch: int, eval_users: int) -> dict:
    """The two towers, the losses and Adam as a TF Recommenders user writes them (each
    embedding's gradient rows summed per id before Adam, as beatloop does), the
    evaluation a running top-K over item chunks, the user's rated items excluded."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    train, validation, train_data, val_data = datasets(path, batch, eval_users)
    began = time.perf_counter()
    users, user_rows = np.unique(train["user"], return_inverse=True)
    items, item_columns, counts = np.unique(train["item"], return_inverse=True, return_counts=True)
    pairs = np.unique((user_rows + 1) * len(items) + item_columns)  # row 0: unknown users
    starts = np.searchsorted(pairs // len(items), np.arange(len(users) + 2))
    seen_starts, seen_items = (
        tf.constant(starts),
        tf.constant((pairs % len(items)).astype(np.int32)),
    )
    log_q = tf.constant(np.log(np.concatenate([[counts.min()], counts]) / counts.sum()), tf.float32)

    def tower(vocabulary):
        lookup = keras.layers.IntegerLookup(vocabulary=vocabulary)
        embedding = keras.layers.Embedding(len(vocabulary) + 1, EMBEDDING)
        return keras.Sequential([keras.Input((), dtype="int64"), lookup, embedding])

    user_tower, item_tower = tower(users), tower(items)
    hidden = [keras.layers.Dense(64, "relu"), keras.layers.Dense(32, "relu")]
    rating_model = keras.Sequential([keras.Input((2 * EMBEDDING,)), *hidden, keras.layers.Dense(1)])
    variables = [*user_tower.trainable_variables, *item_tower.trainable_variables,
                 *rating_model.trainable_variables]  # fmt: skip
    optimizer = keras.optimizers.Adam(0.05)
    optimizer.build(variables)

    @tf.function
    def train_step(batch):
        with tf.GradientTape() as tape:
            u, i = (
                user_tower(batch["user"], training=True),
                item_tower(batch["item"], training=True),
            )
            logits = tf.matmul(u, i, transpose_b=True)
            logits -= tf.gather(log_q, item_tower.layers[0](batch["item"]))[None, :]
            labels = tf.range(tf.shape(u)[0])
            retrieval = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            )
            predicted = rating_model(tf.concat([u, i], 1), training=True)[:, 0]
            loss = retrieval + tf.reduce_mean(tf.square(predicted - batch["rating"]))
        optimizer.apply(summed_per_id(tape.gradient(loss, variables)), variables)

    @tf.function
    def eval_step(batch):
        queries = user_tower(batch["user"])
        candidates = item_tower(tf.constant(items))
        rows = tf.cast(user_tower.layers[0](batch["user"]), tf.int64)
        spans = tf.ragged.range(tf.gather(seen_starts, rows), tf.gather(seen_starts, rows + 1))
        seen_row = tf.cast(spans.value_rowids(), tf.int32)
        seen_item = tf.gather(seen_items, spans.flat_values)
        best_scores = tf.fill([tf.shape(queries)[0], K], -np.inf)
        best_ids = tf.zeros([tf.shape(queries)[0], K], tf.int32)
        for start in tf.range(0, len(items), CHUNK):  # candidates streamed a chunk at a time
            chunk = candidates[start : start + CHUNK]
            width = tf.shape(chunk)[0]
            scores = tf.matmul(queries, chunk, transpose_b=True)
            inside = (seen_item >= start) & (seen_item < start + width)
            excluded = tf.stack([seen_row[inside], seen_item[inside] - start], 1)
            unseen = tf.fill(tf.shape(excluded)[:1], -np.inf)
            scores = tf.tensor_scatter_nd_update(scores, excluded, unseen)
            merged = tf.math.top_k(tf.concat([best_scores, scores], 1), K)
            positions = tf.broadcast_to(start + tf.range(width), tf.shape(scores))
            ids = tf.concat([best_ids, positions], 1)
            best_scores, best_ids = merged.values, tf.gather(ids, merged.indices, batch_dims=1)
        own = tf.cast(item_tower.layers[0](batch["item"]), tf.int32) - 1
        return tf.reduce_sum(tf.cast(tf.reduce_any(best_ids == own[:, None], 1), tf.float32))

    times = []
    for batch in train_data.take(steps):
        train_step(batch)
        times.append(time.perf_counter())
    memory = ResidentPeak()
    memory.start()
    evaluated = time.perf_counter()
    hits = sum(float(eval_step(batch)) for batch in val_data)
    eval_s = time.perf_counter() - evaluated
    return {
        "step_s": (times[-1] - times[0]) / (len(times) - 1),
        "eval_s": eval_s,
        "eval_mb": memory.stop(),
        "setup_s": times[0] - began,
        "rows": len(validation["user"]),
        "recall": hits / len(validation["user"]),
    }


def child(side: str, path: str, steps: int, batch: int, eval_users: int) -> None:
    run = run_beatloop if side == "beatloop" else run_handwritten
    figures = run(path, steps, batch, eval_users)
    figures["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(figures))


# --- the parent -------------------------------------------------------------------------------


def measure(side: str, path: str, args) -> dict:
    command = [sys.executable, __file__, "--child", side, path, "--steps", str(args.steps),
               "--batch", str(args.batch), "--eval-users", str(args.eval_users)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{side} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(shape: dict, train_rows: int, runs: dict[str, list[dict]], batch: int) -> None:
    epoch_steps = train_rows // batch
    print(f"{shape['users']:,} users, {shape['items']:,} items, {train_rows:,} training rows "
          f"({epoch_steps:,} steps of {batch} an epoch); {runs[SIDES[0]][0]['rows']:,} rows "
          f"evaluated against every item")  # fmt: skip
    rows = {
        "set-up to the first step (s)": lambda r: r["setup_s"],
        "epoch (s)": lambda r: r["step_s"] * epoch_steps,
        "evaluation (s)": lambda r: r["eval_s"],
        "evaluation per 1,000 rows (s)": lambda r: 1000 * r["eval_s"] / r["rows"],
        "evaluation's memory (MB)": lambda r: r["eval_mb"],
        "peak memory (MB)": lambda r: r["peak_mb"],
        "recall@10": lambda r: r["recall"],
    }
    print(f"{'':32}{SIDES[0]:>18}{SIDES[1]:>18}   ratio")
    for name, read in rows.items():
        medians = [statistics.median(read(r) for r in runs[side]) for side in SIDES]
        spreads = [spread([read(r) for r in runs[side]]) for side in SIDES]
        ratio = f"{medians[0] / medians[1]:.2f}x" if medians[1] else ""
        cells = [
            f"{m:,.3f} {s}" if m < 10 else f"{m:,.0f} {s}"
            for m, s in zip(medians, spreads, strict=True)
        ]
        print(f"{name:32}{cells[0]:>18}{cells[1]:>18}   {ratio}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "DATA"))
    parser.add_argument("--shape", choices=SHAPES, default="movielens")
    parser.add_argument("--users", default="", help="users, comma-separated sizes")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--eval-users", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="few steps, one repeat")
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child, args.steps, args.batch, args.eval_users)
        return 0
    if args.quick:
        args.steps, args.repeats = 30, 1
    print(machine())
    sizes = [int(u) for u in args.users.split(",")] if args.users else [None]
    for users in sizes:
        shape = dict(SHAPES[args.shape])
        if users:
            shape = {**shape, "users": users, "ratings": shape["ratings"] * users // shape["users"]}
        with tempfile.TemporaryDirectory() as folder:
            path = str(Path(folder, "ratings.npz"))
            began = time.perf_counter()
            arrays = generate(**shape)
            np.savez(path, **arrays)
            print(f"data generated in {time.perf_counter() - began:.0f} s")
            runs = {side: [] for side in SIDES}
            for repeat in range(args.repeats):
                for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
                    runs[side].append(measure(side, path, args))
                    print(
                        f"repeat {repeat + 1}/{args.repeats} {side}: {runs[side][-1]}",
                        file=sys.stderr,
                    )
            report(shape, len(arrays["train_user"]), runs, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
