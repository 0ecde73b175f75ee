"""Messages made clear (issue 34, "Unclear"): the closing line of a run in phases, the
"did you mean" of a long word for a short field, ``beatloop data``'s shared paragraph
and ``beatloop show``'s defaults printed once, ``ModelCalls.get``'s own help, the
schedule of a registered recipe named in words, ``fit``'s links to its pages, what the
randomness check flags, and TensorFlow's start-up lines kept out of ``beatloop.fit``."""

from __future__ import annotations

import pydoc
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import keras
import pytest
import tensorflow as tf
from helpers import history_records, python_env, tuple_batches
from markdown.extensions.toc import slugify

import beatloop
from beatloop.cli import main
from beatloop.core.compiled.binding import bind
from beatloop.core.compiled.forward import ModelCalls
from beatloop.core.compiled.metrics import LazyLogs
from beatloop.core.failures.errors import did_you_mean
from beatloop.core.schedule.beats import Beat, Schedule
from beatloop.plugins import registry as registry_module
from beatloop.plugins.registry import Registry
from beatloop.recipes.supervised import Supervised

DOCS = Path(__file__).resolve().parents[1] / "docs"


def error_line(err: str) -> str:
    (line,) = err.strip().splitlines()
    return line


# --- 1. the closing line of a run in phases: one epoch's figures -----------------------


def test_the_closing_line_of_a_run_in_phases_holds_its_last_epochs_figures(tmp_path, capsys):
    run_dir = tmp_path / "run"
    command = [
        "run", "contrastive", "--epochs", "2", "--seed", "1", "--set", "pretrain_epochs=1",
        "--set", "hidden=8", "--set", "features=4", "--set", "projection=4",
        "--set", "batch_size=256", "--steps-per-execution", "4", "--quiet",
        "--run-dir", str(run_dir),
    ]  # fmt: skip
    assert main(command) == 0
    first = capsys.readouterr().out.splitlines()[0]
    last = history_records(run_dir)[-1]  # the probe phase's epoch
    figures = {k: v for k, v in last.items() if k not in ("epoch", "step")}
    assert "nt_xent" not in figures and "linear_probe" in figures
    expected = "  ".join(f"{k} {v:.4g}" for k, v in figures.items())
    assert first == f"contrastive: 2 epoch(s), {last['step']} steps, seed 1; {expected}"
    # The last epoch's figures are checkpointed: a run with nothing left to train, and
    # beatloop.restore, give the same.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "nothing to train"
        assert main(command) == 0
    # on_fit_start still fires (a resume notice comes first); the closing line follows
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("resumed from ckpt-")
    assert lines[1] == first
    assert beatloop.restore(run_dir).last_epoch == pytest.approx(figures)


# --- 2. did you mean, for a long word naming a short field -----------------------------


def test_a_long_word_for_a_short_field_gets_a_did_you_mean(capsys):
    assert main(["run", "dqn", "--set", "environment=cartpole"]) == 2
    assert error_line(capsys.readouterr().err).startswith(
        "beatloop: error: recipe 'dqn' has no config field 'environment' (did you mean 'env'?); "
        "fields: env, env_settings, "
    )
    assert main(["show", "supervised", "--set", "hidden_units=8"]) == 2
    assert "no config field 'hidden_units' (did you mean 'hidden'?)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, candidates, suggestion",
    [
        ("hiden", ["hidden", "env"], " (did you mean 'hidden'?)"),  # a near spelling first
        ("environment", ["env_settings", "env"], " (did you mean 'env'?)"),
        ("ENV", ["environment", "seed"], " (did you mean 'environment'?)"),
        ("lr", ["learning_rate", "lr_decay"], ""),  # two letters: contained anywhere
        ("x", ["max", "index"], ""),
        ("temperature", ["hidden", "seed"], ""),
    ],
)
def test_did_you_mean_takes_a_near_spelling_or_a_name_contained(name, candidates, suggestion):
    assert did_you_mean(name, candidates) == suggestion


# --- 3. and 4. said once ---------------------------------------------------------------


