"""Edges met porting keras-io's PPO and checking accumulation by hand: a recipe's epoch
figure named as the run's own ``<beat>_updates`` count, a float32 model passed to a
mixed-precision run, many accumulating fits in one process, and an optimizer's own
clipping under a strategy."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import keras
import pytest
from gated_recipes import Classifier, digit_batches
from helpers import run_python

import beatloop

WORKERS = Path(__file__).parent / "workers"


def fit(recipe, data, epochs=1, **options):
    options = {"seed": 0, "progress": False, "steps_per_execution": 1, **options}
    return beatloop.fit(recipe, data=data, epochs=epochs, **options)


class Counting(Classifier):
    """The gated classifier with an epoch figure of the recipe's own, ``figure``."""

    def __init__(self, figure: str, **beat):
        super().__init__(**beat)
        self.figure = figure

    def epoch_figures(self, run):
        return {self.figure: 123.0}


def test_an_epoch_figure_named_as_a_beats_update_count_is_refused():
    with pytest.raises(beatloop.ConfigError) as caught:
        fit(Counting("loss_updates", only_if="bright"), digit_batches(50))
    assert str(caught.value) == (
        "recipe 'gated_classifier_test': epoch_figures() returns 'loss_updates', which the "
        "run logs itself (the number of updates 'loss' made in the epoch); give the "
        "recipe's figure another name, so neither replaces the other"
    )
    result = fit(Counting("policy_updates", only_if="bright"), digit_batches(50))
    assert result.history["policy_updates"] == [123.0]
    assert result.history["loss_updates"][0] < 4  # the run's own count, kept


def test_a_float32_model_passed_to_a_mixed_precision_run_is_named_in_a_warning():
    from helpers import classifier

    from beatloop.core.failures.errors import IgnoredSettingWarning

    data = digit_batches(50)
    with pytest.warns(IgnoredSettingWarning) as caught:
        fit("supervised", data, models={"model": classifier(16)}, precision="mixed_float16")
    (message,) = [str(w.message) for w in caught if w.category is IgnoredSettingWarning]
    assert message == (
        "precision='mixed_float16' has no effect on model 'model' passed in models=: it was "
        "built under the float32 policy, so it computes in float32, under loss scaling; "
        "build it under the policy (keras.mixed_precision.set_global_policy("
        "'mixed_float16') before creating it) to compute in float16"
    )
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        mixed = classifier(16)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", IgnoredSettingWarning)
        fit("supervised", data, models={"model": mixed}, precision="mixed_float16")


class _Lines(logging.Handler):
    """The messages TensorFlow's Python logger emits while installed."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_many_accumulating_fits_in_one_process_trace_no_flush_anew():
    """TensorFlow counts a tf.function's traces by its Python code, shared by every run's
    step: from the fifth fit, one traced per fit warned of retracing. Five fits, each of
    two batches of two rows (one accumulated update and its flush)."""
    logger, lines = logging.getLogger("tensorflow"), _Lines()
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.WARNING)
    try:
        for _ in range(5):
            fit(Classifier(accumulate=2), digit_batches(2, count=4))
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    assert [line for line in lines.lines if "retracing" in line] == []


@pytest.mark.slow
def test_an_optimizers_own_clipping_on_two_replicas_equals_one_device(tmp_path):
    """Keras clips what each replica hands its optimizer: without the global gradients
    handed once, each replica's half was clipped at accumulate=1 (and the global sum at
    accumulate=4), about 1e-2 away from one device (``workers/optimizer_clip_mirrored.py``)."""
    out = tmp_path / "clip.json"
    run_python(WORKERS / "optimizer_clip_mirrored.py", out)
    report = json.loads(out.read_text())
    assert report["replicas"] == 2
    for name, figures in report["runs"].items():
        assert figures["moved"] > 1e-3, name
        assert figures["max_difference"] < 1e-6, name
