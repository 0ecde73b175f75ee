"""Real model sizes: ResNet-20, a Transformer encoder and a two-tower recommender with
100,000-row tables, each trained by beatloop, Keras ``fit`` and a hand-written loop.

Workloads (generated data, nothing downloaded; random labels: speed, not accuracy):

- ``resnet``: ResNet-20 (CIFAR-style: 3 stages of 3 basic blocks, 16/32/64 filters,
  batch norm; 0.27M weights) on 32x32x3 images, 10 classes, batch 128, SGD with
  momentum;
- ``transformer``: a Transformer encoder classifier (token and position embeddings,
  2 blocks of 4-head self-attention and a 512-wide GELU feed-forward, d_model 128,
  dropout 0.1, mean pooling; 1.7M weights) on sequences of 128 token ids from a
  vocabulary of 10,000, 2 classes, batch 64, Adam;
- ``recommender``: the built-in ``recommender`` recipe's two-tower step (user and item
  towers, each a lookup and a 100,000 x 32 embedding; in-batch softmax with log-Q; the
  rating model's MSE; one Adam) on 102,400 generated ratings of 100,000 users and
  100,000 items (Zipf-like popularity), batch 1,024. Its recall@K figure is left out
  (``TrainingOnly``: it scores every item in every training step, and its
  users x items table of bytes would be 10 GB here); Keras's side is a ``keras.Model``
  with a custom ``train_step`` doing the same update.

Sides: beatloop (``supervised`` with ``models=``, or the recipe; seeded, for the
recipe's own models, with op determinism off, as on the others) at steps_per_execution
32 and at its default ``"auto"``, Keras ``fit`` at 32 and a hand-written ``tf.function``
loop running 32 steps a call. The Transformer's and the towers' embeddings have sparse
gradients: beatloop and the hand loop sum each one's rows per id before Adam, ``fit``
hands Adam the rows as they are (docs/schedules.md, "Embeddings"). Every side of every
round is a fresh process (its own peak resident memory, ``VmHWM``; the data are made in
each, the same), timed per epoch by a callback, its first epoch (tracing) dropped.
Rounds interleave the sides, the order rotating each round. Printed per workload: each
side's best and median epoch (every kept epoch of every round pooled), the spread of its
rounds' medians, fit / side and hand loop / side (>= 1.0: the side at least as fast),
the median epoch's CPU seconds (the process's: less moved than wall time by other
processes' load) with fit / side, peak RSS (median of rounds) and side / fit. Children
import only what their side needs (beatloop: +1 MB); the recommender's models are the
recipe's, built by ``fit`` (passing them in ``models=`` would build the recipe's own as
well, then drop them).

    python benchmarks/real_sizes.py                  # 3 rounds, all three (11-14 minutes)
    python benchmarks/real_sizes.py --quick          # smoke run (small sizes, 1 round)
    python benchmarks/real_sizes.py --only resnet --rounds 5 --json out.json
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKLOADS = ("resnet", "transformer", "recommender")
SIDES = ("beatloop", "beatloop_auto", "fit", "hand")
NAMES = {
    "beatloop": "beatloop, spe=32",
    "beatloop_auto": "beatloop, spe=auto",
    "fit": "Keras fit, spe=32",
    "hand": "hand loop, 32 steps/call",
}
STEPS = 32  # steps_per_execution of beatloop and fit; steps a call of the hand loop
#: Real sizes (the defaults): examples an epoch and batch size of each workload.
SIZES = {
    "resnet": {"examples": 768, "batch": 128},
    "transformer": {"examples": 256, "batch": 64},
    "recommender": {"examples": 102_400, "batch": 1024, "users": 100_000, "items": 100_000},
}
#: ``--quick``: small data and tables, for a smoke run (the models keep their sizes).
QUICK_SIZES = {
    "resnet": {"examples": 256, "batch": 128},
    "transformer": {"examples": 128, "batch": 64},
    "recommender": {"examples": 8192, "batch": 1024, "users": 5000, "items": 5000},
}
IMAGE, CLASSES = (32, 32, 3), 10
VOCABULARY, SEQUENCE, D_MODEL, HEADS, FEED_FORWARD, BLOCKS, TEXT_CLASSES = (
    10_000, 128, 128, 4, 512, 2, 2,
)  # fmt: skip
EMBEDDING, RATING_LAYERS, LEARNING_RATE = 32, (64, 32), 0.05  # the recipe's defaults
TARGETS = {"time": 1.0, "memory": 1.05}


# --- in the child process: data and models -------------------------------------------------


def peak_mb() -> dict[str, float]:
    """This process's resident memory now and at its peak (``/proc/self/status``), MB."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return {"rss_mb": found["VmRSS"], "peak_mb": found["VmHWM"]}


