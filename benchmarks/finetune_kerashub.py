"""Fine-tuning a KerasHub BERT classifier: beatloop's ``supervised`` recipe against the
Keras ``fit`` a KerasHub user writes for the same run, each side a fresh process.

The workload (nothing downloaded: no preset, no tokenizer): a
``keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)`` on a
``keras_hub.models.BertBackbone`` built from its constructor (BERT-Tiny's shape:
vocabulary 30,522, 2 layers, hidden 128, 2 heads, intermediate 512, dropout 0.1), fed
generated token ids: 2,048 training and 512 validation sequences of length 128
(``token_ids``, ``segment_ids``, ``padding_mask``; 32 to 128 tokens, id 0 padding), each
holding six cue tokens of its class among random words, batches of 32, not shuffled.
AdamW (weight decay 0.01, none on biases and norms) on a linear warm-up to 1e-3 over the
first tenth of the updates then a cosine decay
(``keras.optimizers.schedules.CosineDecay(..., warmup_target=..., warmup_steps=...)``),
gradients accumulated over 4 batches (64 batches, 16 updates an epoch: no partial sum at
an epoch's end, where the two sides would part), an EMA of the weights (decay 0.99 an
update) that validation and the kept model use, the best epoch by val_loss kept.

- beatloop: ``beatloop.fit("supervised", data=(train, val), models={"model":
  classifier}, optimizers={"optimizer": AdamW(schedule over updates)},
  config={"accumulate": 4, "ema_decay": 0.99, "classes": 2}, keep_best="val_loss:min",
  run_dir=...)``, seeded, op determinism off (``common.as_the_others``), the NaN guard at
  its default (gradients checked). The run dir gets a checkpoint (models, the average,
  optimizer) every epoch, and the best epoch's is kept.
- Keras ``fit``: ``classifier.compile(optimizer=AdamW(schedule over micro-batches: its
  steps x 4, gradient_accumulation_steps=4, use_ema=True, ema_momentum=0.99 ** (1 / 4)),
  loss=SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])`` with
  ``keras.callbacks.SwapEMAWeights(swap_on_epoch=True)`` and
  ``ModelCheckpoint(".keras", monitor="val_loss", save_best_only=True)`` (the model and
  its optimizer, as beatloop's checkpoint holds them). Keras's accumulation ticks the
  EMA at every micro-batch with the weights of the last update, so momentum m there is
  m**4 an update: 0.99 ** (1 / 4) gives beatloop's average (which starts at the first
  weights, Keras's at the first update's). It feeds the schedule the micro-batch count
  (hence its steps x 4), so its k-th update takes the rate of micro-batch 4k + 3, three
  quarters of an update ahead in the warm-up, so the sides' weights part; with a
  schedule fed ``step // 4`` or a constant rate they end within beatloop's own floor
  between K=1 and K=32. Timing does not depend on it; the accuracies printed may differ.

Sides, at equal steps per execution and at each side's default: beatloop and ``fit`` at
K=32 (``steps_per_execution=32`` on both), beatloop at ``"auto"`` and ``fit`` at 1.
Every side of every round is a fresh process (the data and the model, seeded, made in
each); rounds interleave the sides, the order rotating each round. An epoch's time runs
from its start to the next epoch's start (the last: to the fit's end), so it holds
validation, the EMA swaps and the checkpoints each side writes at its end; the first
epoch (tracing) is dropped. Peak memory is the process's peak resident set
(``getrusage``'s ``ru_maxrss``, the kernel's ``VmHWM``: read so, the Keras side imports
nothing of beatloop); "start" is after ``import keras_hub`` (TensorFlow, KerasHub and
tensorflow-text), before the side's own imports. Printed: each
side's best and median epoch (every kept epoch of every round pooled), the spread of
its rounds' medians, the median epoch's CPU seconds (the process's: less moved by
other processes' load), peak memory (median of rounds), the last epoch's accuracy (the
model's, training) and val_accuracy (the average's: it lags, at 0.99 over a few
dozen updates), then fit / beatloop for the two pairings (>1.0: beatloop faster) and
beatloop / fit memory (peak, and peak above start). A step of this size lasts longer
than ``"auto"``'s calls may (about 0.25 s), so ``"auto"`` keeps K=1 here; the K each
side ran is printed. The default 3 rounds take a quarter of an hour on 2 cores.

KerasHub is not a dependency of beatloop: ``pip install keras-hub`` pulls tensorflow-text,
which pulls the full ``tensorflow`` wheel (no CUDA libraries) beside
``tensorflow-cpu`` of the same version, and every process then logs TensorFlow's
``failed call to cuInit`` line. Install it in a venv of its own, so the project's
environment keeps ``tensorflow-cpu`` only, from the repository root:

    python3 -m venv /tmp/kh && /tmp/kh/bin/pip install -e ".[cpu]" keras-hub
    /tmp/kh/bin/python benchmarks/finetune_kerashub.py            # 3 rounds (see below)
    /tmp/kh/bin/python benchmarks/finetune_kerashub.py --quick    # smoke run (tiny sizes)
    /tmp/kh/bin/python benchmarks/finetune_kerashub.py --rounds 5 --json out.json
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import importlib.util
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INSTALL = 'python3 -m venv /tmp/kh && /tmp/kh/bin/pip install -e ".[cpu]" keras-hub'
MISSING = (
    "finetune_kerashub.py needs KerasHub, which beatloop does not install; in a venv of "
    f"its own (it pulls the full tensorflow): {INSTALL}, then run it with /tmp/kh/bin/python"
)
SIDES = ("beatloop", "fit", "beatloop_auto", "fit_1")
NAMES = {
    "beatloop": "beatloop, spe=32",
    "fit": "Keras fit, spe=32",
    "beatloop_auto": "beatloop, spe=auto",
    "fit_1": "Keras fit, spe=1",
}
STEPS = {"beatloop": 32, "fit": 32, "beatloop_auto": "auto", "fit_1": 1}
#: (beatloop side, fit side): at equal K, and each at its default K.
PAIRS = {"equal K=32": ("beatloop", "fit"), "defaults": ("beatloop_auto", "fit_1")}
#: The backbone (BERT-Tiny's shape) and the data.
SIZES = {
    "vocabulary": 30_522, "layers": 2, "hidden": 128, "heads": 2, "intermediate": 512,
    "length": 128, "examples": 2048, "validation": 512, "batch": 32,
}  # fmt: skip
QUICK_SIZES = {
    "vocabulary": 1000, "layers": 1, "hidden": 32, "heads": 2, "intermediate": 64,
    "length": 32, "examples": 512, "validation": 128, "batch": 16,
}  # fmt: skip
ACCUMULATE, EMA_DECAY, PEAK_RATE, WEIGHT_DECAY, WARMUP = 4, 0.99, 1e-3, 0.01, 0.1
CLASSES, CUES, CUES_EACH, FIRST_WORD, CLS, SEP = 2, 20, 6, 200, 101, 102


# --- in the child process --------------------------------------------------------------------


def peak_mb() -> float:
    """This process's peak resident memory so far, MB (``ru_maxrss``: ``VmHWM``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def arrays(count: int, sizes: dict, seed: int):
    """``(features, labels)``: sequences of ``[CLS]``, random words and ``[SEP]``, 32 to
    ``length`` tokens (a quarter of it in ``--quick``), id 0 padding; the label is the
    class of the ``CUES_EACH`` cue tokens put among the words (ids 1-20: class 0,
    21-40: class 1), learnable only from the tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    length = sizes["length"]
    lengths = rng.integers(length // 4, length + 1, count)
    mask = np.arange(length)[None, :] < lengths[:, None]
    tokens = rng.integers(FIRST_WORD, sizes["vocabulary"], (count, length))
    labels = rng.integers(0, CLASSES, count)
    rows = np.arange(count)[:, None]
    where = rng.integers(1, lengths[:, None] - 1, (count, CUES_EACH))
    tokens[rows, where] = 1 + labels[:, None] * CUES + rng.integers(0, CUES, (count, CUES_EACH))
    tokens[:, 0], tokens[np.arange(count), lengths - 1] = CLS, SEP
    tokens = np.where(mask, tokens, 0).astype(np.int32)
    features = {"token_ids": tokens, "segment_ids": np.zeros_like(tokens), "padding_mask": mask}
    return features, labels.astype(np.int32)


def batches(sizes: dict):
    """The training and validation ``({features}, labels)`` batches, prefetched."""
    import tensorflow as tf

    def batched(count, seed):
        data = tf.data.Dataset.from_tensor_slices(arrays(count, sizes, seed))
        return data.batch(sizes["batch"]).prefetch(tf.data.AUTOTUNE)

    return batched(sizes["examples"], 0), batched(sizes["validation"], 1)


def classifier(sizes: dict):
    """The BERT classifier from KerasHub's constructors, seeded: the same weights on
    every side."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=sizes["vocabulary"], num_layers=sizes["layers"],
        num_heads=sizes["heads"], hidden_dim=sizes["hidden"],
        intermediate_dim=sizes["intermediate"], max_sequence_length=sizes["length"],
    )  # fmt: skip
    return keras_hub.models.BertTextClassifier(backbone, num_classes=CLASSES, preprocessor=None)


