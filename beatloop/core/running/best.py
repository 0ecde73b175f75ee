"""Keep the best epoch: the epoch-end checkpoint of the best epoch so far, by one figure.

``keep_best="val_loss:min"`` (``"FIGURE:max"``; ``"FIGURE"`` alone is ``min``;
``"quality"`` is the recipe's ``quality_figure``) compares each epoch's figure with the
best so far. The checkpoint saved at the end of a better epoch becomes *the best*:
``RunCheckpoints`` keeps it beside the newest ``max_to_keep`` (when it is not one of
them) until a better epoch's replaces it. The best is held in every checkpoint's host
state (so a resume, a rollback and a run killed between a save and ``run.json`` go on
comparing with it) and in ``run.json`` (``"best"``, what ``restore(best=True)`` reads),
which is rewritten, atomically, only once the new best checkpoint is whole: until then
``run.json`` names the previous best, which stays protected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from beatloop.core.compiled.averaged import evaluated_pairs, raw_figures
from beatloop.core.failures.errors import ConfigError
from beatloop.core.saving.record import read_run_json, update_run_json

MODES = ("min", "max")


def parse_keep_best(text: str | None, recipe) -> tuple[str, str] | None:
    """``keep_best`` as ``(figure, mode)``: ``FIGURE:min``, ``FIGURE:max``, ``FIGURE``
    (min), or ``quality`` (the recipe's ``quality_figure``); ``None``: not asked."""
    if text is None:
        return None
    if text.strip() == "quality":
        if recipe.quality_figure is None:
            raise ConfigError(
                f"recipe {recipe.name!r} declares no quality figure (quality_figure) for "
                "keep_best='quality': name one, e.g. keep_best='val_loss:min' "
                "(--keep-best val_loss:min)"
            )
        figure, mode = recipe.quality_figure
        return figure, mode
    figure, sep, mode = text.strip().rpartition(":")
    if not sep:
        figure, mode = mode, "min"
    if not figure or mode not in MODES:
        raise ConfigError(
            f"keep_best expects 'FIGURE:min' or 'FIGURE:max' (or 'quality'), got {text!r}"
        )
    return figure, mode


def check_figure(asked: tuple[str, str], parts, has_validation: bool) -> None:
    """Refuse a figure the run does not log, naming those it does (its beats' losses and
    its metrics, with ``val_`` when it has validation data, and the recipe's quality
    figure); a ``val_`` figure without validation data is refused as such."""
    figure = asked[0]
    quality = parts.recipe.quality_figure
    logged = list(parts.train_metrics.named())
    if has_validation:
        validated = dict.fromkeys(parts.validation_metrics.named(), 0.0)
        logged += list(validated)
        if evaluated_pairs(parts.bound.updates):  # the source's own, beside the average's
            logged += list(raw_figures(validated, parts.validation_metrics.prefix))
    unvalidated = lambda name: name.startswith("val_") and not has_validation  # noqa: E731
    if quality is not None and quality[0] not in logged and not unvalidated(quality[0]):
        logged.append(quality[0])
    if unvalidated(figure) and figure not in logged:
        raise ConfigError(
            f"keep_best={figure!r} is a validation figure, but this run has no validation "
            f"data: pass validation data, or keep the best by one of {', '.join(logged)}"
        )
    if figure in logged:
        return
    raise ConfigError(
        f"keep_best: the run logs no figure {figure!r}; it logs {', '.join(logged)} (and "
        "the recipe's epoch figures)"
    )


class BestKeeper:
    """The best epoch so far by ``figure`` (``mode``: ``"min"`` or ``"max"``), as
    ``{"figure", "mode", "epoch", "value", "checkpoint"}`` (``epoch``: finished epochs,
    counted from 1; ``checkpoint``: its name in the checkpoints folder). Off (``asked``
    ``None``) until a resumed checkpoint holds a best: a resume that does not say
    ``keep_best`` goes on with the one it finds, as it takes the seed."""

    def __init__(self, asked: tuple[str, str] | None):
        self.asked = asked
        self.best: dict | None = None

    @property
    def on(self) -> bool:
        return self.asked is not None

    @property
    def checkpoint(self) -> str | None:
        return None if self.best is None else self.best["checkpoint"]

    def consider(self, epoch: int, logs: Mapping[str, float]) -> bool:
        """Whether finished epoch ``epoch``'s figure beats the best so far (strictly: the
        earliest of equal epochs stays); if so it becomes the best, its checkpoint the
        one about to be saved (``settle``). A missing or non-finite figure never does."""
        if not self.on:
            return False
        figure, mode = self.asked
        value = logs.get(figure)
        if value is None or not math.isfinite(float(value)):
            return False
        value = float(value)
        if self.best is not None:
            old = self.best["value"]
            if (value >= old) if mode == "min" else (value <= old):
                return False
        self.best = {"figure": figure, "mode": mode, "epoch": epoch, "value": value}
        self.best["checkpoint"] = None  # the checkpoint about to be saved: this one
        return True

    def settle(self, path: str) -> None:
        """The new best's checkpoint was saved at ``path``."""
        self.best["checkpoint"] = Path(path).name

    def result(self) -> dict | None:
        """The best as a run's result holds it (a copy; ``None`` while there is none)."""
        return None if self.best is None else dict(self.best)

    def host_state(self) -> dict:
        """What a checkpoint holds of ``keep_best``: the figure and mode kept by, from
        the first checkpoint on (so a resume that does not say ``keep_best`` goes on with
        it before any epoch has ended), and the best so far (nothing for a run without
        it)."""
        if not self.on:
            return {}
        kept = {"keep_best": ":".join(self.asked)}
        return kept if self.best is None else {**kept, "best": dict(self.best)}

    def restore(self, host: Mapping, path: str, directory: Path) -> None:
        """Take the best a checkpoint at ``path`` holds: a ``checkpoint`` of ``None``
        names ``path`` itself. A resume asking for another figure or mode is refused; a
        best whose checkpoint is gone (a damaged newest one was skipped) is dropped."""
        stored = host.get("best")
        if "keep_best" in host:  # written by every checkpoint of the run, best or not
            kept = tuple(host["keep_best"].rsplit(":", 1))
        elif stored is not None:  # a checkpoint written before the figure was kept apart
            kept = (stored["figure"], stored["mode"])
        else:
            self.best = None
            return
        if self.asked is not None and self.asked != kept:
            raise ConfigError(
                f"the run in {directory.parent} keeps the best epoch by "
                f"{kept[0]}:{kept[1]}, not {self.asked[0]}:{self.asked[1]} (keep_best, "
                "--keep-best); nothing was changed: resume with the same keep_best, or use "
                "another run dir"
            )
        self.asked = kept
        self.best = None
        if stored is not None:
            name = stored.get("checkpoint") or Path(path).name
            if Path(directory, f"{name}.index").exists():
                self.best = {**stored, "checkpoint": name}

    def write(self, run_json: Path) -> None:
        """Record the best in ``run.json`` (rewritten whole, atomically; ``null`` while
        there is none)."""
        if self.on and run_json.exists():
            update_run_json(run_json, best=self.result())

    def recorded(self, run_json: Path) -> bool:
        """Whether ``run.json`` names the best this keeper holds (``True`` without
        ``keep_best`` or without a ``run.json``: nothing there to be wrong)."""
        if not self.on or not run_json.exists():
            return True
        return read_run_json(run_json).get("best") == self.result()


def best_keeper(engine) -> BestKeeper:
    """An engine's ``BestKeeper`` for its ``EngineOptions.keep_best``, the figure checked
    against those the run logs before anything trains."""
    asked = parse_keep_best(engine.options.keep_best, engine.parts.recipe)
    if asked is not None:
        check_figure(asked, engine.parts, engine.stream.has_validation)
    return BestKeeper(asked)
