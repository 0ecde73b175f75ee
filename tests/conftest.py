"""Shared fixtures (plain helper functions are in ``helpers.py``). TensorFlow is imported
once per test process, quietly."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest


@pytest.fixture(scope="session")
def digits():
    """The built-in digits split as arrays: ({"x", "y"} train, {"x", "y"} validation)."""
    from beatloop.data import digits_arrays

    return digits_arrays(seed=0)


@pytest.fixture(scope="session")
def small_digits(digits):
    """The first 200 training and 100 validation digits: enough to learn, fast to run."""
    train, validation = digits
    return (
        {k: v[:200] for k, v in train.items()},
        {k: v[:100] for k, v in validation.items()},
    )
