"""Plain helpers the tests share: weights to compare, small data sets, and a test recipe.

Tests import them as ``from helpers import ...`` (pytest puts this folder on sys.path,
as it does for ``conftest``); the scripts under ``workers/`` and ``fixtures/`` add this
folder to their path first. Fixtures live in ``conftest.py``; everything here is a
plain function or class, usable from a test, a fixture or a worker process alike.

Other Python processes start through ``start_python`` and ``run_python``: forked from a
zygote that has TensorFlow imported (``forked.py``), unless a test needs a fresh
interpreter (``fresh=True``, or an environment TensorFlow reads as it is imported).

Weights come in two shapes, and every comparison below takes either:

- a list of arrays, one model's (``model_weights``);
- a dict ``{"model/index": array}`` over several models, sorted by model name
  (``all_weights``): the same keys as the ``.npz`` files the workers write and
  ``load_npz`` reads back, so a run in another process compares key by key.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf
from forked import ForkedProcess, start_forked

import beatloop

Weights = Sequence[np.ndarray] | Mapping[str, np.ndarray]

#: The recipes beatloop ships, sorted: what ``beatloop list`` shows with no plugin.
BUILT_IN_RECIPES = [
    "contrastive", "dqn", "gan", "meta", "multitask", "ppo", "recommender",
    "risk_weighted", "style_transfer", "supervised",
]  # fmt: skip

# --- weights -------------------------------------------------------------------------------


def model_weights(model) -> list[np.ndarray]:
    """Copies of one model's weights (trainable and not), in the model's order."""
    return [np.array(v.numpy(), copy=True) for v in model.weights]


def all_weights(models: Mapping) -> dict[str, np.ndarray]:
    """Copies of every model's weights as ``{"name/index": array}``, by model name."""
    return {
        f"{name}/{index}": weight
        for name in sorted(models)
        for index, weight in enumerate(model_weights(models[name]))
    }


