"""Grappler's ``remapper failed`` line (printed from C++ at a conv gan's first compiled
call) stays off the terminal, for the CLI and for ``beatloop.fit``; ``--verbose`` shows
it, and what the user's own code writes to stderr meanwhile still shows."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers import python_env

GRAPPLER = ("remapper", "meta_optimizer")


def run(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, env=python_env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_cli_keeps_grappler_s_line_off_stderr_and_verbose_shows_it(tmp_path):
    command = ["-m", "beatloop", "run", "gan", "--set", "architecture=conv"]
    command += ["--set", "batch_size=256", "--set", "quality_samples=32", "--epochs", "1"]
    quiet = run(*command, "--quiet", "--run-dir", str(tmp_path / "quiet"))
    assert not [line for line in quiet.stderr.splitlines() if any(w in line for w in GRAPPLER)]
    assert "6 steps" in quiet.stdout  # the run happened (1,437 digits in batches of 256)
    shown = run(*command, "--quiet", "--verbose", "--run-dir", str(tmp_path / "verbose"))
    assert "meta_optimizer.cc" in shown.stderr and "remapper failed" in shown.stderr


SCRIPT = textwrap.dedent(
    """
    import contextlib
    import sys
    import tensorflow as tf
    import beatloop
    from beatloop.core import grappler_lines
    from beatloop.data import digits_arrays
    from beatloop.recipes.gan import Gan


    class Speaking(Gan):
        def generator_loss(self, models, batch):
            tf.print("user line from the step", output_stream=sys.stderr)
            return super().generator_loss(models, batch)


    x = digits_arrays(0, signed=True)[0]["x"][:128]
    data = beatloop.DataSplit(tf.data.Dataset.from_tensor_slices({"x": x}).batch(64))
    recipe = Speaking(Gan.Config(architecture="conv", quality_samples=32))
    # Grappler printed its line at the first fit of a process only: one process a setting.
    with grappler_lines.shown() if sys.argv[1] == "shown" else contextlib.nullcontext():
        result = beatloop.fit(recipe, data=data, epochs=1, seed=0, progress=False)
    print(f"steps {result.steps}", flush=True)
    """
)


def test_beatloop_fit_keeps_grappler_s_line_off_stderr_but_not_the_user_s(tmp_path):
    script = tmp_path / "fit_conv_gan.py"
    script.write_text(SCRIPT)
    hidden, shown = run(str(script), "hidden"), run(str(script), "shown")
    assert hidden.stdout.split() == shown.stdout.split() == ["steps", "2"]
    assert not [line for line in hidden.stderr.splitlines() if any(w in line for w in GRAPPLER)]
    assert "remapper failed" in shown.stderr  # the same fit, not filtered, prints it
    # Two steps, one a call: the first (filtered) call's line came through, and the second's.
    assert hidden.stderr.count("user line from the step") == 2
    assert shown.stderr.count("user line from the step") == 2