def updates_per_epoch(sizes: dict) -> int:
    return -(-sizes["examples"] // sizes["batch"]) // ACCUMULATE


def adamw(sizes: dict, epochs: int, per_update: int = 1, **options):
    """AdamW on a linear warm-up to ``PEAK_RATE`` then a cosine decay to 0, counted in
    updates (``per_update=1``) or in micro-batches (``per_update=ACCUMULATE``: the count
    Keras's ``gradient_accumulation_steps`` feeds a schedule)."""
    import keras

    updates = epochs * updates_per_epoch(sizes)
    warmup = max(1, round(WARMUP * updates))
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, (updates - warmup) * per_update, warmup_target=PEAK_RATE,
        warmup_steps=warmup * per_update,
    )  # fmt: skip
    optimizer = keras.optimizers.AdamW(schedule, weight_decay=WEIGHT_DECAY, **options)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


class Stamps:
    """Wall and CPU clocks at each epoch's start and at the fit's end: an epoch runs to
    the next one's start, so the work either side does after its epoch-end callbacks
    (beatloop's checkpoint) counts."""

    def __init__(self):
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def stamp(self, *_, **__):
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def epochs(self) -> dict[str, list[float]]:
        return {
            "epoch_seconds": [b - a for a, b in zip(self.wall, self.wall[1:], strict=False)],
            "cpu_seconds": [b - a for a, b in zip(self.cpu, self.cpu[1:], strict=False)],
        }


