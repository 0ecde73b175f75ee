"""The recommender recipe's data: a seeded synthetic MovieLens-shaped data set (built in,
nothing downloaded), the vocabularies read from training data, and the simple baselines
its figures are measured against.

Synthetic ratings: users and items have hidden factors; items have a Zipf-like
popularity. Each user rates a number of items drawn without replacement with
probability proportional to popularity times ``exp(affinity)``, so both "popular" and
"what this user likes" predict what is rated; a rating is ``3 + affinity + item bias +
noise`` rounded and clipped to 1..5. Each user's last ``HELD_OUT`` ratings (in a seeded
order) are the validation split. User ids are strings (``"u17"``), item ids integers
(``1000 + i``): both kinds of lookup run.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import attrs
import numpy as np
import tensorflow as tf

from beatloop import DataError, DataSplit
from beatloop import datasets as data

FACTORS = 8
#: Ratings per user held out for validation.
HELD_OUT = 5


def synthetic_ratings(
    seed: int, users: int, items: int, per_user: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Training and validation rows ``{"user": str, "item": int64, "rating": float32}``."""
    rng = np.random.default_rng(seed)
    user_factors = rng.normal(size=(users, FACTORS))
    item_factors = rng.normal(size=(items, FACTORS))
    affinity = user_factors @ item_factors.T / np.sqrt(FACTORS)
    popularity = 1.0 / np.arange(1, items + 1) ** 0.8
    popularity = popularity[rng.permutation(items)]  # popular ids are not the first
    counts = np.clip(rng.poisson(per_user, size=users), HELD_OUT + 5, items // 2)
    # Gumbel top-k: each user's items drawn without replacement by weight.
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
    return _columns(shuffled), _columns(validation)


def _columns(rows) -> dict[str, np.ndarray]:
    user, item, rating = zip(*rows, strict=True)
    return {
        "user": np.array(user),
        "item": np.array(item, dtype=np.int64),
        "rating": np.array(rating, dtype=np.float32),
    }


def synthetic_split(seed: int, batch_size: int, users: int, items: int, per_user: int):
    """The built-in data: training reshuffled each epoch by ``seed``, validation in order."""
    train, validation = synthetic_ratings(seed, users, items, per_user)
    return DataSplit(
        data.batches(train, batch_size, shuffle_seed=seed), data.batches(validation, batch_size)
    )


@attrs.frozen
class Vocabulary:
    """The ids of the training data, sorted (independent of its order), with how often
    each item was rated (for log-Q and the popularity baseline)."""

    users: np.ndarray
    items: np.ndarray
    item_counts: np.ndarray
    #: ``seen[u, i]``: 1 where user index ``u`` rated item ``i`` (both by lookup index
    #: less one; unknown users see nothing) in the training data.
    seen: np.ndarray

    def fingerprint(self) -> int:
        """A 63-bit hash of both vocabularies: what a checkpoint records, so a run
        rebuilt on other training data (other lookups) is refused, not silently wrong."""
        digest = hashlib.sha256()
        for ids in (self.users, self.items):
            digest.update(repr(ids.tolist()).encode())
        return int.from_bytes(digest.digest()[:8], "little") >> 1

    def log_q(self) -> np.ndarray:
        """``log`` of each item's share of the training rows, by lookup index (0: an id
        the training data lacks, given the rarest item's share)."""
        shares = self.item_counts / self.item_counts.sum()
        return np.log(np.concatenate([[shares.min()], shares])).astype(np.float32)


def read_vocabulary(train: tf.data.Dataset, user_key: str, item_key: str) -> Vocabulary:
    """One pass over the training batches: the sorted user and item ids, item counts."""
    users, items, pairs = set(), Counter(), set()
    for batch in train:
        user_ids = [_text(u) for u in batch[user_key].numpy().reshape(-1).tolist()]
        item_ids = [_text(i) for i in batch[item_key].numpy().reshape(-1).tolist()]
        users.update(user_ids)
        items.update(item_ids)
        pairs.update(zip(user_ids, item_ids, strict=True))
    if not users:
        raise DataError("the recommender's training data holds no rows: it needs ratings")
    user_ids, item_ids = sorted(users), sorted(items)
    seen = np.zeros([len(user_ids) + 1, len(item_ids)], np.uint8)
    user_row = {u: row + 1 for row, u in enumerate(user_ids)}
    item_column = {i: column for column, i in enumerate(item_ids)}
    for user, item in pairs:
        seen[user_row[user], item_column[item]] = 1
    counts = np.array([items[i] for i in item_ids], dtype=np.float64)
    return Vocabulary(np.array(user_ids), np.array(item_ids), counts, seen)


def baselines(train: dict, validation: dict, k: int) -> dict[str, float]:
    """What a recommender must beat: recall@K of recommending each user the K most rated
    items they did not rate in training, and the RMSE of predicting the training mean
    rating (``random_recall``: K of the unseen items drawn at random, on average)."""
    items, counts = np.unique(train["item"], return_counts=True)
    ranked = items[np.argsort(-counts, kind="stable")]
    seen: dict = {}
    for user, item in zip(train["user"], train["item"], strict=True):
        seen.setdefault(user, set()).add(item)
    hits, chance = [], []
    for user, item in zip(validation["user"], validation["item"], strict=True):
        unseen = [i for i in ranked if i not in seen.get(user, ())]
        hits.append(item in unseen[:k])
        chance.append(min(1.0, k / max(len(unseen), 1)))
    recall = float(np.mean(hits))
    mean = float(train["rating"].mean())
    rmse = float(np.sqrt(np.mean((validation["rating"] - mean) ** 2)))
    return {"popular_recall": recall, "mean_rmse": rmse, "random_recall": float(np.mean(chance))}


def _text(value):
    """A string id as ``str`` (TensorFlow gives bytes), an integer as it is."""
    return value.decode() if isinstance(value, bytes) else value