def load_npz(path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, read into memory (the file is closed again)."""
    with np.load(path) as archive:
        return {key: archive[key] for key in archive.files}


def _pairs(a: Weights, b: Weights) -> Iterable[tuple[str, np.ndarray, np.ndarray]]:
    """(label, a's array, b's array): by key for dicts (same keys asserted), by
    position for lists (same length asserted)."""
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        assert isinstance(a, Mapping) and isinstance(b, Mapping), "a dict against a list"
        assert sorted(a) == sorted(b), f"different weights: {sorted(a)} != {sorted(b)}"
        return [(key, a[key], b[key]) for key in sorted(a)]
    assert len(a) == len(b), f"{len(a)} weights against {len(b)}"
    return [(f"weight {index}", x, y) for index, (x, y) in enumerate(zip(a, b, strict=True))]


def largest_difference(first: Weights, second: Weights, *, same_names: bool = False) -> float:
    """The largest absolute difference of any weight between two runs, over ``first``'s
    names (``same_names``: and both hold exactly the same names)."""
    if same_names:
        assert sorted(first) == sorted(second), (sorted(first), sorted(second))
    return max(float(np.abs(np.asarray(first[k]) - np.asarray(second[k])).max()) for k in first)


def same_weights(a: Weights, b: Weights) -> bool:
    """Whether two sets of weights are equal to the bit (shapes included)."""
    return all(np.array_equal(x, y) for _, x, y in _pairs(a, b))


def assert_same_weights(a: Weights, b: Weights) -> None:
    """Fail, naming the first weight that differs, unless a and b are bit-identical."""
    for label, x, y in _pairs(a, b):
        np.testing.assert_array_equal(x, y, err_msg=label)


def assert_close_weights(a: Weights, b: Weights, *, rtol: float, atol: float) -> None:
    """Fail, naming the first weight that differs, unless a and b agree to tolerance
    (each test states its own, and why)."""
    for label, x, y in _pairs(a, b):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=label)


#: One unit in the last place of float32 at 1.0 (2**-23).
FLOAT32_ULP = float(np.finfo(np.float32).eps)


def assert_weights_within_ulps(a: Weights, b: Weights, ulps: int) -> None:
    """Fail unless every array of a is within ``ulps`` float32 units in the last place
    of b's, each array's unit taken at its largest magnitude: the round-off of the same
    steps run on another CPU (weights near zero are held to the array's scale, not their
    own, whose last place is far finer than any sum that produced them)."""
    for label, x, y in _pairs(a, b):
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        np.testing.assert_allclose(
            x, y, rtol=0, atol=ulps * FLOAT32_ULP * scale, err_msg=f"{label} beyond {ulps} ulp"
        )


def all_finite(models: Mapping) -> bool:
    """Whether every weight of every model is finite (no NaN, no Inf)."""
    return all(np.isfinite(w).all() for w in all_weights(models).values())


# --- data ----------------------------------------------------------------------------------


def tuple_batches(arrays: Mapping[str, np.ndarray], batch_size: int) -> tf.data.Dataset:
    """An unshuffled ``(x, y)`` pipeline, the way a user would build one."""
    return tf.data.Dataset.from_tensor_slices((arrays["x"], arrays["y"])).batch(batch_size)


def dict_batches(
    arrays: Mapping[str, np.ndarray], batch_size: int, count: int | None = None, **extra
) -> tf.data.Dataset:
    """Unshuffled batches of dicts: the first ``count`` rows (all by default) of every
    array in ``arrays``, plus any ``extra`` arrays under their keyword names."""
    rows = {key: values[:count] for key, values in {**arrays, **extra}.items()}
    return tf.data.Dataset.from_tensor_slices(rows).batch(batch_size)


def gan_data(count: int, batch_size: int = 32) -> tf.data.Dataset:
    """The first ``count`` training digits, pixels in [-1, 1], as unshuffled ``{"x"}``
    batches: what the GAN recipe trains on."""
    from beatloop.datasets import digits_arrays

    train, _ = digits_arrays(0, signed=True)
    return dict_batches({"x": train["x"]}, batch_size, count)


def model_variables(run_dir) -> dict[str, np.ndarray]:
    """Every model and optimizer variable, and the run's generator, in a run dir's latest
    checkpoint."""
    path = tf.train.latest_checkpoint(str(Path(run_dir) / "checkpoints"))
    reader = tf.train.load_checkpoint(path)
    names = [
        n
        for n, _ in tf.train.list_variables(path)
        if n.startswith(("model_variables", "optimizers", "random"))
    ]
    assert names
    return {name: reader.get_tensor(name) for name in names}


def history_records(run_dir) -> list[dict]:
    """The rows of a run dir's ``history.jsonl``, one an epoch, as the run logged them."""
    lines = (Path(run_dir) / "history.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


# --- other processes ----------------------------------------------------------------------


def python_env(**changes: str | None) -> dict[str, str]:
    """This process's environment with TensorFlow's C++ logging quiet, and ``changes``
    applied (a value of None removes the variable)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def start_python(
    *args: str, python=sys.executable, fresh: bool = False, **env: str | None
) -> subprocess.Popen | ForkedProcess:
    """Start ``python ARGS`` in the environment ``python_env`` gives for ``env``,
    its stdout and stderr read back as text; the caller waits for it. It is forked from
    a zygote with TensorFlow imported (``forked.py``) unless it must start afresh:
    ``fresh``, another ``python``, ``pip`` or ``venv``, or ``env`` changing more than a
    cluster's ``TF_CONFIG`` (a setting TensorFlow may read as it is imported)."""
    args = tuple(map(str, args))
    if _forkable(args, python, fresh, env):
        return start_forked(args, python_env(**env))
    command = [str(python), *args]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env(**env)
    )


def _forkable(args: tuple[str, ...], python, fresh: bool, env: dict) -> bool:
    return (
        not fresh
        and str(python) == sys.executable
        and args[:2] not in (("-m", "pip"), ("-m", "venv"))
        and set(env) <= {"TF_CONFIG"}
    )


def finish_all(processes: list[subprocess.Popen], timeout: float = 300) -> None:
    """Wait for every process (bounded) and fail on a non-zero exit, with the end of its
    stderr; on a failure or a hang, kill them all."""
    try:
        for process in processes:
            _, err = process.communicate(timeout=timeout)
            assert process.returncode == 0, err[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()


def finish(
    process: subprocess.Popen | ForkedProcess, timeout: float = 300, args: Sequence[str] = ()
) -> subprocess.CompletedProcess:
    """``process`` waited for to its end and its output read back, as a result naming
    ``args``; killed when it outlives ``timeout`` seconds (or the wait fails), so no
    process outlives its test."""
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def run_python(
    *args: str,
    python=sys.executable,
    timeout: float = 300,
    fresh: bool = False,
    **env: str | None,
) -> str:
    """Run ``python ARGS`` to its end as ``start_python`` starts it (killed after
    ``timeout`` seconds) and return its stdout; a non-zero exit fails the test with the
    end of its stderr."""
    done = finish(start_python(*args, python=python, fresh=fresh, **env), timeout, args)
    assert done.returncode == 0, f"{args} exited with {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def pip(python, *args) -> None:
    """The live environment's pip (22.3 or later: ``--python``), acting on the
    environment of ``python``."""
    run_python("-m", "pip", "--disable-pip-version-check", "-q", "--python", python, *args)


def venv_holding(package: Path, root: Path) -> Path:
    """The python of a new venv in ``root`` holding the package at ``package``,
    installed with pip as a user would. It sees the live environment's packages through
    a .pth that calls ``site.addsitedir`` on the live site-packages (a plain path line
    would skip the .pth files there, editable installs among them) and installs nothing
    else: TensorFlow is not installed twice. A build writes build/ and *.egg-info beside
    the sources, so it builds from a copy in ``root``, with the live setuptools (no
    isolated build environment to download)."""
    import shutil
    import sysconfig

    run_python("-m", "venv", "--without-pip", root / "venv")
    python = root / "venv" / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site_packages = Path(run_python("-c", purelib, python=python).strip())
    live = sysconfig.get_path("purelib")
    (site_packages / "live_environment.pth").write_text(f"import site; site.addsitedir({live!r})\n")
    skipped = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    source = shutil.copytree(package, root / "source", ignore=skipped)
    pip(python, "install", "--no-deps", "--no-build-isolation", "--no-index", source)
    return python


def worker(name: str):
    """The script ``workers/NAME.py`` imported as a module, to fit its runs in this
    process: a reference run compared with one killed in a process of its own costs
    no second TensorFlow start-up (tests/test_same_process.py: same bits either way)."""
    import importlib

    folder = str(Path(__file__).parent / "workers")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


# --- the TensorFlow DCGAN tutorial's loop -------------------------------------------------


def cross_entropy(targets, logits):
    """Mean sigmoid cross-entropy of logits, as the gan recipe computes it."""
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=targets, logits=logits))