def image_data(examples: int, batch: int):
    """Seeded uniform images and random labels, batched and prefetched (not shuffled)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((examples, *IMAGE), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=examples, dtype=np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).prefetch(tf.data.AUTOTUNE)


def text_data(examples: int, batch: int):
    """Seeded token ids in [0, VOCABULARY) and random labels."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCABULARY, size=(examples, SEQUENCE), dtype=np.int32)
    y = rng.integers(0, TEXT_CLASSES, size=examples, dtype=np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).prefetch(tf.data.AUTOTUNE)


def resnet20():
    """ResNet-20 for 32x32x3 images (He et al. 2016, section 4.2), logits out."""
    import keras

    layers = keras.layers

    def conv(x, filters, size=3, stride=1):
        return layers.Conv2D(filters, size, strides=stride, padding="same", use_bias=False,
                             kernel_initializer="he_normal")(x)  # fmt: skip

    inputs = keras.Input(IMAGE)
    x = layers.ReLU()(layers.BatchNormalization()(conv(inputs, 16)))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            stride = 2 if stage and not block else 1
            y = layers.ReLU()(layers.BatchNormalization()(conv(x, filters, stride=stride)))
            y = layers.BatchNormalization()(conv(y, filters))
            if stride > 1 or x.shape[-1] != filters:
                x = layers.BatchNormalization()(conv(x, filters, 1, stride))
            x = layers.ReLU()(layers.Add()([y, x]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(CLASSES)(x), name="resnet20")


def encoder():
    """A Transformer encoder classifier: token + learned position embeddings, post-norm
    blocks (self-attention, GELU feed-forward), mean pooling, logits out."""
    import keras

    layers = keras.layers

    class Positions(layers.Layer):
        def build(self, shape):
            self.table = self.add_weight(shape=tuple(shape[1:]), name="positions")

        def call(self, x):
            return x + self.table[None]

    inputs = keras.Input((SEQUENCE,), dtype="int32")
    x = Positions()(layers.Embedding(VOCABULARY, D_MODEL)(inputs))
    for _ in range(BLOCKS):
        attended = layers.MultiHeadAttention(HEADS, D_MODEL // HEADS, dropout=0.1)(x, x)
        x = layers.LayerNormalization()(x + layers.Dropout(0.1)(attended))
        fed = layers.Dense(D_MODEL)(layers.Dense(FEED_FORWARD, activation="gelu")(x))
        x = layers.LayerNormalization()(x + layers.Dropout(0.1)(fed))
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, layers.Dense(TEXT_CLASSES)(x), name="encoder")


def classifier(workload: str, sizes: dict):
    """The data set, a model (seeded: the same weights on every side) and its optimizer."""
    import keras

    keras.utils.set_random_seed(0)
    if workload == "resnet":
        data = image_data(sizes["examples"], sizes["batch"])
        return data, resnet20(), keras.optimizers.SGD(0.1, momentum=0.9)
    data = text_data(sizes["examples"], sizes["batch"])
    return data, encoder(), keras.optimizers.Adam(1e-3)


def ratings(examples: int, users: int, items: int) -> dict:
    """Generated ratings: every user and item rated at least once (so both vocabularies,
    hence both tables, are full), the rest of the users uniform and the items drawn by a
    Zipf-like popularity; user ids strings (``"u17"``), item ids integers, as the recipe's
    own synthetic data; shuffled."""
    import numpy as np

    rng = np.random.default_rng(0)
    popularity = 1.0 / np.arange(1, items + 1) ** 0.8
    popularity = popularity[rng.permutation(items)] / popularity.sum()
    user = rng.integers(0, users, examples)
    item = rng.choice(items, examples, p=popularity)
    user[: min(users, examples)] = rng.permutation(users)[:examples]
    item[: min(items, examples)] = rng.permutation(items)[:examples]
    order = rng.permutation(examples)
    user, item = user[order], item[order]
    return {
        "user": np.char.add("u", user.astype(str)),
        "item": 1000 + item.astype(np.int64),
        "rating": rng.integers(1, 6, examples).astype(np.float32),
    }


def vocabularies(rows: dict):
    """The sorted user and item ids and each item's share of the rows, as the recipe
    reads them (``read_vocabulary``), with the log-Q table it gathers from."""
    import numpy as np

    users = np.unique(rows["user"])
    items, counts = np.unique(rows["item"], return_counts=True)
    shares = counts / counts.sum()
    log_q = np.log(np.concatenate([[shares.min()], shares])).astype(np.float32)
    return users, items, counts.astype(np.float64), log_q


def recommender_data(sizes: dict):
    import tensorflow as tf

    rows = ratings(sizes["examples"], sizes["users"], sizes["items"])
    data = tf.data.Dataset.from_tensor_slices(rows).batch(sizes["batch"])
    return rows, data.prefetch(tf.data.AUTOTUNE)


def two_towers(users, items) -> dict:
    """The recipe's models at its defaults, written as ``tests/recommender_hand.py`` does."""
    import keras

    def tower(vocabulary, lookup, dtype, name):
        return keras.Sequential([
            keras.Input((), dtype=dtype),
            lookup(vocabulary=vocabulary),
            keras.layers.Embedding(len(vocabulary) + 1, EMBEDDING),
        ], name=name)  # fmt: skip

    layers = [keras.Input((2 * EMBEDDING,))]
    layers += [keras.layers.Dense(width, activation="relu") for width in RATING_LAYERS]
    return {
        "user": tower(users, keras.layers.StringLookup, "string", "user"),
        "item": tower(items, keras.layers.IntegerLookup, "int64", "item"),
        "rating": keras.Sequential([*layers, keras.layers.Dense(1)], name="rating"),
    }


def two_tower_losses(models: dict, log_q, batch):
    """The recipe's step by hand: in-batch softmax with log-Q, the rating MSE."""
    import tensorflow as tf

    users = models["user"](batch["user"], training=True)
    items = models["item"](batch["item"], training=True)
    index = tf.cast(models["item"].layers[0](batch["item"]), tf.int32)
    logits = tf.matmul(users, items, transpose_b=True) - tf.gather(log_q, index)[None, :]
    labels = tf.range(tf.shape(users)[0])
    retrieval = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    predicted = models["rating"](tf.concat([users, items], axis=1), training=True)[:, 0]
    rating = tf.reduce_mean(tf.square(predicted - batch["rating"]))
    return retrieval, rating, predicted


# --- in the child process: the sides -------------------------------------------------------


def time_beatloop(workload: str, sizes: dict, epochs: int, steps) -> tuple[list, list]:
    from common import EpochTimer, as_the_others

    import beatloop

    class Timer(EpochTimer):
        """``common.EpochTimer``, and each epoch's CPU seconds (the process's)."""

        def __init__(self):
            super().__init__()
            self.cpu: list[float] = []

        def on_epoch_start(self, run, epoch):
            self._cpu = time.process_time()
            super().on_epoch_start(run, epoch)

        def on_epoch_end(self, run, epoch, logs):
            super().on_epoch_end(run, epoch, logs)
            self.cpu.append(time.process_time() - self._cpu)

    timer = Timer()
    if workload != "recommender":
        data, model, optimizer = classifier(workload, sizes)
        parts = {"models": {"model": model}, "optimizers": {"optimizer": optimizer}}
        recipe = "supervised"
    else:
        from beatloop.recipes.recommender_data import Vocabulary

        rows, data = recommender_data(sizes)
        users, items, counts, _ = vocabularies(rows)
        recipe = training_only_recipe()(batch_size=sizes["batch"])
        recipe.vocabulary = Vocabulary(users, items, counts, seen=None)
        parts = {}  # its own models and Adam, built by fit (seeded): models= would build twice
    beatloop.fit(recipe, data=(data, None), epochs=epochs, seed=0, steps_per_execution=steps,
                 progress=False, callbacks=[timer], **as_the_others(), **parts)  # fmt: skip
    return timer.times, timer.cpu


def training_only_recipe():
    """The built-in ``recommender`` without its recall@K figure (Keras ``fit`` and the
    hand-written loop have none; ``recommender_scale.py`` measures it): vocabularies set
    by the caller, no scoring of every item in each step; its models, losses, schedule
    and other figures are the recipe's own."""
    import tensorflow as tf

    from beatloop.recipes.recommender import TASKS, Recommender

    class TrainingOnly(Recommender):
        def __init__(self, **settings):
            super().__init__(Recommender.Config(**settings))

        def read_training_data(self, train):
            """Nothing: ``vocabulary`` is set from the arrays the data set is made of."""

        def _hits(self, models, users, user_ids, item_ids):
            return tf.zeros(tf.shape(users)[:1])  # not computed, not figured

        def build_metrics(self):
            metrics = super().build_metrics()
            del metrics["recall_at_k"]
            return metrics

        def update_metrics(self, metrics, batch, outputs):
            out = outputs["total"]
            rows = tf.cast(tf.shape(out["hits"])[0], tf.float32)
            for name in TASKS:
                metrics[f"{name}_loss"].update_state(out[name], sample_weight=rows)
            metrics["rmse"].update_state(self._ratings(batch), out["predicted"])

    return TrainingOnly


def keras_timer():
    """Wall and CPU seconds of each Keras epoch (``common.KerasTimer`` and CPU; that module
    imports beatloop, which a Keras side does not)."""
    import keras

    class KerasTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times: list[float] = []
            self.cpu: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self._cpu, self._start = time.process_time(), time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(time.perf_counter() - self._start)
            self.cpu.append(time.process_time() - self._cpu)

    return KerasTimer()


def time_fit(workload: str, sizes: dict, epochs: int) -> tuple[list, list]:
    import keras

    timer = keras_timer()
    if workload != "recommender":
        data, model, optimizer = classifier(workload, sizes)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            steps_per_execution=STEPS,
        )
    else:
        rows, data = recommender_data(sizes)
        users, items, _, log_q = vocabularies(rows)
        keras.utils.set_random_seed(0)
        model = two_tower_model(two_towers(users, items), log_q)
        model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE), steps_per_execution=STEPS)
    model.fit(data, epochs=epochs, shuffle=False, verbose=0, callbacks=[timer])
    return timer.times, timer.cpu


