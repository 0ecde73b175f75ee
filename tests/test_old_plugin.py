"""A plugin written against beatloop 0.1.0's docs (``tests/old_plugin``, the ``bl-distill``
package: commit 4e5dca6, when ``beatloop.data`` still existed) keeps working in this
release: installed with pip into a throwaway environment, it lists, shows, trains and
resumes bit-exactly, its broken sibling entry point is reported without stopping it, and
its old import paths give exactly the expected DeprecationWarnings, once each, pointed
at the plugin's own line. Its imports are never updated to the new paths: they are what
this file tests (tests/old_plugin/README.md)."""

import json
import re
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers import assert_same_weights, load_npz, same_weights, start_python, venv_holding

OLD_PLUGIN = Path(__file__).parent / "old_plugin"
WORKER = Path(__file__).parent / "workers" / "old_plugin_run.py"

pytestmark = pytest.mark.slow  # a venv, pip, the beatloop command and a worker: processes

#: Every DeprecationWarning the plugin triggers: one per old path it imports (the 0.1.0
#: docs showed ``from beatloop.data import digits``; everything else came from
#: ``import beatloop`` and ``from beatloop import ...``, still the public paths).
DEPRECATIONS = [
    "beatloop.data is deprecated since beatloop 0.2.0: use beatloop.datasets "
    "(the old path is removed in beatloop 0.4.0)",
]
#: The line in the plugin each one points at (its own import of the old path).
OLD_IMPORTS = ["from beatloop.data import digits"]
BROKEN = (
    "beatloop plugin 'bl_distill_broken' (bl-distill) was not loaded: import failed: "
    "ModuleNotFoundError: No module named 'bl_distill_missing_dependency'"
)


class Done(NamedTuple):
    """A process run to its end: its exit code, stdout and stderr."""

    returncode: int
    out: str
    err: str

    def check(self) -> "Done":
        """Itself, after failing the test (with the end of stderr) on a non-zero exit."""
        assert self.returncode == 0, f"exited with {self.returncode}:\n{self.err[-3000:]}"
        return self


def run_all(commands: dict, python: Path, timeout: float = 300) -> dict[str, Done]:
    """Run ``{name: (args, env)}`` with ``python`` all at once (each is mostly TensorFlow's
    start-up), to their ends (all killed on a hang or an error here)."""
    started = {
        name: start_python(*args, python=python, **env) for name, (args, env) in commands.items()
    }
    try:
        done = {}
        for name, process in started.items():
            out, err = process.communicate(timeout=timeout)
            done[name] = Done(process.returncode, out, err)
        return done
    finally:
        for process in started.values():
            if process.poll() is None:
                process.kill()
                process.communicate()