def test_data_prints_the_shared_parameters_once_before_the_kinds(capsys):
    assert main(["data"]) == 0
    out = capsys.readouterr().out
    assert out.count("Parameters every built-in source has.") == 1
    assert out.startswith("Parameters every built-in source has. batch_size: examples per batch")
    for kind in ("csv", "folder", "npz", "tfrecord"):
        block = out.split(f"\n{kind}: ", 1)[1].split("\n\n", 1)[0]
        assert "batch_size: int | None = None" in block  # each kind still lists them
    assert main(["data", "npz"]) == 0  # one kind: its block says it, once
    out = capsys.readouterr().out
    assert out.startswith("npz: ") and out.count("Parameters every built-in source has.") == 1


def test_show_prints_each_default_once_and_a_changed_value_with_its_default(capsys):
    assert main(["show", "multitask", "--set", "hidden=8"]) == 0
    config = capsys.readouterr().out.split("\nconfig:\n", 1)[1].split("\n\n", 1)[0]
    lines = config.splitlines()
    assert "  dwa_temperature: float = 2.0" in lines
    assert "  tasks: tuple[str, ...] = ('digit', 'ink')" in lines
    assert [line for line in lines if "(default" in line] == ["  hidden: int = 8  (default 64)"]


# --- 5. ModelCalls' own help for get ---------------------------------------------------


def test_model_calls_help_shows_its_own_get():
    text = pydoc.render_doc(beatloop.ModelCalls, renderer=pydoc.plaintext)
    get = text.split(" |  get(self, ", 1)[1].split("\n |  \n", 1)[0]
    assert "``models[name]``, or ``default`` when the recipe has no model ``name``." in get
    assert "layout" not in text  # Keras's LayoutMap text, which it writes on Mapping.get
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    calls = ModelCalls({"m": model}, frozenset())
    assert calls.get("nope") is None and calls.get("nope", 7) == 7
    assert calls.get("m")(tf.ones([3, 2])).shape == (3, 1)
    logs = LazyLogs({"loss": keras.metrics.Mean()})
    assert logs.get("loss") == 0.0 and logs.get("accuracy", -1.0) == -1.0
    assert "layout" not in pydoc.render_doc(LazyLogs, renderer=pydoc.plaintext)


# --- 6. the schedule of a registered recipe, in words ----------------------------------


class Noisy(Supervised):
    """Supervised, its loss on noisy inputs drawn from TensorFlow's global ops (test)."""

    name = "noisy_messages_test"

    def cross_entropy(self, models, batch):
        noisy = batch["x"] + tf.random.normal(tf.shape(batch["x"]))
        return super().cross_entropy(models, {**batch, "x": noisy})


def test_a_warning_names_the_schedule_of_a_registered_recipe_in_words(monkeypatch, small_digits):
    monkeypatch.setattr(registry_module, "_REGISTRY", Registry(load_entry_points=False))
    beatloop.register(Noisy)
    train, _ = small_digits
    with pytest.warns(beatloop.ResumeWarning) as caught:
        beatloop.fit(
            Noisy.name, data=tuple_batches(train, 100), config={"hidden": 8}, seed=0,
            progress=False,
        )  # fmt: skip
    (message,) = [str(w.message) for w in caught if issubclass(w.category, beatloop.ResumeWarning)]
    assert message.startswith(
        f"the schedule of recipe {Noisy.name!r} (registered by beatloop.register in module "
        f"{__name__}): the loss of beat 'loss' draws from TensorFlow's global random ops "
        "(RandomStandardNormal)"
    )


# --- 7. fit's docstring links its pages ------------------------------------------------


def test_fits_docstring_links_its_pages_and_their_sections():
    doc = beatloop.fit.__doc__
    assert not re.search(r"docs/[\w-]+\.md", doc)  # no page cited as plain text
    links = re.findall(r"\]\(([\w-]+\.md)(?:#([\w-]+))?\)", doc)
    assert {page for page, _ in links} == {
        "keras-callbacks.md", "speed.md", "checkpoints.md", "schedules.md",
    }  # fmt: skip
    for page, anchor in links:
        headings = re.findall(r"^#+ (.+)$", (DOCS / page).read_text(), re.M)
        assert not anchor or anchor in [slugify(h, "-") for h in headings], (page, anchor)


# --- 8. what the randomness check flags, as docs/plugins.md says -----------------------


class Jitter(keras.layers.Layer):
    """A custom layer adding noise from a global random op (test)."""

    def call(self, x):
        return x + tf.random.normal(tf.shape(x))


