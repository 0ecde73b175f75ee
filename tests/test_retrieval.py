"""The recommender at catalogue scale: the items each user rated kept sparse and every
item scored a chunk at a time count exactly what one users x items product and a dense
table of seen pairs count (the recipe's computation before; same ties), the running
top-K is one ``top_k``'s, the vocabularies are the sorted ids, and the synthetic data is
drawn in memory that grows with users + items + ratings: where the dense draw fits, the
very data it drew."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import tensorflow as tf

import beatloop
from beatloop.recipes import recommender, recommender_data, retrieval
from beatloop.recipes.recommender_data import HELD_OUT, read_vocabulary, synthetic_ratings


def dense_unseen_above(users, items, own, rows, table):
    """The dense computation: every item scored at once, seen pairs a users x items table."""
    scores = tf.matmul(users, items, transpose_b=True)
    own_scores = tf.gather(scores, own, batch_dims=1)
    unseen = tf.equal(tf.gather(table, rows), 0)
    higher = tf.logical_and(scores > own_scores[:, None], unseen)
    return tf.reduce_sum(tf.cast(higher, tf.int32), axis=1)


def catalogue(seed: int, batch: int, count: int, users: int = 9):
    """Users, items with exact ties (repeated and zero vectors), own items, lookup rows
    (0: unknown) and random seen pairs, both dense and sparse."""
    rng = np.random.default_rng(seed)
    items = rng.normal(size=(count, 8)).astype(np.float32)
    items[1::5] = items[0]  # many items tie with item 0 for every user
    items[2::7] = 0.0
    vectors = rng.normal(size=(batch, 8)).astype(np.float32)
    own = rng.integers(0, count, size=batch)
    own[::3] = 0  # a row whose own item ties with many
    rows = rng.integers(0, users + 1, size=batch)
    table = (rng.random((users + 1, count)) < 0.3).astype(np.uint8)
    table[0] = 0
    table[rows[: batch // 2], own[: batch // 2]] = 1  # training rows: their item seen
    pair_rows, pair_columns = np.nonzero(table)
    seen = retrieval.SeenPairs.from_pairs(pair_rows, pair_columns, users)
    return [tf.constant(x) for x in (vectors, items, own, rows)], table, seen


@pytest.mark.parametrize("batch, count, chunk", [
    (1, 7, 8192), (5, 33, 16), (40, 300, 16), (40, 300, 100), (40, 300, 8192), (70, 257, 32),
])  # fmt: skip
def test_chunked_counts_equal_the_dense_computation_with_its_ties(batch, count, chunk):
    (users, items, own, rows), table, seen = catalogue(batch + count, batch, count)
    expected = dense_unseen_above(users, items, own, rows, tf.constant(table))
    np.testing.assert_array_equal(seen.table(count), table)
    sparse = (tf.constant(seen.starts), tf.constant(seen.items))
    traced = tf.function(retrieval.count_unseen_above, reduce_retracing=False)
    for pairs in (sparse, tf.constant(table)):
        eager = retrieval.count_unseen_above(users, items, own, rows, pairs, chunk)
        compiled = traced(users, items, own, rows, pairs, chunk)
        np.testing.assert_array_equal(eager.numpy(), expected.numpy())
        np.testing.assert_array_equal(compiled.numpy(), expected.numpy())
    assert batch == 1 or len(set(expected.numpy().tolist())) > 1  # counts differ row to row


def test_seen_pairs_keep_each_pair_once_by_row():
    seen = retrieval.SeenPairs.from_pairs(np.array([2, 1, 2, 2, 4]), np.array([5, 0, 1, 5, 3]), 4)
    assert [seen.rated(row).tolist() for row in range(5)] == [[], [0], [1, 5], [], [3]]


@pytest.mark.parametrize("k, chunk", [(1, 16), (10, 16), (10, 8192), (40, 48)])
def test_the_running_top_k_is_one_top_k_over_every_item(k, chunk):
    (users, items, _, _), _, _ = catalogue(k, 12, 300)
    expected = tf.math.top_k(tf.matmul(users, items, transpose_b=True), k=k)
    values, indices = retrieval.running_top_k(users, items, k, chunk)
    np.testing.assert_array_equal(indices.numpy(), expected.indices.numpy())
    np.testing.assert_array_equal(values.numpy(), expected.values.numpy())


def test_the_vocabularies_are_the_sorted_ids_and_each_user_s_rated_items():
    train, _ = synthetic_ratings(4, 50, 40, 15)
    data = tf.data.Dataset.from_tensor_slices(train).batch(32)
    vocabulary = read_vocabulary(data, "user", "item")
    assert vocabulary.users.tolist() == sorted(set(train["user"].tolist()))
    assert vocabulary.users.dtype == np.array(sorted(set(train["user"].tolist()))).dtype
    assert vocabulary.items.tolist() == sorted(set(train["item"].tolist()))
    for row, user in enumerate(vocabulary.users, start=1):
        rated = set(train["item"][train["user"] == user].tolist())
        assert vocabulary.items[vocabulary.seen.rated(row)].tolist() == sorted(rated)
    counts = [int((train["item"] == item).sum()) for item in vocabulary.items]
    assert vocabulary.item_counts.tolist() == counts


def dense_synthetic_ratings(seed, users, items, per_user):
    """The dense draw the built-in data is defined by: a users x items Gumbel top-k."""
    rng = np.random.default_rng(seed)
    user_factors = rng.normal(size=(users, 8))
    item_factors = rng.normal(size=(items, 8))
    affinity = user_factors @ item_factors.T / np.sqrt(8)
    popularity = (1.0 / np.arange(1, items + 1) ** 0.8)[rng.permutation(items)]
    counts = np.clip(rng.poisson(per_user, size=users), HELD_OUT + 5, items // 2)
    keys = np.log(popularity)[None, :] + 1.5 * affinity + rng.gumbel(size=(users, items))
    order = np.argsort(-keys, axis=1)
    bias = 0.5 * rng.normal(size=items)
    train, validation = [], []
    for user in range(users):
        chosen = rng.permutation(order[user, : counts[user]])
        noise = 0.4 * rng.normal(size=chosen.size)
        rating = np.clip(np.round(3.0 + affinity[user, chosen] + bias[chosen] + noise), 1, 5)
        rows = [(f"u{user}", 1000 + item, r) for item, r in zip(chosen, rating, strict=True)]
        train += rows[HELD_OUT:]
        validation += rows[:HELD_OUT]
    shuffled = [train[i] for i in rng.permutation(len(train))]
    return [dict(zip(("user", "item", "rating"), map(np.array, zip(*rows, strict=True)),
                     strict=True)) for rows in (shuffled, validation)]  # fmt: skip


@pytest.mark.parametrize("sizes", [(0, 500, 300, 50), (7, 600, 257, 11), (2, 30, 20, 12)])
def test_the_synthetic_data_is_the_dense_draw_s_where_that_fits(sizes, monkeypatch):
    monkeypatch.setattr(recommender_data, "CELLS_AT_ONCE", 1000)  # many pieces, one user too
    for ours, dense in zip(synthetic_ratings(*sizes), dense_synthetic_ratings(*sizes), strict=True):
        np.testing.assert_array_equal(ours["user"], dense["user"])
        np.testing.assert_array_equal(ours["item"], dense["item"])
        np.testing.assert_array_equal(ours["rating"], dense["rating"].astype(np.float32))


def test_past_the_dense_draw_memory_grows_with_ratings_not_users_times_items(monkeypatch):
    peaks, ratings = [], []
    for users in (1000, 4000):
        tracemalloc.start()
        train, validation = synthetic_ratings(0, users, 300_000, 20)  # 1.2e9 cells: 38 GB dense
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        ratings.append(len(train["user"]) + len(validation["user"]))
        pairs = train["user"].astype(object) + ":" + train["item"].astype(str)
        assert len(set(pairs)) == len(pairs)  # each user rates an item once
        assert np.all(np.unique(validation["user"], return_counts=True)[1] == HELD_OUT)
        assert 15 < (len(train["user"]) + len(validation["user"])) / users < 25
        _, counts = np.unique(train["item"], return_counts=True)
        assert np.sort(counts)[-len(counts) // 100 :].sum() > 0.1 * counts.sum()  # long tail
    per_rating = (peaks[1] - peaks[0]) / (ratings[1] - ratings[0])
    assert per_rating < 1000 and peaks[1] < 4000 * 300_000 * 32 / 100, (peaks, ratings)
    monkeypatch.setattr(recommender_data, "EXACT_CELLS", 0)  # the sampler at a small size
    train, _ = synthetic_ratings(1, 40, 300, 20)
    assert set(train["item"].tolist()) <= set(range(1000, 1300))


def test_recall_scored_in_chunks_equals_one_chunk_and_is_missing_when_not_asked(monkeypatch):
    config = {"users": 60, "items": 40, "ratings_per_user": 20, "batch_size": 32,
              "embedding": 8, "rating_layers": (16,)}  # fmt: skip

    def fit(epochs=2, **settings):
        return beatloop.fit("recommender", epochs=epochs, seed=1, config={**config, **settings})

    runs = {("table", chunk): fit(recall_chunk=chunk) for chunk in (16, 8192)}
    monkeypatch.setattr(recommender, "DENSE_SEEN", 0)  # the rated pairs kept sparse
    runs.update({("pairs", chunk): fit(recall_chunk=chunk) for chunk in (16, 8192)})
    histories = [run.history for run in runs.values()]
    for name in ("recall_at_k", "val_recall_at_k"):
        assert all(history[name] == histories[0][name] for history in histories), name
    assert 0 < histories[0]["val_recall_at_k"][-1] < 1
    quiet = fit(epochs=1, train_recall=False)
    assert "recall_at_k" not in quiet.history and "val_recall_at_k" in quiet.history
    assert quiet.history["val_recall_at_k"][0] == histories[0]["val_recall_at_k"][0]
