"""What ``beatloop compare`` shows of its rows: each figure's mean and 95% bootstrap
interval over the seeds, whether the best quality's lead stands out of the seed noise,
the table, and the loss curves with their seed band."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Resamples of a bootstrap interval, and the seed of its generator: the same figures
#: give the same interval, so a table printed twice reads the same.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 36


def bootstrap_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values`` (one per seed):
    ``BOOTSTRAP_RESAMPLES`` resamples with replacement from a fixed-seed generator, so
    the same values give the same interval. One value: the interval is that value. The
    interval is widened to hold the mean where a very skewed handful would leave it out."""
    import numpy as np

    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("a bootstrap interval needs at least one value")
    mean = float(data.mean())
    if data.size == 1:
        return mean, mean
    generator = np.random.default_rng(BOOTSTRAP_SEED)
    picks = generator.integers(0, data.size, size=(BOOTSTRAP_RESAMPLES, data.size))
    means = data[picks].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return min(float(low), mean), max(float(high), mean)


def quality_lead(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The best row by its quality figure's mean (``max`` or ``min`` as the figure says),
    and whether its lead is clear: measured over at least 2 seeds, and its interval
    overlaps no other row's. ``None`` unless 2 or more rows have a value of one and the
    same quality figure (different recipes' figures do not compare)."""
    scored = [
        r for r in rows if r.get("quality") is not None and r.get("quality_value") is not None
    ]
    if len(scored) < 2 or len({tuple(r["quality"]) for r in scored}) != 1:
        return None
    name, direction = scored[0]["quality"]
    pick = max if direction == "max" else min
    best = pick(scored, key=lambda r: r["quality_value"])
    span = lambda r: r.get("intervals", {}).get("quality_value", [r["quality_value"]] * 2)  # noqa: E731
    low, high = span(best)
    apart = all(high < span(r)[0] or low > span(r)[1] for r in scored if r is not best)
    clear = apart and min(len(r.get("seeds", [0])) for r in scored) >= 2
    return {"best": best["label"], "clear": clear, "figure": name}


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The comparison as aligned text; with several seeds each figure reads
    ``mean [low, high]``, and a last line says whether the best quality stands out."""
    seeds = max((len(row.get("seeds", [0])) for row in rows), default=1)
    spread = seeds > 1

    def cell(row: Mapping[str, Any], key: str, text: Callable[[float], str], name=None) -> str:
        value = row[key] if name is None else row[key][name]
        if not spread:
            return text(value)
        low, high = row["intervals"][key] if name is None else row["intervals"][key][name]
        return f"{text(value)} [{text(low)}, {text(high)}]"

    whole = (lambda v: f"{v:.0f}") if spread else (lambda v: f"{v:,.0f}")
    short = lambda v: f"{v:.4g}"  # noqa: E731
    header = ["run", "steps/s", "examples/s", "peak MB", "final losses", "quality"]
    lines = []
    for row in rows:
        losses = "  ".join(
            f"{name} {cell(row, 'final_losses', short, name)}" for name in row["final_losses"]
        )
        quality = "-"
        if row["quality"] is not None and row["quality_value"] is not None:
            name, direction = row["quality"]
            arrow = "higher" if direction == "max" else "lower"
            quality = f"{name} {cell(row, 'quality_value', short)} ({arrow} is better)"
        lines.append(
            [
                row["label"],
                cell(row, "steps_per_second", whole),
                cell(row, "examples_per_second", whole),
                cell(row, "peak_memory_mb", whole),
                losses,
                quality,
            ]
        )
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    render = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    table = [render(header), render(["-" * w for w in widths]), *map(render, lines)]
    if not spread:
        return "\n".join(table)
    lead = quality_lead(rows)
    if lead is not None:
        verdict = (
            "its lead is outside the others' intervals"
            if lead["clear"]
            else f"within the others' intervals: not distinguishable from seed noise at {seeds} "
            "seeds"
        )
        table.append(f"best {lead['figure']}: {lead['best']} \N{EM DASH} {verdict}")
    return "\n".join([f"mean [95% bootstrap interval] over {seeds} seeds", *table])


def plot_loss_curves(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """One panel per run, its beats' training losses per epoch, side by side; with
    several seeds each curve is the mean over the seeds, in a band from their lowest to
    their highest loss at each epoch (a bar at each epoch, which a one-epoch run needs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 3.2), squeeze=False)
    for axis, row in zip(axes[0], rows, strict=True):
        per_seed = row.get("per_seed", [])
        for name, values in row["loss_curves"].items():
            epochs = range(1, len(values) + 1)
            (line,) = axis.plot(epochs, values, marker="o", label=name)
            if len(per_seed) > 1:
                curves = np.array([s["loss_curves"][name] for s in per_seed])
                low, high = curves.min(axis=0), curves.max(axis=0)
                axis.fill_between(epochs, low, high, color=line.get_color(), alpha=0.2, lw=0)
                axis.vlines(epochs, low, high, color=line.get_color(), alpha=0.5)  # 1 epoch too
        seeds = f" ({len(per_seed)} seeds)" if len(per_seed) > 1 else ""
        axis.set_title(row["label"] + seeds, fontsize=9)
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend(fontsize=8)
    banded = any(len(row.get("per_seed", [])) > 1 for row in rows)
    axes[0][0].set_ylabel("training loss (mean, min-max band)" if banded else "training loss")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