def tutorial_dcgan_training(
    generator,
    discriminator,
    data,
    *,
    epochs: int,
    seed: int,
    latent: int,
    optimizer=lambda: keras.optimizers.Adam(1e-3, beta_1=0.5),
    loss=cross_entropy,
):
    """The TensorFlow DCGAN tutorial's loop: one generated batch, one discriminator pass
    over real and fake, two tapes, then both optimizers apply their gradients. Noise is
    drawn from a generator seeded like a beatloop run's, so both draw the same numbers.
    ``optimizer`` makes each network's optimizer; ``loss`` is the cross-entropy."""
    g_optimizer, d_optimizer = optimizer(), optimizer()
    noise_source = tf.random.Generator.from_seed(seed)

    @tf.function
    def train_step(images):
        noise = noise_source.normal([tf.shape(images)[0], latent])
        with tf.GradientTape() as gen_tape, tf.GradientTape() as disc_tape:
            generated_images = generator(noise, training=True)
            real_output = discriminator(images, training=True)
            fake_output = discriminator(generated_images, training=True)
            # (This line before the next: in the other order grappler's arithmetic
            # optimizer sums the discriminator's gradients in another order.)
            disc_loss = loss(tf.ones_like(real_output), real_output) + loss(
                tf.zeros_like(fake_output), fake_output
            )
            gen_loss = loss(tf.ones_like(fake_output), fake_output)
        gen_grads = gen_tape.gradient(gen_loss, generator.trainable_variables)
        disc_grads = disc_tape.gradient(disc_loss, discriminator.trainable_variables)
        g_optimizer.apply_gradients(zip(gen_grads, generator.trainable_variables, strict=True))
        d_optimizer.apply_gradients(zip(disc_grads, discriminator.trainable_variables, strict=True))

    for _ in range(epochs):
        for batch in data:
            train_step(batch["x"])


def twin_models(recipe, data, seed=3):
    """The recipe's models twice, each built after seeding Keras with ``seed``: the same
    initial weights and the same dropout seeds."""
    keras.utils.set_random_seed(seed)
    ours = recipe.build_models(data.element_spec)
    keras.utils.set_random_seed(seed)
    theirs = recipe.build_models(data.element_spec)
    return ours, theirs


# --- models and recipes --------------------------------------------------------------------