def beatloop_warnings(stderr: str) -> list[str]:
    """The warnings the beatloop command printed, one ``beatloop: warning: ...`` line each."""
    prefix = "beatloop: warning: "
    return [line[len(prefix) :] for line in stderr.splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def throwaway(tmp_path_factory) -> Path:
    """The python of a throwaway venv holding the old plugin (``helpers.venv_holding``)."""
    return venv_holding(OLD_PLUGIN, tmp_path_factory.mktemp("old_plugin"))


@pytest.fixture(scope="module")
def runs(throwaway, tmp_path_factory) -> tuple[dict[str, Done], Path]:
    """The processes the tests read, in the throwaway environment, started together: the
    listing (plugins loaded afresh, DeprecationWarnings shown), ``show``, a 3-epoch
    ``run`` into ``OUT/cli``, and the worker (its runs in ``OUT``, its record the last
    line of its stdout); and ``OUT``."""
    out = tmp_path_factory.mktemp("old_plugin_runs")
    run = ("run", "distill", "--epochs", "3", "--seed", "0", "--run-dir", out / "cli")
    commands = {
        # --refresh: the plugins are loaded (their modules imported), not read from the cache.
        "list": (
            ("-m", "beatloop", "list", "--verbose", "--refresh"),
            {"PYTHONWARNINGS": "default::DeprecationWarning"},
        ),
        "show": (("-m", "beatloop", "show", "distill"), {}),
        "run": (("-m", "beatloop", *run, "--callback", "distill_gap"), {}),
        "worker": ((WORKER, out), {}),
    }
    return run_all(commands, throwaway), out


@pytest.fixture(scope="module")
def worker_record(runs) -> tuple[dict, Path]:
    """The worker's record (one process: the plugin loaded, three runs) and the folder
    it wrote its weights to."""
    done, out = runs
    return json.loads(done["worker"].check().out.splitlines()[-1]), out


def test_list_shows_the_plugin_and_reports_its_broken_sibling(throwaway, runs):
    out, err = runs[0]["list"].check()[1:]
    line = next(line for line in out.splitlines() if line.startswith("distill "))
    assert "the student distilled from the teacher's soft outputs" in line
    assert line.endswith("[bl-distill]")
    assert "module: bl_distill.distill  plugin: distill" in out
    assert "callback distill_gap: bl_distill.gap.DistillGap [bl-distill]" in out
    failed = [line for line in out.splitlines() if line.startswith("failed plugin")]
    assert failed == [
        "failed plugin bl_distill_broken [bl-distill]: import failed: "
        "ModuleNotFoundError: No module named 'bl_distill_missing_dependency'"
    ]
    # On stderr, once each: the broken entry point, and every old path the plugin uses,
    # named with the plugin's file and line that uses it.
    warned = beatloop_warnings(err)
    located = [re.fullmatch(r"(.*) \(at (.*):(\d+)\)", line) for line in warned]
    assert sorted(m[1] for m in located if m) == sorted(DEPRECATIONS)
    assert [line for line, m in zip(warned, located, strict=True) if not m] == [BROKEN]
    for found in filter(None, located):
        assert found[2].endswith("site-packages/bl_distill/distill.py")
        source = Path(found[2]).read_text().splitlines()
        assert source[int(found[3]) - 1] in OLD_IMPORTS

    # From the cache (nothing changed): the same list, and the broken plugin's warning
    # shown again.
    cached = run_all({"list": (("-m", "beatloop", "list", "--verbose"), {})}, throwaway)["list"]
    assert cached.check().out == out
    assert BROKEN in beatloop_warnings(cached.err)


def test_the_live_environment_never_sees_the_plugin(throwaway):
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.distribution("bl-distill")


def test_show_prints_its_config_and_schedule(runs):
    out, err = runs[0]["show"].check()[1:]
    assert out.startswith("distill: A teacher and a student on digits")
    fields = [
        "teacher_hidden: int = 32", "student_hidden: int = 16", "temperature: float = 4.0",
        "alpha: float = 0.3", "noise: float = 0.05", "learning_rate: float = 0.01",
        "batch_size: int = 64",
    ]  # fmt: skip
    config = out.split("config:\n", 1)[1].split("\n\n", 1)[0]
    assert [line.strip() for line in config.splitlines()] == fields
    assert (
        "  1. logits: simultaneous forward=logits "
        "[teacher_loss: loss=teacher_loss optimizer=teacher_opt updates=teacher] "
        "[distillation: loss=distillation optimizer=student_opt updates=student]\n"
    ) in out
    # The teacher's 64-32-10 and the student's 64-16-10, each updated by its own beat.
    teacher = out.split("teacher_loss (4 variables):\n", 1)[1].split("distillation (", 1)[0]
    student = out.split("distillation (4 variables):\n", 1)[1]
    assert re.search(r"teacher/dense\w*/kernel \(64, 32\)", teacher)
    assert re.search(r"student/dense\w*/kernel \(64, 16\)", student)
    assert beatloop_warnings(err) == [BROKEN]


def test_run_learns_with_its_callback(runs):
    out, err = runs[0]["run"].check()[1:]
    run_dir = runs[1] / "cli"
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    # 1,437 training digits in batches of 64: 23 steps an epoch.
    assert [(row["epoch"], row["step"]) for row in rows] == [(1, 23), (2, 46), (3, 69)]
    teacher = [row["val_teacher_accuracy"] for row in rows]
    student = [row["val_student_accuracy"] for row in rows]
    # Ten classes (chance: 0.1); here about 0.94 and 0.81 after three epochs.
    assert teacher[-1] > 0.85 and student[-1] > 0.7
    assert student == sorted(student) and student[0] < student[-1] - 0.1
    distillation = [row["val_distillation"] for row in rows]
    assert distillation[-1] < distillation[0] - 0.2
    # The callback's figure, logged with each epoch, and its printed line.
    for epoch, row in enumerate(rows, 1):
        gap = row["val_teacher_accuracy"] - row["val_student_accuracy"]
        assert row["distill_gap"] == pytest.approx(gap, rel=1e-6, abs=1e-7)
        assert 0 < row["val_agreement"] <= 1
        line = (
            f"distill_gap epoch {epoch}: teacher {row['val_teacher_accuracy']:.4f} "
            f"student {row['val_student_accuracy']:.4f} gap {row['distill_gap']:+.4f} "
            f"agreement {row['val_agreement']:.4f}"
        )
        assert line in out.splitlines()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["recipe"] == "distill" and record["config"]["temperature"] == 4.0
    assert beatloop_warnings(err) == [BROKEN]  # the broken sibling, and only it


def test_it_resumes_bit_identical(worker_record):
    record, out = worker_record
    assert "distill" in record["recipes"] and record["origin"] == "bl-distill"
    assert record["failed"] == [
        [
            "bl_distill_broken",
            "bl-distill",
            "import failed: ModuleNotFoundError: No module named 'bl_distill_missing_dependency'",
        ]
    ]
    runs = record["runs"]
    first, resumed, whole = runs["first"], runs["resumed"], runs["whole"]
    assert (first["steps"], resumed["steps"], whole["steps"]) == (23, 46, 46)
    assert first["resumed_from"] is None and whole["resumed_from"] is None
    assert resumed["resumed_from"] == first["checkpoint"]  # the end of epoch 1
    # Both beats update every step: each optimizer applied once a step.
    assert resumed["applies"] == whole["applies"] == {"teacher_opt": 46, "student_opt": 46}
    assert resumed["history"] == whole["history"]  # every logged figure, bit for bit
    assert_same_weights(load_npz(out / "resumed.npz"), load_npz(out / "whole.npz"))
    # Epoch 2 trained after the resume: the match is between two trainings.
    assert not same_weights(load_npz(out / "first.npz"), load_npz(out / "resumed.npz"))
    # The callback's state came back from the checkpoint: the resumed run printed only
    # epoch 2, yet holds both epochs' figures, as the uninterrupted one does.
    assert resumed["printed"] == whole["printed"][1:] and len(whole["printed"]) == 2
    assert resumed["gaps"] == whole["gaps"] == whole["history"]["distill_gap"]
    assert resumed["agreements"] == whole["agreements"] == whole["history"]["val_agreement"]


def test_its_old_paths_warn_once_each_at_its_own_lines(worker_record):
    record, _ = worker_record
    caught = record["warnings"]  # loading the plugins, then three runs, in one process
    plugin_dir = str(Path(record["plugin_file"]).parent)
    beatloops = [
        warning
        for warning in caught
        if warning["category"] == "DeprecationWarning"
        and (
            "beatloop" in warning["message"]
            or warning["filename"].startswith(plugin_dir)
            or "/beatloop/" in warning["filename"]
        )
    ]
    assert [warning["message"] for warning in beatloops] == DEPRECATIONS
    source = Path(record["plugin_file"]).read_text().splitlines()
    for warning, statement in zip(beatloops, OLD_IMPORTS, strict=True):
        assert record["plugin_file"].endswith("site-packages/bl_distill/distill.py")
        assert warning["filename"] == record["plugin_file"]
        assert source[warning["lineno"] - 1] == statement
    # The broken entry point's warning, once, and nothing else from beatloop or the plugin.
    others = [warning for warning in caught if warning not in beatloops]
    assert [warning["message"] for warning in others if "beatloop" in warning["message"]] == [
        BROKEN
    ]
    assert not [warning for warning in others if warning["filename"].startswith(plugin_dir)]
