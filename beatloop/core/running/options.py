"""How the engine runs steps, independent of what the recipe computes."""

from __future__ import annotations

import math

import attrs

from beatloop.core.compiled.loop import MAX_STEPS_PER_EXECUTION
from beatloop.core.failures.fields import FieldError, one_line_frozen
from beatloop.core.running.pacing import AUTO_CEILING

ON_NAN = ("raise", "rollback")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")

_int = attrs.validators.instance_of(int)
_bool = attrs.validators.instance_of(bool)
#: How many of a beat's latest losses the divergence guard's median is taken over.
DIVERGENCE_WINDOW = 100


def _steps_per_execution(instance, attribute, value) -> None:
    """An integer K in [1, MAX_STEPS_PER_EXECUTION), or ``"auto"``."""
    if value == "auto":
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value < MAX_STEPS_PER_EXECUTION
    ):
        wanted = f"an int >= 1 and < {MAX_STEPS_PER_EXECUTION}, or 'auto'"
        raise FieldError("EngineOptions", attribute.name, f" takes {wanted}, got {value!r}")


def _factor(instance, attribute, value) -> None:
    """``None``, or a finite number above 1 (not a bool)."""
    number = not isinstance(value, bool) and isinstance(value, int | float)
    if value is None or (number and math.isfinite(value) and value > 1):
        return
    wanted = "None or a finite number > 1 (the factor over the running median)"
    raise FieldError("EngineOptions", attribute.name, f" takes {wanted}, got {value!r}")


@one_line_frozen
class EngineOptions:
    """How the engine runs steps, independent of what the recipe computes.

    ``steps_per_execution``: steps per compiled call, or ``"auto"``: the engine times its
    calls and chooses (the speed page says how). ``steps_per_epoch``: end epochs after
    that many steps (needed for endless data; the engine takes the recipe's
    ``Recipe.steps_per_epoch`` when this is ``None``). ``checkpoint_every``: also checkpoint
    mid-epoch, at the first call boundary at or after every N steps (a run with a run dir
    always checkpoints at each epoch's end). ``max_to_keep``: checkpoints kept on disk.
    ``on_nan``: what a non-finite loss or gradient norm does: ``"raise"`` stops the run,
    ``"rollback"`` restores the last checkpoint and goes on after the offending batch, at
    most ``max_rollbacks`` times. ``check_gradients=False``: the guard checks the losses
    only (no reduction of every gradient each step): a non-finite gradient of a finite
    loss is then found at the first loss it makes non-finite. ``divergence``: also fault
    (as ``on_nan`` says) at a step where a beat's ``|loss|`` is above ``divergence``
    times the median of its ``|loss|`` over its last ``divergence_window`` steps (see
    ``DivergenceGuard``); ``None`` (the default) builds no part of it. ``debug``: run the
    steps eagerly and stop before a non-finite (or diverged) update. ``jit_compile``:
    compile the training and validation steps with XLA. ``precision``:
    ``"mixed_float16"`` or ``"mixed_bfloat16"`` builds the recipe's models under that
    Keras policy (float32 variables, half-precision compute; outputs
    reach the losses as float32), and for float16 wraps every optimizer in loss scaling.
    ``keep_best``: keep the checkpoint of the best epoch by a figure (``"val_loss:min"``,
    ``"FIGURE:max"``, ``"quality"``: the recipe's ``quality_figure``; ``None``: off, or on
    a resume the run's own) beside the newest ``max_to_keep`` (``core/running/best.py``).
    """

    steps_per_execution: int | str = attrs.field(default=1, validator=_steps_per_execution)
    debug: bool = attrs.field(default=False, validator=_bool)
    steps_per_epoch: int | None = attrs.field(
        default=None, validator=attrs.validators.optional([_int, attrs.validators.ge(1)])
    )
    checkpoint_every: int | None = attrs.field(
        default=None, validator=attrs.validators.optional([_int, attrs.validators.ge(1)])
    )
    max_to_keep: int = attrs.field(default=3, validator=[_int, attrs.validators.ge(1)])
    on_nan: str = attrs.field(default="raise", validator=attrs.validators.in_(ON_NAN))
    max_rollbacks: int = attrs.field(default=3, validator=[_int, attrs.validators.ge(0)])
    jit_compile: bool = attrs.field(default=False, validator=_bool)
    precision: str = attrs.field(default="float32", validator=attrs.validators.in_(PRECISIONS))
    divergence: float | None = attrs.field(default=None, validator=_factor)
    divergence_window: int = attrs.field(
        default=DIVERGENCE_WINDOW, validator=[_int, attrs.validators.ge(1)]
    )
    keep_best: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )
    check_gradients: bool = attrs.field(default=True, validator=_bool)

    @property
    def largest_steps_per_execution(self) -> int:
        """The most steps a call may run: K, or under ``"auto"`` the largest K it tries
        (what the compiled loops are built for; a call may always run fewer)."""
        if self.steps_per_execution == "auto":
            return AUTO_CEILING
        return self.steps_per_execution
