"""Grappler's give-up lines (``E0000 ... meta_optimizer.cc:967] remapper failed: ...``,
printed from C++ to file descriptor 2 when a compiled loop is first called) stay off the
terminal, for the CLI and for ``beatloop.fit``; ``--verbose`` shows them, and what the
user's own code writes to stderr meanwhile still shows.

Whether TensorFlow prints the real line depends on the CPU (a conv gan's graph makes it
where oneDNN is on, and it is off by default on CPUs without AVX-512). So the step itself
writes a line shaped like Grappler's, from C++ to file descriptor 2 as Grappler does
(``tf.print`` in the traced loss), every step: the filter is tested on every machine, and
the real line, where this TensorFlow prints it, must be kept out alongside."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from helpers import python_env

from beatloop.core.feeding.grappler_lines import GIVE_UP

#: A recipe whose generator loss writes a Grappler-shaped line and a line of its own to
#: standard error at every step (``tf.print``: from C++, as Grappler writes).
SPEAKING = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    from beatloop.recipes.gan import Gan

    SHAPED = (
        "E0000 00:00:0.000000 0 meta_optimizer.cc:967] remapper failed: "
        "INVALID_ARGUMENT: shaped like Grappler's, written by the test's step"
    )


    class Speaking(Gan):
        name = "speaking_gan"

        def generator_loss(self, models, batch):
            tf.print(SHAPED, output_stream=sys.stderr)
            tf.print("user line from the step", output_stream=sys.stderr)
            return super().generator_loss(models, batch)
    """
)

#: The ``beatloop`` command, with the speaking recipe registered: each argument list
#: between ``--then`` is one command, in turn in this process, each command's output
#: ending with ``SEPARATOR`` on stdout and on stderr (file descriptor 2, as C++ writes).
COMMAND = textwrap.dedent(
    """
    import os
    import sys
    from beatloop.terminal import import_tensorflow_quietly

    import_tensorflow_quietly()  # as the command does, before the registry imports it
    from beatloop import cli
    from beatloop.plugins.registry import register
    from speaking import Speaking

    register(Speaking)
    commands = [[]]
    for argument in sys.argv[1:]:
        commands.append([]) if argument == "--then" else commands[-1].append(argument)
    for argv in commands:
        if cli.main(argv) != 0:
            sys.exit(1)
        print("{separator}", flush=True)
        sys.stderr.flush()
        os.write(2, b"{separator}\\n")
    """
)

#: ``beatloop.fit`` of the speaking recipe: 2 steps, one a call, once per argument in
#: turn, ``shown`` inside ``grappler_lines.shown()``; each fit's output ends with
#: ``SEPARATOR`` on stdout and on stderr (file descriptor 2).
FIT = textwrap.dedent(
    """
    import contextlib
    import os
    import sys
    import tensorflow as tf
    import beatloop
    from beatloop.core.feeding import grappler_lines
    from beatloop.datasets import digits_arrays
    from speaking import Speaking

    x = digits_arrays(0, signed=True)[0]["x"][:128]
    for setting in sys.argv[1:]:
        data = beatloop.DataSplit(tf.data.Dataset.from_tensor_slices({"x": x}).batch(64))
        recipe = Speaking(Speaking.Config(architecture="conv", quality_samples=32))
        with grappler_lines.shown() if setting == "shown" else contextlib.nullcontext():
            result = beatloop.fit(
                recipe, data=data, epochs=1, seed=0, progress=False, steps_per_execution=1
            )
        print(f"steps {result.steps}", flush=True)
        print("{separator}", flush=True)
        sys.stderr.flush()
        os.write(2, b"{separator}\\n")
    """
)

SHAPED, USER = "shaped like Grappler's", "user line from the step"


#: The line that ends each command's or fit's output in the scripts above.
SEPARATOR = "-- the next run --"


def run(tmp_path, script: str, *args: str) -> list[subprocess.CompletedProcess]:
    """Run ``script`` (with ``speaking.py`` beside it) to its end; it must succeed. One
    process for the runs it makes in turn (each process's TensorFlow start-up is the
    cost): each run's stdout and stderr, in order, as if it had had a process."""
    (tmp_path / "speaking.py").write_text(SPEAKING)
    (tmp_path / "script.py").write_text(script.replace("{separator}", SEPARATOR))
    done = subprocess.run(
        [sys.executable, str(tmp_path / "script.py"), *args],
        capture_output=True, text=True, timeout=600, env=python_env(), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    outs, errs = done.stdout.split(SEPARATOR + "\n"), done.stderr.split(SEPARATOR + "\n")
    assert outs[-1] == "" and len(outs) == len(errs), done.stderr[-3000:]
    return [
        subprocess.CompletedProcess(done.args, 0, out, err)
        for out, err in zip(outs[:-1], errs[:-1], strict=False)
    ]


def said(stderr: str) -> tuple[list[str], list[str]]:
    """(the step's lines in order, "shaped" or "user"; the real Grappler give-up lines)."""
    steps, real = [], []
    for line in stderr.splitlines():
        if SHAPED in line:
            steps.append("shaped")
        elif USER in line:
            steps.append("user")
        elif GIVE_UP.search(line):
            real.append(line)
    return steps, real


def calls(*sizes: int, hidden: bool) -> list[str]:
    """The step's lines for compiled calls of ``sizes`` steps: the first call's
    Grappler-shaped lines dropped when ``hidden``."""
    lines = []
    for number, size in enumerate(sizes):
        lines += (["user"] if hidden and number == 0 else ["shaped", "user"]) * size
    return lines


@pytest.mark.slow
def test_the_cli_keeps_grappler_s_lines_off_stderr_and_verbose_shows_them(tmp_path):
    command = ["run", "speaking_gan", "--set", "architecture=conv", "--set", "batch_size=256"]
    command += ["--set", "quality_samples=32", "--epochs", "1", "--steps-per-execution", "3"]
    # One process, the quiet command first (as a process's first command: Grappler's
    # real line, where it prints one, comes with it), then the verbose one.
    quiet, shown = run(tmp_path, COMMAND, *command, "--quiet", "--run-dir",
                       str(tmp_path / "quiet"), "--then", *command, "--quiet", "--verbose",
                       "--run-dir", str(tmp_path / "verbose"))  # fmt: skip
    assert "6 steps" in quiet.stdout  # the run happened (1,437 digits in batches of 256)
    # Training: two calls of 3 steps, the first call's Grappler-shaped lines (and real
    # ones) dropped; then validation (360 digits: 2 steps, one call), a loop of its own.
    assert said(quiet.stderr) == (calls(3, 3, hidden=True) + calls(2, hidden=True), [])
    assert said(shown.stderr)[0] == calls(3, 3, hidden=False) + calls(2, hidden=False)


@pytest.mark.slow
def test_beatloop_fit_keeps_grappler_s_lines_off_stderr_but_not_the_user_s(tmp_path):
    # One process, the hidden fit first: Grappler printed its real line at the first fit
    # of a process only, and the hidden one is the fit that must drop it.
    hidden, shown = run(tmp_path, FIT, "hidden", "shown")
    assert hidden.stdout.split() == shown.stdout.split() == ["steps", "2"]
    # Two steps, one a call: the first (filtered) call's user line came through, and the
    # second call's lines, both of them; the real line, if this TensorFlow printed one
    # (``shown`` has it), was dropped with the first call's shaped one.
    assert said(hidden.stderr) == (calls(1, 1, hidden=True), [])
    assert said(shown.stderr)[0] == calls(1, 1, hidden=False)
