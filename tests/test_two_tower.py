"""The two-tower test recipe (tests/two_tower_recipe.py) trains on one device: both
tasks' losses fall in one epoch. ``benchmarks/replica_gaps.py`` compares it with two
replicas (docs/speed.md, "Many devices: where the gaps come from")."""

import numpy as np
from two_tower_recipe import TwoTower, two_tower_rows

import beatloop


def test_data_is_seeded_and_ratings_are_one_to_five():
    first, again = two_tower_rows(0), two_tower_rows(0)
    for key in first:
        np.testing.assert_array_equal(first[key], again[key])
    assert len(first["rating"]) == 1024
    assert first["rating"].min() >= 1 and first["rating"].max() <= 5


def test_both_tasks_learn_in_two_epochs():
    result = beatloop.fit(TwoTower(), epochs=2, seed=0, progress=False)
    history = result.history
    assert result.steps == 64
    assert history["rating"][1] < 0.7 * history["rating"][0]
    assert history["retrieval"][1] < history["retrieval"][0]
    assert set(result.models) == {"user", "item", "rating"}