def time_beatloop(sizes: dict, epochs: int, steps, run_dir: Path) -> dict:
    from common import as_the_others

    import beatloop

    stamps = Stamps()

    class Timer(beatloop.Callback):
        on_epoch_start = on_fit_end = stamps.stamp

    train, validation = batches(sizes)
    result = beatloop.fit(
        "supervised",
        data=(train, validation),
        models={"model": classifier(sizes)},
        optimizers={"optimizer": adamw(sizes, epochs)},
        config={"accumulate": ACCUMULATE, "ema_decay": EMA_DECAY, "classes": CLASSES},
        keep_best="val_loss:min",
        run_dir=run_dir,
        epochs=epochs,
        seed=0,
        steps_per_execution=steps,
        progress=False,
        callbacks=[Timer()],
        **as_the_others(),
    )
    history = result.history
    return {
        **stamps.epochs(),
        "steps_per_execution": result.steps_per_execution,
        "accuracy": history["accuracy"],
        "val_accuracy": history["val_accuracy"],
        "val_loss": history["val_loss"],
        "best_epoch": result.best["epoch"] if result.best else None,
    }


def time_fit(sizes: dict, epochs: int, steps: int, run_dir: Path) -> dict:
    import keras

    stamps = Stamps()

    class Timer(keras.callbacks.Callback):
        on_epoch_begin = on_train_end = stamps.stamp

    train, validation = batches(sizes)
    model = classifier(sizes)
    optimizer = adamw(
        sizes, epochs, ACCUMULATE, gradient_accumulation_steps=ACCUMULATE, use_ema=True,
        ema_momentum=EMA_DECAY ** (1 / ACCUMULATE),
    )  # fmt: skip
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps,
    )
    best = keras.callbacks.ModelCheckpoint(
        run_dir / "best.keras", monitor="val_loss", save_best_only=True
    )
    callbacks = [Timer(), keras.callbacks.SwapEMAWeights(swap_on_epoch=True), best]
    history = model.fit(
        train, validation_data=validation, epochs=epochs, shuffle=False, verbose=0,
        callbacks=callbacks,
    ).history  # fmt: skip
    losses = history["val_loss"]
    return {
        **stamps.epochs(),
        "steps_per_execution": steps,
        "accuracy": history["accuracy"],
        "val_accuracy": history["val_accuracy"],
        "val_loss": losses,
        "best_epoch": 1 + losses.index(min(losses)),
    }