def bind_with(layers):
    """Bind one beat whose loss runs a model of ``layers`` then a Dense(1); the warnings."""
    model = keras.Sequential([keras.Input((4,)), *layers, keras.layers.Dense(1)])

    def loss(models, batch):
        return tf.reduce_mean(models["m"](batch["x"]) ** 2)

    spec = {"x": tf.TensorSpec([None, 4], tf.float32)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bind(
            Schedule(Beat("loss", "opt", updates="m", training=("m",))), {"m": model},
            {"opt": keras.optimizers.SGD()}, {"loss": loss}, spec, "mine",
        )  # fmt: skip
    return [str(w.message) for w in caught if issubclass(w.category, beatloop.ResumeWarning)]


def test_a_custom_layers_global_random_op_is_flagged_and_keras_random_layers_are_not():
    (message,) = bind_with([Jitter()])
    assert message.startswith(
        "mine: the loss of beat 'loss' draws from TensorFlow's global random ops "
        "(RandomStandardNormal)"
    )
    keras_layers = [
        keras.layers.Dropout(0.5),
        keras.layers.GaussianNoise(0.1),
        keras.layers.Reshape((2, 2, 1)),
        keras.layers.RandomFlip(),
        keras.layers.Flatten(),
    ]
    assert bind_with(keras_layers) == []
    unseeded = keras.layers.Lambda(lambda x: x + keras.random.normal(tf.shape(x)))
    assert bind_with([unseeded]) == []  # not flagged, as the page says
    text = " ".join((DOCS / "plugins.md").read_text().split())
    assert "a custom layer's `tf.random.normal` is flagged" in text
    assert "`keras.random` called with no `seed`" in text


# --- 9. TensorFlow's start-up lines kept out of beatloop.fit -----------------------------

#: A module whose import writes what TensorFlow's import writes to file descriptor 2
#: (from C++), between a line of the user's and a real error line.
IMPORTED = textwrap.dedent(
    """
    import os

    LINES = (
        "mine: before",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on. You may see ...",
        "I0000 00:00:1.0 1 cpu_feature_guard.cc:227] This TensorFlow binary is optimized ...",
        "E0000 00:00:1.0 1 some_op.cc:12] a real error",
        "mine: after",
    )
    os.write(2, "".join(line + "\\n" for line in LINES).encode())
    VALUE = 42
    """
)


def test_the_first_access_that_imports_tensorflow_filters_its_start_up_lines(
    tmp_path, monkeypatch, capfd
):
    (tmp_path / "start_up_lines_test.py").write_text(IMPORTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(beatloop._EXPORTS, "VALUE", "start_up_lines_test")
    monkeypatch.setattr(sys, "stderr", sys.__stderr__)  # descriptor 2, as in a script
    monkeypatch.delitem(sys.modules, "tensorflow")  # as before TensorFlow is imported
    try:
        assert beatloop.VALUE == 42
    finally:
        vars(beatloop).pop("VALUE", None)
        sys.modules.pop("start_up_lines_test", None)
    err = capfd.readouterr().err
    assert err.splitlines() == [
        "mine: before",
        "E0000 00:00:1.0 1 some_op.cc:12] a real error",
        "mine: after",
    ]
    monkeypatch.undo()  # TensorFlow imported: an import is not filtered
    monkeypatch.setattr(sys, "stderr", sys.__stderr__)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(beatloop._EXPORTS, "VALUE", "start_up_lines_test")
    try:
        assert beatloop.VALUE == 42
    finally:
        vars(beatloop).pop("VALUE", None)
        sys.modules.pop("start_up_lines_test", None)
    assert len(capfd.readouterr().err.splitlines()) == 6


@pytest.mark.slow
def test_beatloop_fit_in_a_script_prints_no_start_up_line(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        import beatloop

        print("mine: before", file=sys.stderr)
        beatloop.fit("supervised", epochs=1, steps_per_epoch=2, seed=0, progress=False,
                     config={"hidden": 8})
        print("mine: after", file=sys.stderr)
        """
    )
    env = python_env(TF_CPP_MIN_LOG_LEVEL=None)  # TensorFlow's own logging, as a user's
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["mine: before", "mine: after"]