def two_tower_model(models: dict, log_q):
    """The two-tower update as a ``keras.Model`` with a custom ``train_step``: ``fit``'s way."""
    import keras
    import tensorflow as tf

    class TwoTower(keras.Model):
        def __init__(self):
            super().__init__()
            self.parts, self.log_q = models, tf.constant(log_q)
            self.trackers = [keras.metrics.Mean(name=f"{n}_loss") for n in ("retrieval", "rating")]
            self.rmse = keras.metrics.RootMeanSquaredError(name="rmse")
            self.built = True

        @property
        def metrics(self):
            return [*self.trackers, self.rmse]

        def train_step(self, batch):
            variables = self.trainable_variables
            with tf.GradientTape() as tape:
                retrieval, rating, predicted = two_tower_losses(self.parts, self.log_q, batch)
                loss = retrieval + rating
            self.optimizer.apply(tape.gradient(loss, variables), variables)
            rows = tf.cast(tf.shape(predicted)[0], tf.float32)
            self.trackers[0].update_state(retrieval, sample_weight=rows)
            self.trackers[1].update_state(rating, sample_weight=rows)
            self.rmse.update_state(batch["rating"], predicted)
            return {m.name: m.result() for m in self.metrics}

    return TwoTower()


def time_hand(workload: str, sizes: dict, epochs: int) -> tuple[list, list]:
    """A ``tf.function`` running up to ``STEPS`` steps a call on an iterator (a short
    count ends the epoch), the metrics reset each epoch and read at its end; each
    embedding's gradient handed to the optimizer with its rows summed per id, as beatloop
    does (``summed_per_id``)."""
    import keras
    import tensorflow as tf

    if workload != "recommender":
        data, model, optimizer = classifier(workload, sizes)
        variables = model.trainable_variables
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        metrics = [keras.metrics.Mean(name="loss"),
                   keras.metrics.SparseCategoricalAccuracy(name="accuracy")]  # fmt: skip

        def step(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = loss_fn(y, logits)
            optimizer.apply(summed_per_id(tape.gradient(loss, variables)), variables)
            metrics[0].update_state(loss, sample_weight=tf.shape(y)[0])
            metrics[1].update_state(y, logits)

    else:
        rows, data = recommender_data(sizes)
        users, items, _, log_q = vocabularies(rows)
        keras.utils.set_random_seed(0)
        models, log_q = two_towers(users, items), tf.constant(log_q)
        variables = [v for m in models.values() for v in m.trainable_variables]
        optimizer = keras.optimizers.Adam(LEARNING_RATE)
        metrics = [keras.metrics.Mean(name=f"{task}_loss") for task in ("retrieval", "rating")]
        metrics.append(keras.metrics.RootMeanSquaredError(name="rmse"))

        def step(batch):
            with tf.GradientTape() as tape:
                retrieval, rating, predicted = two_tower_losses(models, log_q, batch)
                loss = retrieval + rating
            optimizer.apply(summed_per_id(tape.gradient(loss, variables)), variables)
            rows = tf.cast(tf.shape(predicted)[0], tf.float32)
            metrics[0].update_state(retrieval, sample_weight=rows)
            metrics[1].update_state(rating, sample_weight=rows)
            metrics[2].update_state(batch["rating"], predicted)

    optimizer.build(variables)  # else the first apply builds it and the step traces twice

    @tf.function
    def run_steps(iterator):
        count = tf.constant(0)
        for _ in tf.range(STEPS):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            step(batch.get_value())
            count += 1
        return count

    times, cpu = [], []
    for _ in range(epochs):
        start, start_cpu = time.perf_counter(), time.process_time()
        for metric in metrics:
            metric.reset_state()
        iterator = iter(data)
        while int(run_steps(iterator)) == STEPS:
            pass
        _ = {metric.name: float(metric.result()) for metric in metrics}
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return times, cpu


def summed_per_id(grads: list) -> list:
    """Each embedding gradient (``IndexedSlices``, a row per lookup) with the rows of one
    id summed, as beatloop hands its optimizers; other gradients as they are. (Here, not
    from ``common.py``: the hand loop's process imports no beatloop.)"""
    import tensorflow as tf

    def summed(grad):
        if not isinstance(grad, tf.IndexedSlices):
            return grad
        ids, rows = tf.unique(grad.indices)
        values = tf.math.unsorted_segment_sum(grad.values, rows, tf.shape(ids)[0])
        return tf.IndexedSlices(values, ids, grad.dense_shape)

    return [summed(grad) for grad in grads]


def child(workload: str, side: str, epochs: int, quick: bool) -> dict:
    """One side's fit of one workload: its epoch times and memory."""
    sizes = (QUICK_SIZES if quick else SIZES)[workload]
    import keras  # noqa: F401  (TensorFlow and Keras imported: the start's memory)

    start = peak_mb()["rss_mb"]
    if side == "fit":
        times, cpu = time_fit(workload, sizes, epochs)
    elif side == "hand":
        times, cpu = time_hand(workload, sizes, epochs)
    else:
        steps = STEPS if side == "beatloop" else "auto"
        times, cpu = time_beatloop(workload, sizes, epochs, steps)
    return {"epoch_seconds": times, "cpu_seconds": cpu, "start_mb": start, **peak_mb()}


# --- in the parent process -----------------------------------------------------------------


def run_child(workload: str, side: str, epochs: int, quick: bool) -> dict:
    command = [sys.executable, __file__, "--child", workload, side, "--epochs", str(epochs)]
    done = subprocess.run(command + ["--quick"] * quick, capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{workload} {side} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(workloads, rounds: int, epochs: int, quick: bool) -> dict:
    """Every workload's sides, ``rounds`` times, the sides' order rotating each round."""
    found = {w: {side: [] for side in SIDES} for w in workloads}
    for number in range(rounds):
        for workload in workloads:
            turn = number % len(SIDES)
            for side in SIDES[turn:] + SIDES[:turn]:
                load = os.getloadavg()[0]
                run = {**run_child(workload, side, epochs, quick), "load": load}
                found[workload][side].append(run)
                kept = " ".join(f"{1000 * t:8.0f}" for t in run["epoch_seconds"][1:])
                print(f"round {number + 1}/{rounds}  {workload:<11} {NAMES[side]:<25} {kept} ms"
                      f"  peak {run['peak_mb']:,.0f} MB", file=sys.stderr, flush=True)  # fmt: skip
    return found


def summary(runs: dict[str, list[dict]]) -> dict:
    """Per side: best and median kept epoch (pooled), the spread of the rounds' medians,
    the median kept epoch's CPU seconds, peak memory (median of rounds); each against fit
    and the hand loop (theirs / the side's: >= 1.0, the side at least as fast)."""
    from common import epoch_figures

    sides = {side: epoch_figures(rounds) for side, rounds in runs.items()}
    for values in sides.values():
        for other in ("fit", "hand"):
            for key in ("best", "median", "cpu"):
                values[f"{other}_{key}"] = sides[other][key] / values[key]
        values["memory"] = values["peak_mb"] / sides["fit"]["peak_mb"]
    return sides


def describe(workload: str, sizes: dict, rounds: int, epochs: int) -> str:
    steps = -(-sizes["examples"] // sizes["batch"])
    if workload == "resnet":
        what = f"ResNet-20, 32x32x3 images, {CLASSES} classes, SGD with momentum"
    elif workload == "transformer":
        what = (f"Transformer encoder ({BLOCKS} blocks, d_model {D_MODEL}, {HEADS} heads, "
                f"sequence {SEQUENCE}, vocabulary {VOCABULARY:,}), Adam")  # fmt: skip
    else:
        what = (f"two towers ({sizes['users']:,} x {EMBEDDING} and {sizes['items']:,} x "
                f"{EMBEDDING} tables), Adam")  # fmt: skip
    return (
        f"{what}: {sizes['examples']:,} examples in batches of {sizes['batch']:,} = {steps} "
        f"steps an epoch; {rounds} round(s) of {epochs} epochs a side, the first dropped"
    )


def print_report(workload: str, header: str, sides: dict) -> None:
    """The sides side by side, then beatloop's (spe=32) targets, met or not."""
    print(f"\n{workload}: {header}")
    print(f"{'':<26}{'-- epoch, wall ms --':>22}{'fit / side':>14}{'hand / side':>15}"
          f"{'CPU ms':>8}{'fit/side':>9}{'peak':>7}{'side':>6}")  # fmt: skip
    print(f"{'side':<26}{'best':>7}{'median':>8}{'spread':>7}{'best':>7}{'median':>7}"
          f"{'best':>8}{'median':>7}{'median':>8}{'CPU':>9}{'MB':>7}{'/fit':>6}")  # fmt: skip
    for side, v in sides.items():
        print(
            f"{NAMES[side]:<26}{1000 * v['best']:>7,.0f}{1000 * v['median']:>8,.0f}"
            f"{v['spread']:>7}{v['fit_best']:>6.2f}x{v['fit_median']:>6.2f}x"
            f"{v['hand_best']:>7.2f}x{v['hand_median']:>6.2f}x{1000 * v['cpu']:>8,.0f}"
            f"{v['fit_cpu']:>8.2f}x{v['peak_mb']:>7,.0f}{v['memory']:>5.2f}x"
        )
    ours = sides["beatloop"]
    for other in ("fit", "hand"):
        median, best = ours[f"{other}_median"], ours[f"{other}_best"]
        verdict = "met" if median >= TARGETS["time"] else "NOT met"
        print(f"  beatloop spe=32 time >= {TARGETS['time']}x {NAMES[other]}'s: median "
              f"{median:.2f}x, best {best:.2f}x -> {verdict}")  # fmt: skip
    memory = ours["memory"]
    verdict = "met" if memory <= TARGETS["memory"] else "NOT met"
    print(f"  beatloop spe=32 peak memory <= {TARGETS['memory']}x fit's: {memory:.3f}x "
          f"({ours['peak_mb']:,.0f} / {sides['fit']['peak_mb']:,.0f} MB) -> {verdict}")  # fmt: skip


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="fits per side (3)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs a fit, first dropped (4)")
    parser.add_argument("--only", default=",".join(WORKLOADS), help="workloads, comma-separated")
    parser.add_argument("--quick", action="store_true", help="smoke run: small data, 1 round of 2")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure here")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "SIDE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick and not args.child:
        args.rounds, args.epochs = 1, 2
    workloads = tuple(args.only.split(","))
    if set(workloads) - set(WORKLOADS) or args.epochs < 2 or args.rounds < 1:
        parser.error(f"--only takes {', '.join(WORKLOADS)}; --epochs >= 2; --rounds >= 1")
    args.workloads = workloads
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.epochs, args.quick)))
        return 0
    began = time.perf_counter()
    found = measure(args.workloads, args.rounds, args.epochs, args.quick)
    sizes = QUICK_SIZES if args.quick else SIZES
    record = {}
    for workload in args.workloads:
        sides = summary(found[workload])
        print_report(workload, describe(workload, sizes[workload], args.rounds, args.epochs), sides)
        record[workload] = {"sizes": sizes[workload], "runs": found[workload], "summary": sides}
    from common import machine

    minutes = (time.perf_counter() - began) / 60
    loads = sorted(r["load"] for w in found.values() for runs in w.values() for r in runs)
    print(f"\n{machine()}; Python {platform.python_version()}; {minutes:.1f} minutes; load "
          f"average at the fits' starts {loads[0]:.1f}-{loads[-1]:.1f} (median "
          f"{statistics.median(loads):.1f})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
