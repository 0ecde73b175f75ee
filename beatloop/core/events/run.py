"""What callbacks see of the run in progress."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from beatloop.core.compiled.binding import BoundSchedule
from beatloop.core.compiled.counters import Counters
from beatloop.core.devices.workers import Worker
from beatloop.core.events.export import export_models
from beatloop.core.failures.errors import ConfigError


@attrs.define(eq=False)
class Run:
    """The run in progress, as callbacks see it: the recipe (a ``beatloop.Recipe``),
    its bound schedule and models, the counters, the recipe state, and where it writes.

    Set ``stop_training`` to end the run after the current epoch; record files the run
    writes for people (a sample grid, an image) in ``artifacts`` by name, so the CLI and
    the result can point to them.
    """

    recipe: Any
    bound: BoundSchedule
    counters: Counters
    run_dir: Path | None
    epochs: int
    #: How many steps each compiled call runs (``beatloop.core.running.pacing``).
    pace: Any
    steps_per_epoch: int | None
    seed: int
    stop_training: bool = False
    artifacts: dict[str, Path] = attrs.field(factory=dict)
    #: The checkpoint this run resumed from, if it did.
    resumed_from: str | None = None
    #: Paths of the checkpoints written so far by this process, oldest first.
    checkpoints: list[str] = attrs.field(factory=list)
    #: This process's place in a multi-worker run (``is_chief``: it writes the run dir;
    #: every worker must read logs at the same points, as reading them is collective).
    worker: Worker = attrs.field(factory=Worker)
    #: The training figures the epoch ending now leaves out of its logs, having no value:
    #: a mean over no step (every one, in an epoch a rollback skipped whole). Set before
    #: ``on_epoch_end``; a callback reading a figure skips the epoch when it is here.
    missing_figures: list[str] = attrs.field(factory=list)

    @property
    def steps_per_execution(self) -> int:
        """Steps per compiled call now (under ``"auto"``, the K being tried or chosen)."""
        return self.pace.steps

    @property
    def chosen_steps_per_execution(self) -> int | None:
        """The steps per call the run settled on (the fixed K at once; under ``"auto"``
        ``None`` until it has chosen)."""
        return self.pace.chosen

    @property
    def models(self):
        return self.bound.models

    @property
    def optimizers(self):
        return self.bound.optimizers

    @property
    def state(self) -> Counters:
        """The step counters (``counters``: step, epoch, examples), under the name earlier
        versions gave them; not the recipe state, which is ``recipe_state``."""
        return self.counters

    @property
    def recipe_state(self) -> dict[str, Any]:
        """The recipe state (``Recipe.build_state``) as it is now: each state variable's
        value as a NumPy array, by name (``{}`` for a recipe without any). Read it
        between compiled calls, as every event is; it is a copy, so writing to it
        changes nothing in the run."""
        return {name: variable.numpy() for name, variable in self.bound.state.items()}

    @property
    def step(self) -> int:
        """Steps run so far, over all epochs."""
        return int(self.counters.step)

    @property
    def epoch(self) -> int:
        """Epochs completed so far (during an epoch: its index, counted from 0)."""
        return int(self.counters.epoch)

    @property
    def examples(self) -> int:
        return int(self.counters.examples)

    def export(self, out: str | Path, *, checkpoint: str | None = None) -> dict[str, Path]:
        """Write the recipe's inference models as SavedModels in ``out/NAME``, as
        ``FitResult.export`` (and ``beatloop export``) writes them; return the paths. As
        the models are now, or with the weights of ``checkpoint``: one of this run's
        checkpoints, by name (``ckpt-7``, as ``run.json``'s ``best`` names the best
        epoch's) or path, the run's own weights put back after. From an event (between
        compiled calls), in the process that trains: nothing is rebuilt, no seed drawn.
        One worker of a multi-worker run may call it alone."""
        if checkpoint is not None and Path(checkpoint).name == checkpoint:
            if self.run_dir is None:
                raise ConfigError(
                    f"checkpoint {checkpoint!r} is named in a run dir, and this run has none: "
                    "pass its path"
                )
            checkpoint = str(Path(self.run_dir) / "checkpoints" / checkpoint)
        return export_models(self.recipe, self.bound, out, checkpoint)
