"""Faults a run used to pass over in silence: a loss that runs away with the divergence
guard off, and settings that have no effect on the run they are given to."""

from __future__ import annotations

import warnings

import pytest
from helpers import tuple_batches

import beatloop
from beatloop.core.errors import RunawayLossWarning


def _fit_warnings(**options) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        beatloop.fit("supervised", seed=0, **options)
    return [str(w.message) for w in caught if w.category is RunawayLossWarning]


# --- a runaway loss --------------------------------------------------------------------------


def test_a_runaway_loss_warns_once_naming_the_beat_the_epoch_and_the_loss(small_digits):
    data = (tuple_batches(small_digits[0], 50), tuple_batches(small_digits[1], 50))
    (message,) = _fit_warnings(data=data, epochs=3, config={"learning_rate": 1e9})
    head, _, advice = message.partition("; ")
    assert head.startswith("the loss of beat 'loss' ran away in epoch 1: ")
    assert " times its first value 2.3" in head  # the untrained model's loss, about ln 10
    assert advice == (
        "the run went on because the divergence guard is off: pass divergence=10 "
        "(--divergence 10) to stop a run whose loss runs away (a learning rate too high, say)"
    )
    with pytest.raises(beatloop.NumericsError) as caught:  # the advice, followed
        beatloop.fit("supervised", data=data, seed=0, config={"learning_rate": 1e9}, divergence=10)
    assert caught.value.exit_code == 4
    assert _fit_warnings(data=data, epochs=2) == []  # a loss that falls says nothing


def test_the_runaway_rule():
    from beatloop.core.numerics import runaway_words

    assert runaway_words("g", 2, float("inf"), 1.0).startswith(
        "the loss of beat 'g' ran away in epoch 3: inf, not finite; "
    )
    assert runaway_words("d", 0, 9e5, 1e-3) is None  # a first value below 1 counts as 1
    assert runaway_words("d", 0, -2e6, 1e-3).startswith(
        "the loss of beat 'd' ran away in epoch 1: -2e+06, over 1e+06 times its first value 0.001"
    )
    assert runaway_words("d", 0, 2e13, 3e7) is None  # large from the start: its own scale