def child(side: str, epochs: int, quick: bool) -> dict:
    """One side's fit: its epochs' wall and CPU seconds, peak memory, what it learnt."""
    sizes = QUICK_SIZES if quick else SIZES
    try:
        import keras_hub  # noqa: F401  (with TensorFlow and Keras: the start's memory)
    except ImportError as error:
        raise SystemExit(f"{MISSING} ({error})") from None
    start = peak_mb()
    with tempfile.TemporaryDirectory(prefix="finetune-") as folder:
        if side.startswith("beatloop"):
            found = time_beatloop(sizes, epochs, STEPS[side], Path(folder))
        else:
            found = time_fit(sizes, epochs, STEPS[side], Path(folder))
    return {**found, "start_mb": start, "peak_mb": peak_mb()}


# --- in the parent process ----------------------------------------------------------------


def run_child(side: str, epochs: int, quick: bool) -> dict:
    command = [sys.executable, __file__, "--child", side, "--epochs", str(epochs)]
    done = subprocess.run(command + ["--quick"] * quick, capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{NAMES[side]} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(rounds: int, epochs: int, quick: bool) -> dict[str, list[dict]]:
    """Every side ``rounds`` times, the sides' order rotating each round."""
    found = {side: [] for side in SIDES}
    for number in range(rounds):
        turn = number % len(SIDES)
        for side in SIDES[turn:] + SIDES[:turn]:
            load = os.getloadavg()[0]
            run = {**run_child(side, epochs, quick), "load": load}
            found[side].append(run)
            kept = " ".join(f"{1000 * t:7,.0f}" for t in run["epoch_seconds"][1:])
            k = run["steps_per_execution"]
            accuracy = f"{run['accuracy'][-1]:.3f}, val {run['val_accuracy'][-1]:.3f}"
            print(f"round {number + 1}/{rounds}  {NAMES[side]:<19} K={k:<3} {kept} ms  peak "
                  f"{run['peak_mb']:,.0f} MB  accuracy {accuracy}  load {load:.1f}",
                  file=sys.stderr, flush=True)  # fmt: skip
    return found


def summary(runs: dict[str, list[dict]]) -> dict:
    """Per side: best and median kept epoch (pooled), the spread of the rounds' medians,
    the median kept epoch's CPU seconds, peak and start memory (medians of rounds);
    per pairing, fit / beatloop of each time and beatloop / fit of peak memory."""
    from common import epoch_figures

    sides = {}
    for side, rounds in runs.items():
        sides[side] = {
            **epoch_figures(rounds),
            "steps_per_execution": sorted({r["steps_per_execution"] for r in rounds}),
            "accuracy": statistics.median(r["accuracy"][-1] for r in rounds),
            "val_accuracy": statistics.median(r["val_accuracy"][-1] for r in rounds),
        }
    pairs = {}
    for pairing, (ours, theirs) in PAIRS.items():
        a, b = sides[ours], sides[theirs]
        pairs[pairing] = {key: b[key] / a[key] for key in ("best", "median", "cpu")}
        pairs[pairing]["memory"] = a["peak_mb"] / b["peak_mb"]
        pairs[pairing]["training_memory"] = (a["peak_mb"] - a["start_mb"]) / (
            b["peak_mb"] - b["start_mb"]
        )
    return {"sides": sides, "pairs": pairs}


def describe(sizes: dict, rounds: int, epochs: int) -> str:
    batches_ = -(-sizes["examples"] // sizes["batch"])
    return (
        f"BertTextClassifier (BertBackbone: vocabulary {sizes['vocabulary']:,}, "
        f"layers {sizes['layers']}, hidden {sizes['hidden']}, {sizes['heads']} heads, "
        f"intermediate {sizes['intermediate']}, sequence {sizes['length']}), AdamW, "
        f"warm-up + cosine, accumulate {ACCUMULATE}, EMA {EMA_DECAY}, keep-best val_loss:\n"
        f"{sizes['examples']:,} + {sizes['validation']:,} sequences in batches of "
        f"{sizes['batch']} = {batches_} batches, {updates_per_epoch(sizes)} updates an epoch; "
        f"{rounds} round(s) of {epochs} epochs a side, the first dropped"
    )


def print_report(header: str, found: dict) -> None:
    """Each side's figures, then fit / beatloop at equal K and at the defaults."""
    sides, pairs = found["sides"], found["pairs"]
    print(f"\n{header}")
    print(f"{'':<20}{'':>5}{'-- epoch, wall ms --':>22}{'CPU ms':>8}{'peak':>7}{'':>6}"
          f"{'start':>7}{'- accuracy -':>14}")  # fmt: skip
    print(f"{'side':<20}{'K':>5}{'best':>7}{'median':>8}{'spread':>7}{'median':>8}{'MB':>7}"
          f"{'':>6}{'MB':>7}{'train':>8}{'val':>6}")  # fmt: skip
    for side, v in sides.items():
        k = "/".join(str(k) for k in v["steps_per_execution"])
        print(f"{NAMES[side]:<20}{k:>5}{1000 * v['best']:>7,.0f}{1000 * v['median']:>8,.0f}"
              f"{v['spread']:>7}{1000 * v['cpu']:>8,.0f}{v['peak_mb']:>7,.0f}"
              f"{v['peak_spread']:>6}{v['start_mb']:>7,.0f}{v['accuracy']:>8.3f}"
              f"{v['val_accuracy']:>6.3f}")  # fmt: skip
    print(f"\n{'fit / beatloop (>1.0: beatloop faster)':<50}{'-- epoch time --':>22}"
          f"{'beatloop / fit memory':>24}")  # fmt: skip
    print(f"{'':<50}{'best':>7}{'median':>8}{'CPU':>7}{'peak':>10}{'above start':>14}")
    for pairing, (ours, theirs) in PAIRS.items():
        p = pairs[pairing]
        name = f"{pairing}: {NAMES[theirs]} / {NAMES[ours]}"
        print(f"{name:<50}{p['best']:>6.2f}x{p['median']:>7.2f}x{p['cpu']:>6.2f}x"
              f"{p['memory']:>9.3f}x{p['training_memory']:>13.3f}x")  # fmt: skip


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="fits per side (3)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs a fit, first dropped (3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, 1 round of 2")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure here")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick and not args.child:
        args.rounds, args.epochs = 1, 2
    if args.epochs < 2 or args.rounds < 1:
        parser.error("--epochs >= 2 (the first is dropped); --rounds >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if importlib.util.find_spec("keras_hub") is None:
        raise SystemExit(MISSING)
    if args.child:
        print(json.dumps(child(args.child, args.epochs, args.quick)))
        return 0
    began = time.perf_counter()
    sizes = QUICK_SIZES if args.quick else SIZES
    print(describe(sizes, args.rounds, args.epochs), file=sys.stderr, flush=True)
    runs = measure(args.rounds, args.epochs, args.quick)
    found = summary(runs)
    print_report(describe(sizes, args.rounds, args.epochs), found)
    from common import machine

    minutes = (time.perf_counter() - began) / 60
    loads = sorted(r["load"] for rounds in runs.values() for r in rounds)
    print(f"\n{machine()}; Python {platform.python_version()}; {minutes:.1f} minutes; load "
          f"average at the fits' starts {loads[0]:.1f}-{loads[-1]:.1f} (median "
          f"{statistics.median(loads):.1f})")  # fmt: skip
    if args.json:
        record = {"sizes": sizes, "epochs": args.epochs, "runs": runs, **found}
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
