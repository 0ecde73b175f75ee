"""The built-in recommender recipe: bit-identical to a hand-written two-tower loop
(tests/recommender_hand.py) at K=1 and K>1 with fixed and DWA weights, evaluate
changing nothing and giving the last val_ figures, quality above the popularity and
mean-rating baselines, the exported top-K model equal to brute force, a SIGKILLed run
resuming bit-identical, and clear config errors."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import all_weights, assert_same_weights, start_python, worker
from recommender_hand import HandWrittenRecommender, towers, vocabularies

import beatloop
from beatloop.callbacks.standard import History
from beatloop.core.running.engine import Engine, EngineOptions
from beatloop.recipes.recommender_data import baselines, synthetic_ratings

SEED = 3
SMALL = {"users": 60, "items": 40, "ratings_per_user": 20, "batch_size": 32, "embedding": 8,
         "rating_layers": (16,)}  # fmt: skip
WORKER = Path(__file__).parent / "workers" / "recommender_run.py"
recommender_run = worker("recommender_run")


def engine_and_hand_loop(config: dict, steps_per_execution: int):
    """An engine of the recipe and the hand-written loop on copies of its initial
    weights, each on its own built-in data (the same seed: the same batches)."""
    recipe = beatloop.make_recipe("recommender", config)
    keras.utils.set_random_seed(SEED)
    history = History()
    engine = Engine(
        recipe, recipe.default_data(SEED), seed=SEED, callbacks=[history],
        options=EngineOptions(steps_per_execution=steps_per_execution),
    )  # fmt: skip
    train = recipe.default_data(SEED).train
    users, items, log_q = vocabularies(train, recipe.config)
    models = towers(users, items, recipe.config)
    for name, model in models.items():
        model.set_weights(engine.bound.models[name].get_weights())
    return engine, HandWrittenRecommender(train, recipe.config, models, log_q), history


@pytest.mark.parametrize(
    "k, overrides",
    [(1, {}), (4, {"weighting": "dwa"}), (5, {"logq": False, "weights": (0.5, 2.0)})],
    ids=["fixed-K1", "dwa-K4", "fixed-no-logq-K5"],
)
def test_the_recipe_equals_the_hand_written_loop_bit_for_bit(k, overrides):
    engine, hand, history = engine_and_hand_loop({**SMALL, **overrides}, k)
    engine.fit(3)
    hand.fit(3)
    models = engine.bound.models
    towers_only = {name: models[name] for name in ("user", "item", "rating")}
    assert_same_weights(all_weights(towers_only), all_weights(hand.models))
    ours, theirs = engine.bound.optimizers["optimizer"].variables, hand.optimizer.variables
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    np.testing.assert_array_equal(models["loss_weights"].variable.numpy(), hand.weights.numpy())
    logged = [list(pair) for pair in zip(*(history.history[f"{t}_loss"] for t in
                                             ("retrieval", "rating")), strict=True)]  # fmt: skip
    assert logged == hand.epoch_losses
    if overrides.get("weighting") == "dwa":
        assert history.history["weight_retrieval"][2] != 1.0  # set from epochs 1 and 2


def test_uncertainty_learns_a_log_variance_per_task():
    config = {**SMALL, "weighting": "uncertainty"}
    result = beatloop.fit("recommender", epochs=2, seed=0, config=config, progress=False)
    assert set(result.models["uncertainty"].log_variances) == {"retrieval", "rating"}
    history = result.history
    for task in ("retrieval", "rating"):  # exp(-s) logged, s moved by the beat's Adam
        assert history[f"weight_{task}"][0] != history[f"weight_{task}"][1] != 1.0, history


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The recipe at its defaults, three epochs, in a run dir."""
    run_dir = tmp_path_factory.mktemp("recommender") / "run"
    result = beatloop.fit("recommender", epochs=3, seed=0, run_dir=run_dir, progress=False)
    return result, run_dir


def test_recall_and_rmse_beat_the_popularity_and_mean_baselines(trained):
    result, _ = trained
    config = result.recipe.config
    train, validation = synthetic_ratings(0, config.users, config.items, config.ratings_per_user)
    base = baselines(train, validation, config.top_k)
    history = result.history
    assert base["random_recall"] < 0.05 < base["popular_recall"] < 0.25
    assert max(history["val_recall_at_k"]) > 1.15 * base["popular_recall"], history
    assert history["val_rmse"][-1] < 0.9 * base["mean_rmse"], history


