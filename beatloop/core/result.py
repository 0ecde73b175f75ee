"""What a finished run hands back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import keras

from beatloop.core.binding import BoundSchedule
from beatloop.core.recipe import Recipe


@attrs.frozen
class FitResult:
    """The outcome of :func:`beatloop.fit`: per-epoch history, trained parts, and where
    the run wrote its files."""

    recipe: Recipe
    config: Any
    history: Mapping[str, list[float]]
    bound: BoundSchedule
    seed: int
    steps: int
    epochs: int
    run_dir: Path | None = None
    artifacts: Mapping[str, Path] = attrs.field(factory=dict)

    @property
    def models(self) -> Mapping[str, keras.Layer]:
        """The trained models by name (``result.models["model"]``)."""
        return self.bound.models

    @property
    def optimizers(self) -> Mapping[str, keras.optimizers.Optimizer]:
        return self.bound.optimizers

    @property
    def schedule(self):
        return self.bound.schedule