def classifier(hidden: int = 16, seed: int = 0, extra_layers=()) -> keras.Model:
    """A small seeded digits classifier, built (so its initial weights are fixed)."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"), *extra_layers]
    return keras.Sequential([*layers, keras.layers.Dense(10)])


class TwoModels(beatloop.Recipe):
    """Two small models, each fitted by its own beat (test recipe).

    Models ``a`` and ``b`` are each one Dense(1) over 64 inputs (after a Dropout of
    ``dropout``, if not 0), built from ``seed``; ``a`` reads batch key ``inputs[0]``,
    ``b`` reads ``inputs[1]``. Beat ``fit_a`` (optimizer ``opt_a``, SGD at
    ``learning_rate``) fits ``a`` to ``y`` by squared error, beat ``fit_b`` fits ``b``.
    The schedule is ``schedule``, or the two beats once each per step; build one with
    ``beat``. ``modes`` records ``(model, a training?, b training?)`` each time a
    loss runs (when traced, or every step in debug mode).
    """

    name = "two_models_test"

    def __init__(
        self,
        schedule: beatloop.Schedule | None = None,
        *,
        inputs: tuple[str, str] = ("x", "x"),
        dropout: float = 0.0,
        learning_rate: float = 0.1,
        seed: int = 0,
    ):
        super().__init__()
        if schedule is None:
            schedule = beatloop.Schedule((self.beat("a"), self.beat("b")))
        self._schedule = schedule
        self.inputs = dict(zip("ab", inputs, strict=True))
        self.batch_keys = {**{key: 2 for key in inputs}, "y": 1}
        self.dropout, self.learning_rate, self.seed = dropout, learning_rate, seed
        self.modes: list[tuple[str, bool, bool]] = []

    @staticmethod
    def beat(model: str, **options) -> beatloop.Beat:
        """The beat that fits ``model`` ("a" or "b"), with any Beat options."""
        return beatloop.Beat(
            loss=f"fit_{model}", optimizer=f"opt_{model}", updates=model, **options
        )

    def default_data(self, seed):
        raise NotImplementedError("a test passes its data")

    def build_models(self, batch_spec):
        keras.utils.set_random_seed(self.seed)
        dropout = [keras.layers.Dropout(self.dropout)] if self.dropout else []
        return {
            name: keras.Sequential([keras.Input((64,)), *dropout, keras.layers.Dense(1)], name=name)
            for name in ("a", "b")
        }

    def build_optimizers(self):
        return {f"opt_{name}": keras.optimizers.SGD(self.learning_rate) for name in ("a", "b")}

    def losses(self):
        def fit(name):
            def loss(models, batch):
                self.modes.append((name, models.is_training("a"), models.is_training("b")))
                target = tf.cast(batch["y"], tf.float32)[:, None]
                return tf.reduce_mean(tf.square(models[name](batch[self.inputs[name]]) - target))

            return loss

        return {"fit_a": fit("a"), "fit_b": fit("b")}

    def schedule(self):
        return self._schedule


class CountExecutions(beatloop.Callback):
    """Records how many steps each compiled call ran, in order, in ``steps``."""

    def __init__(self):
        self.steps: list[int] = []

    def on_execution_end(self, run, steps, logs):
        self.steps.append(steps)


def record_weights_per_loss(recipe: beatloop.Recipe, model_names: Sequence[str]) -> list:
    """Make ``recipe`` record the weights of ``model_names`` whenever one of its losses
    starts, and return the list the records go to: ``(loss name, {model: weights})``.

    Records are taken only when the loss runs eagerly (``fit(..., debug=True)``), so each
    one sits between two updates and consecutive records show what a beat changed."""
    records: list[tuple[str, dict[str, list[np.ndarray]]]] = []
    losses = recipe.losses

    def recording(name: str, loss: Callable) -> Callable:
        def loss_fn(models, batch):
            if tf.executing_eagerly():
                records.append((name, {m: model_weights(models.raw(m)) for m in model_names}))
            return loss(models, batch)

        return loss_fn

    recipe.losses = lambda: {name: recording(name, fn) for name, fn in losses().items()}
    return records


ROOT = Path(__file__).resolve().parents[1]
#: The documents whose code is run: the README and every page of the docs site.
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_PYTHON_BLOCK = re.compile(r"^(?:<!-- not run: ([^\n]*?) -->\n)?```python\n(.*?)^```", re.M | re.S)


class CodeBlock(NamedTuple):
    """A ```python block of a document: where it is, its code, and, for a block marked
    ``<!-- not run: REASON -->`` on the line before its fence, why it is not run."""

    document: Path
    line: int  # the line of the block's first line of code, counted from 1
    code: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    def run(self, namespace: dict) -> None:
        """Run the block with its lines numbered as in its document, so tracebacks, and
        AutoGraph reading a loss's source, find the document's own lines."""
        padding = "\n" * (self.line - 1)
        exec(compile(padding + self.code, str(self.document), "exec"), namespace)

    @property
    def shown_output(self) -> str:
        """The ```text block right after this one: what the document says it prints."""
        text = self.document.read_text()
        after = text[text.index(self.code) + len(self.code) :]
        match = re.match(r"```\n\n```text\n(.*?)```", after, re.S)
        assert match, f"{self.name}: no ```text block follows"
        return match[1]


def python_blocks(documents: Iterable[Path] = DOCUMENTS) -> list[CodeBlock]:
    blocks = []
    for document in documents:
        text = document.read_text()
        for match in _PYTHON_BLOCK.finditer(text):
            line = text[: match.start(2)].count("\n") + 1
            blocks.append(CodeBlock(document, line, match[2], match[1]))
    return blocks


def find_block(marker: str) -> CodeBlock:
    """The one ```python block, in the README or a docs page, that contains ``marker``."""
    (block,) = [block for block in python_blocks() if marker in block.code]
    return block