def test_evaluate_changes_nothing_and_equals_the_last_val_figures(trained):
    result, run_dir = trained
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    figures = beatloop.evaluate(run_dir)
    for name, value in figures.items():
        assert result.history[f"val_{name}"][-1] == value, name
    assert {"recall_at_k", "rmse", "retrieval_loss", "rating_loss"} <= set(figures)
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == files


def test_the_exported_model_returns_the_brute_force_top_items(trained, tmp_path):
    result, _ = trained
    paths = result.export(tmp_path / "export")
    loaded = tf.saved_model.load(str(paths["top_items"]))  # kept: it holds the variables
    users = np.array(["u0", "u7", "u499", "nobody"])
    out = loaded.serve(tf.constant(users))
    models, vocabulary = result.models, result.recipe.vocabulary
    user_vectors = models["user"](tf.constant(users)).numpy()
    item_vectors = models["item"](tf.constant(vocabulary.items)).numpy()
    scores = user_vectors @ item_vectors.T
    best = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(out["item_ids"].numpy(), vocabulary.items[best])
    expected = np.take_along_axis(scores, best, axis=1)
    np.testing.assert_allclose(out["scores"].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_string_and_integer_ids_from_other_keys():
    rows = synthetic_ratings(1, 30, 20, 12)[0]
    data = tf.data.Dataset.from_tensor_slices(
        {"uid": (np.char.lstrip(rows["user"], "u")).astype(np.int32),
         "movie": rows["item"].astype(str), "stars": rows["rating"]}
    ).batch(16)  # fmt: skip
    config = {"user_key": "uid", "item_key": "movie", "rating_key": "stars", "embedding": 4}
    result = beatloop.fit("recommender", data=data, epochs=2, seed=0, config=config)
    vocabulary = result.recipe.vocabulary
    assert vocabulary.users.dtype.kind == "i" and vocabulary.items.dtype.kind == "U"
    assert list(vocabulary.items) == sorted(vocabulary.items) and len(vocabulary.users) == 30
    assert result.history["rating_loss"][1] < result.history["rating_loss"][0]


def test_a_csv_of_three_columns_trains_and_evaluates_on_its_held_out_rows(tmp_path):
    from beatloop.named_data.load import NamedData, load_data

    rows = synthetic_ratings(2, 40, 30, 15)[0]
    lines = ["user,item,rating"] + [
        f"{u[1:]},{i},{int(r)}" for u, i, r in zip(*rows.values(), strict=True)
    ]
    (tmp_path / "ratings.csv").write_text("\n".join(lines) + "\n")
    data = NamedData(f"csv:{tmp_path / 'ratings.csv'}",
                     ("keys=user,item,rating", "validation_fraction=0.2"))  # fmt: skip
    result = beatloop.fit("recommender", data=data, epochs=2, seed=0, run_dir=tmp_path / "run",
                          config={"batch_size": 32}, progress=False)  # fmt: skip
    split = load_data(data.source, data.settings, recipe=result.recipe, seed=0)
    assert set(split.train.element_spec) == {"user", "item", "rating"}  # no x
    assert result.recipe.vocabulary.users.dtype.kind == "i"
    figures = beatloop.evaluate(tmp_path / "run")
    assert figures["recall_at_k"] == result.history["val_recall_at_k"][-1]


def test_a_movielens_shaped_csv_names_its_columns_batch_keys(tmp_path):
    from beatloop.named_data.load import NamedData, load_data

    rows = synthetic_ratings(2, 30, 20, 12)[0]
    lines = ["userId,movieId,rating,timestamp"] + [
        f"{u[1:]},{i},{int(r)},{964982703 + n}"
        for n, (u, i, r) in enumerate(zip(*rows.values(), strict=True))
    ]
    (tmp_path / "ratings.csv").write_text("\n".join(lines) + "\n")
    settings = ("keys=userId:user,movieId:item,rating", "validation_fraction=0.2")
    data = NamedData(f"csv:{tmp_path / 'ratings.csv'}", settings)
    result = beatloop.fit("recommender", data=data, epochs=1, seed=0,
                          config={"batch_size": 16, "embedding": 4}, progress=False)  # fmt: skip
    split = load_data(data.source, data.settings, recipe=result.recipe, seed=0)
    assert set(split.train.element_spec) == {"x", "user", "item", "rating"}  # x: the timestamp
    users = np.array(sorted({int(u[1:]) for u in rows["user"]}))
    assert np.array_equal(result.recipe.vocabulary.users, users)
    assert len(result.recipe.vocabulary.items) == len(set(rows["item"].tolist()))
    assert np.isfinite(result.history["val_rmse"][0])


@pytest.mark.parametrize(
    ("item", "found"), [("userId:x", "'x' is taken"), ("userId:2nd", "not COLUMN:KEY")]
)
def test_a_csv_key_that_cannot_be_a_batch_key_is_a_data_error(tmp_path, item, found):
    from beatloop.named_data.load import load_data

    (tmp_path / "r.csv").write_text("userId,movieId,rating\n1,2,3\n2,3,4\n")
    with pytest.raises(beatloop.DataError, match=found):
        load_data(f"csv:{tmp_path / 'r.csv'}", (f"keys={item},movieId,rating",),
                  recipe=beatloop.make_recipe("recommender"), seed=0)  # fmt: skip


def test_tfrecords_with_string_ids_under_other_feature_names(tmp_path):
    from beatloop.named_data.load import NamedData

    rows = synthetic_ratings(2, 20, 15, 12)[0]
    with tf.io.TFRecordWriter(str(tmp_path / "r.tfrecord")) as writer:
        for user, item, rating in zip(*rows.values(), strict=True):
            feature = {
                "userId": tf.train.Feature(bytes_list=tf.train.BytesList(value=[user.encode()])),
                "movieId": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(item)])),
                "rating": tf.train.Feature(float_list=tf.train.FloatList(value=[rating])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
    settings = ("features=userId=bytes,movieId=int64,rating=float32",
                "keys=userId:user,movieId:item")  # fmt: skip
    data = NamedData(f"tfrecord:{tmp_path / 'r.tfrecord'}", settings)
    result = beatloop.fit("recommender", data=data, epochs=1, seed=0,
                          config={"batch_size": 16, "embedding": 4}, progress=False)  # fmt: skip
    vocabulary = result.recipe.vocabulary
    assert vocabulary.users.dtype.kind == "U" and vocabulary.items.dtype.kind == "i"
    assert len(vocabulary.users) == 20 and np.isfinite(result.history["rmse"][0])


def test_a_run_rebuilt_on_other_ids_is_refused_not_silently_wrong(tmp_path):
    rows = synthetic_ratings(1, 30, 20, 12)[0]

    def ratings(prefix: str) -> tf.data.Dataset:
        users = np.char.replace(rows["user"], "u", prefix)
        return tf.data.Dataset.from_tensor_slices({**rows, "user": users}).batch(16)

    config = {"embedding": 4, "rating_layers": (8,)}
    beatloop.fit("recommender", data=ratings("u"), epochs=1, seed=0, config=config,
                 run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert set(beatloop.evaluate(tmp_path / "run", data=ratings("u"))) >= {"recall_at_k"}
    with pytest.raises(beatloop.UserCodeError, match="vocabularies differ from those its"):
        beatloop.evaluate(tmp_path / "run", data=ratings("v"))  # as many users, other ids


@pytest.mark.parametrize(
    "config, message",
    [
        ({"weights": (1.0,)}, "weights gives 1 value"),
        ({"weighting": "equal"}, "expects 'fixed' | 'uncertainty' | 'dwa'"),
        ({"rating_layers": (0,)}, "positive layer widths"),
    ],
)
def test_bad_configs(config, message):
    with pytest.raises(beatloop.ConfigError, match=message):
        beatloop.make_recipe("recommender", config)


def test_float_ids_are_refused_naming_the_key():
    data = tf.data.Dataset.from_tensor_slices(
        {"user": [1.0, 2.0], "item": [1, 2], "rating": [3.0, 4.0]}
    ).batch(2)
    with pytest.raises(beatloop.DataError, match="'user' holds ids: strings or integers"):
        beatloop.fit("recommender", data=data, epochs=1, seed=0)


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_bit_identical(tmp_path):
    spec = {"epochs": 3, "seed": SEED, "checkpoint_every": 10, "steps_per_execution": 4,
            "config": {**SMALL, "weighting": "dwa"}}  # fmt: skip
    killed_dir, full_dir = str(tmp_path / "killed"), str(tmp_path / "full")
    killed = start_python(WORKER, json.dumps({**spec, "run_dir": killed_dir, "kill_at": 50}))
    try:  # the uninterrupted run and the resume are fitted here: no process needed
        full = recommender_run.fit({**spec, "run_dir": full_dir})
    finally:
        _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err
    resumed = recommender_run.fit({**spec, "run_dir": killed_dir})
    assert resumed.resumed_from is not None
    assert_same_weights(recommender_run.final(resumed), recommender_run.final(full))
    history = [Path(d, "history.jsonl").read_text() for d in (killed_dir, full_dir)]
    assert history[0] == history[1]
