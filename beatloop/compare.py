"""``beatloop compare``: recipes (or configs of one recipe) side by side on a fixed
budget: one table of speed, memory, final losses and quality, a PNG of the loss curves
and a JSON file of every figure.

Each run goes in its own process (``python -m beatloop.compare SPEC``), so its timing is
not disturbed by the runs before it and its peak memory is its own.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs


@attrs.frozen
class Entry:
    """One run to compare: a recipe name and its config overrides (``--set`` texts)."""

    recipe: str
    settings: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return " ".join([self.recipe, *self.settings])

    @property
    def slug(self) -> str:
        text = "-".join([self.recipe, *self.settings])
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def parse_entries(tokens: Sequence[str]) -> list[Entry]:
    """``gan --set n_critic=1 gan --set n_critic=5 supervised`` -> three entries: each
    ``--set`` applies to the recipe named before it."""
    entries: list[tuple[str, list[str]]] = []
    tokens = list(tokens)
    while tokens:
        token = tokens.pop(0)
        if token == "--set" or token.startswith("--set="):
            value = (
                token.partition("=")[2] if token != "--set" else (tokens.pop(0) if tokens else "")
            )
            if not entries:
                raise ValueError(f"--set {value} comes before any recipe name")
            if not value:
                raise ValueError("--set needs FIELD=VALUE")
            entries[-1][1].append(value)
        elif token.startswith("-"):
            raise ValueError(f"unknown option {token!r} among the recipes to compare")
        else:
            entries.append((token, []))
    if not entries:
        raise ValueError("name at least one recipe to compare")
    return [Entry(name, tuple(settings)) for name, settings in entries]


def compare(
    entries: Sequence[Entry],
    *,
    epochs: int,
    out: Path,
    seed: int = 0,
    repeats: int = 1,
    steps_per_execution: int | str = "auto",
    data: str | None = None,
    data_settings: Sequence[str] = (),
    validation_data: str | None = None,
    timeout: float = 1800,
    echo=print,
) -> list[dict[str, Any]]:
    """Run every entry ``repeats`` times (medians reported), write ``out/compare.json``
    and ``out/loss_curves.png``, and return one row of figures per entry. ``data`` (a
    ``KIND:PATH`` source, its ``data_settings`` and ``validation_data``, see
    ``beatloop.sources.named.load_data``) replaces every recipe's built-in data."""
    from beatloop.core.errors import BeatloopError

    out.mkdir(parents=True, exist_ok=True)
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise BeatloopError(f"the same recipe and settings appear twice: {labels}")
    rows = []
    for entry in entries:
        runs = []
        for repeat in range(repeats):
            spec = {
                "recipe": entry.recipe,
                "settings": list(entry.settings),
                "epochs": epochs,
                "seed": seed,
                "steps_per_execution": steps_per_execution,
                "run_dir": str(out / entry.slug / f"run{repeat + 1}"),
                "data": data,
                "data_settings": list(data_settings),
                "validation_data": validation_data,
            }
            echo(f"{entry.label}: run {repeat + 1}/{repeats} ...")
            runs.append(_run_isolated(spec, timeout))
        rows.append(_summary(entry, runs))
    record = {"epochs": epochs, "seed": seed, "repeats": repeats, "rows": rows}
    if data is not None:
        record["data"] = {
            "source": data,
            "settings": list(data_settings),
            "validation": validation_data,
        }
    (out / "compare.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    plot_loss_curves(rows, out / "loss_curves.png")
    return rows


def _run_isolated(spec: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    from beatloop.core.errors import BeatloopError

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-m", "beatloop.compare", json.dumps(spec)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise BeatloopError(f"{spec['recipe']} did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BeatloopError(f"{spec['recipe']} {' '.join(spec['settings'])} failed: {detail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(entry: Entry, runs: list[dict[str, Any]]) -> dict[str, Any]:
    median = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    first = runs[0]
    return {
        "label": entry.label,
        "recipe": entry.recipe,
        "settings": list(entry.settings),
        "steps": first["steps"],
        "steps_per_second": median("steps_per_second"),
        "examples_per_second": median("examples_per_second"),
        "peak_memory_mb": median("peak_memory_mb"),
        "memory_growth_mb": median("memory_growth_mb"),
        "final_losses": {
            name: statistics.median(r["final_losses"][name] for r in runs)
            for name in first["final_losses"]
        },
        "quality": first["quality"],
        "quality_value": (
            None
            if first["quality"] is None
            else statistics.median(r["quality_value"] for r in runs)
        ),
        "loss_curves": first["loss_curves"],
    }


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The comparison as aligned text."""
    header = ["run", "steps/s", "examples/s", "peak MB", "final losses", "quality"]
    lines = []
    for row in rows:
        losses = "  ".join(f"{k} {v:.4g}" for k, v in row["final_losses"].items())
        quality = "-"
        if row["quality"] is not None and row["quality_value"] is not None:
            name, direction = row["quality"]
            arrow = "higher" if direction == "max" else "lower"
            quality = f"{name} {row['quality_value']:.4g} ({arrow} is better)"
        lines.append(
            [
                row["label"],
                f"{row['steps_per_second']:,.0f}",
                f"{row['examples_per_second']:,.0f}",
                f"{row['peak_memory_mb']:,.0f}",
                losses,
                quality,
            ]
        )
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    render = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return "\n".join([render(header), render(["-" * w for w in widths]), *map(render, lines)])


def plot_loss_curves(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """One panel per run, its beats' training losses per epoch, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 3.2), squeeze=False)
    for axis, row in zip(axes[0], rows, strict=True):
        for name, values in row["loss_curves"].items():
            axis.plot(range(1, len(values) + 1), values, marker="o", label=name)
        axis.set_title(row["label"], fontsize=9)
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend(fontsize=8)
    axes[0][0].set_ylabel("training loss")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


# --- one run, in its own process ---------------------------------------------------------


def _resident_mb() -> float:
    """This process's resident memory now, from /proc (Linux)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_one(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Train one entry and return its figures (what the parent process collects)."""
    import beatloop
    from beatloop.core.config import parse_settings
    from beatloop.plugins.registry import get_recipe

    cls = get_recipe(spec["recipe"])
    overrides = parse_settings(spec["settings"], cls.Config, f"recipe {cls.name!r}")
    timer = beatloop.TrainingTimer()
    data = None
    if spec.get("data") is not None:
        from beatloop.sources.named import load_data

        def data(recipe, seed):
            return load_data(
                spec["data"],
                spec.get("data_settings", ()),
                recipe=recipe,
                seed=seed,
                validation=spec.get("validation_data"),
            )

    before = _resident_mb()
    result = beatloop.fit(
        cls,
        config=overrides,
        epochs=spec["epochs"],
        seed=spec["seed"],
        steps_per_execution=spec["steps_per_execution"],
        run_dir=spec["run_dir"],
        callbacks=[timer],
        progress=False,
        data=data,
    )
    beats = [beat.name for beat in result.bound.beats]
    quality = cls.quality_figure
    value = None
    if quality is not None and quality[0] in result.history:
        value = result.history[quality[0]][-1]
    steps_per_second, examples_per_second = timer.rates()
    return {
        "steps": result.steps,
        "steps_per_second": steps_per_second,
        "examples_per_second": examples_per_second,
        "peak_memory_mb": _peak_mb(),
        "memory_growth_mb": max(_peak_mb() - before, 0.0),
        "final_losses": {name: result.history[name][-1] for name in beats},
        "quality": list(quality) if quality is not None and value is not None else None,
        "quality_value": value,
        "loss_curves": {name: result.history[name] for name in beats},
    }


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    figures = run_one(json.loads(sys.argv[1]))
    print(json.dumps(figures))
