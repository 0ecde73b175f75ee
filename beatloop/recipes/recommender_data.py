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

import attrs
import numpy as np
import tensorflow as tf

from beatloop import DataError, DataSplit
from beatloop import datasets as data
from beatloop.recipes.retrieval import SeenPairs

FACTORS = 8
#: Ratings per user held out for validation.
HELD_OUT = 5
#: Up to this many users x items the synthetic data draws each user's items exactly
#: (the dense draw it replaces needed 32 bytes each).
EXACT_CELLS = 2**28
#: Users x items (or candidates) the synthetic data draws at once: its working memory.
CELLS_AT_ONCE = 2**21
#: Above ``EXACT_CELLS``, items drawn by popularity per rating a user makes.
CANDIDATES = 3


def synthetic_ratings(
    seed: int, users: int, items: int, per_user: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Training and validation rows ``{"user": str, "item": int64, "rating": float32}``,
    drawn ``CELLS_AT_ONCE`` keys at a time: memory grows with users + items + ratings.
    Up to ``EXACT_CELLS`` users x items each user's items are an exact Gumbel top-k over
    every item; above it, over candidates drawn by popularity (``_candidates``)."""
    rng = np.random.default_rng(seed)
    user_factors = rng.normal(size=(users, FACTORS))
    item_factors = rng.normal(size=(items, FACTORS))
    popularity = 1.0 / np.arange(1, items + 1) ** 0.8
    popularity = popularity[rng.permutation(items)]  # popular ids are not the first
    counts = np.clip(rng.poisson(per_user, size=users), HELD_OUT + 5, items // 2)
    exact = users * items <= EXACT_CELLS
    draw = _gumbel_top if exact else _candidates
    keys = items if exact else CANDIDATES * int(counts.max(initial=1))
    at_once = users_at_once(keys)
    chosen = []  # per user: the items it rates, by descending key, and their affinity
    for start in range(0, users, at_once):
        rows = slice(start, start + at_once)
        chosen += draw(rng, user_factors[rows], item_factors, popularity, counts[rows])
    bias = 0.5 * rng.normal(size=items)
    train, validation = [], []
    for user, (order, affinity) in enumerate(chosen):
        shuffle = rng.permutation(order.size)
        picked, near = order[shuffle], affinity[shuffle]
        noise = 0.4 * rng.normal(size=picked.size)
        rating = np.clip(np.round(3.0 + near + bias[picked] + noise), 1, 5)
        rows = (np.full(picked.size, user), 1000 + picked, rating)
        train.append([column[HELD_OUT:] for column in rows])
        validation.append([column[:HELD_OUT] for column in rows])
    train_columns = [np.concatenate(column) for column in zip(*train, strict=True)]
    shuffled = rng.permutation(len(train_columns[0]))
    validation_columns = [np.concatenate(column) for column in zip(*validation, strict=True)]
    return _columns([c[shuffled] for c in train_columns]), _columns(validation_columns)


def users_at_once(keys: int) -> int:
    """Users drawn at once when each draws ``keys`` keys."""
    return max(1, CELLS_AT_ONCE // keys)


def _gumbel_top(rng, factors, item_factors, popularity, wanted) -> list:
    """Each user's items drawn without replacement with probability proportional to
    popularity times ``exp(1.5 affinity)`` (Gumbel top-k), in descending key order."""
    affinity = factors @ item_factors.T / np.sqrt(FACTORS)
    keys = np.log(popularity)[None, :] + 1.5 * affinity + rng.gumbel(size=affinity.shape)
    most = int(wanted.max())
    top = np.argpartition(-keys, most - 1, axis=1)[:, :most]
    top = np.take_along_axis(top, np.argsort(-np.take_along_axis(keys, top, 1), axis=1), 1)
    return [(top[row, :n], affinity[row, top[row, :n]]) for row, n in enumerate(wanted)]


def _candidates(rng, factors, item_factors, popularity, wanted) -> list:
    """As ``_gumbel_top``, with keys only for ``CANDIDATES`` x the wanted count of items
    drawn by popularity (repeats kept once): time and memory grow with the ratings,
    not users x items."""
    cumulative = np.cumsum(popularity / popularity.sum())
    shape = (len(wanted), int(wanted.max()) * CANDIDATES)
    picked = np.searchsorted(cumulative, rng.random(shape)).clip(max=len(popularity) - 1)
    picked.sort(axis=1)
    repeated = np.zeros(shape, bool)
    repeated[:, 1:] = picked[:, 1:] == picked[:, :-1]
    affinity = np.einsum("uf,ucf->uc", factors, item_factors[picked]) / np.sqrt(FACTORS)
    keys = np.where(repeated, -np.inf, 1.5 * affinity + rng.gumbel(size=shape))
    order = np.argsort(-keys, axis=1)
    result = []
    for row, n in enumerate(wanted):
        best = order[row, : min(n, int((~repeated[row]).sum()))]
        result.append((picked[row, best], affinity[row, best]))
    return result


def _columns(columns) -> dict[str, np.ndarray]:
    """The rows as the built-in data gives them: ``"u17"``-style user ids."""
    user, item, rating = columns
    names = np.char.add("u", user.astype(f"U{len(str(user.max(initial=0)))}"))
    return {
        "user": names.astype(f"U{np.char.str_len(names).max(initial=1)}"),
        "item": item.astype(np.int64),
        "rating": rating.astype(np.float32),
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
    each item was rated (for log-Q and the popularity baseline) and which items each
    user rated (``seen``: by lookup row, sparse)."""

    users: np.ndarray
    items: np.ndarray
    item_counts: np.ndarray
    seen: SeenPairs | None

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
    """One pass over the training batches: the sorted user and item ids, item counts and
    the seen pairs, in memory that grows with the rows (never users x items)."""
    users, items = [], []
    for batch in train:
        users.append(_ids(batch[user_key]))
        items.append(_ids(batch[item_key]))
    if not sum(len(u) for u in users):
        raise DataError("the recommender's training data holds no rows: it needs ratings")
    user_ids, user_rows = np.unique(np.concatenate(users), return_inverse=True)
    item_ids, item_columns, counts = np.unique(
        np.concatenate(items), return_inverse=True, return_counts=True
    )
    seen = SeenPairs.from_pairs(user_rows + 1, item_columns, len(user_ids))
    return Vocabulary(_texts(user_ids), _texts(item_ids), counts.astype(np.float64), seen)


def _ids(values: tf.Tensor) -> np.ndarray:
    """A batch's ids as a flat array: strings as bytes, integers as int64."""
    flat = values.numpy().reshape(-1)
    return flat.astype(np.bytes_) if flat.dtype == object else flat.astype(np.int64)


def _texts(ids: np.ndarray) -> np.ndarray:
    """Sorted string ids as ``str`` (TensorFlow gives bytes; UTF-8 sorts as ``str``)."""
    return np.char.decode(ids, "utf-8") if ids.dtype.kind == "S" else ids


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
