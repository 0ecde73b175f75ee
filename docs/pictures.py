"""The recipes' pictures in docs/recipes.md: each trains a built-in recipe at its
documented size and draws figures of its history per epoch, so a picture shows what the
recipe does now, not what it did once.

    python docs/pictures.py                          # every picture, into docs/img/
    python docs/pictures.py dqn meta                 # some of them
    python docs/pictures.py --quick --out /tmp/pics  # small runs (what the tests draw)

tests/test_pictures.py draws every picture with ``--quick`` and checks each one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

DOCS = Path(__file__).resolve().parent
IMAGES = DOCS / "img"
SEED = 0


@attrs.frozen
class Picture:
    """One recipe's picture: the history figures drawn per epoch (one line each), the
    run that makes them (``config``, ``epochs``) and its small twin for the tests
    (``quick_config`` over ``config``, ``quick_epochs``). ``references`` gives labelled
    values drawn as dashed horizontal lines (a baseline measured by the recipe's own
    code); it is called with ``quick``."""

    recipe: str
    figures: tuple[str, ...]
    title: str
    ylabel: str
    config: Mapping[str, Any] = attrs.field(factory=dict)
    epochs: int = 10
    quick_config: Mapping[str, Any] = attrs.field(factory=dict)
    quick_epochs: int = 2
    references: Callable[[bool], Mapping[str, float]] | None = None

    def run_config(self, quick: bool) -> dict[str, Any]:
        return {**self.config, **(self.quick_config if quick else {})}

    def run_epochs(self, quick: bool) -> int:
        return self.quick_epochs if quick else self.epochs


def random_encoder_probe(config: Mapping[str, Any], probe_epochs: int) -> float:
    """The contrastive recipe's baseline: the final val_probe_accuracy of its linear probe
    trained for ``probe_epochs`` on the encoder as initialised (``pretrain_epochs=0``)."""
    import beatloop

    config = {**config, "pretrain_epochs": 0}
    result = beatloop.fit("contrastive", config=config, epochs=probe_epochs, seed=SEED,
                          progress=False)  # fmt: skip
    return result.history["val_probe_accuracy"][-1]


CONTRASTIVE_QUICK = {"hidden": 32, "pretrain_epochs": 1}
META_QUICK = {"batch_size": 10, "train_tasks": 200, "validation_tasks": 50}


def _meta_references(quick: bool) -> dict[str, float]:
    """The validation tasks' query loss of the task distribution's mean sinusoid: the
    lowest a learner that does not adapt can expect (``sinusoids.unadapted_floor``)."""
    import numpy as np

    import beatloop
    from beatloop.recipes.sinusoids import unadapted_floor

    recipe = beatloop.make_recipe("meta", META_QUICK if quick else {})
    batches = list(recipe.default_data(SEED).validation.as_numpy_iterator())
    tasks = {key: np.concatenate([b[key] for b in batches]) for key in ("query_x", "query_y")}
    return {"best without adapting": unadapted_floor(tasks)}


RECOMMENDER_QUICK = {"users": 60, "items": 40, "ratings_per_user": 20, "batch_size": 32}


def _recommender_references(quick: bool) -> dict[str, float]:
    """The baselines on the run's data: the most rated unrated items' recall@10 and the
    training mean rating's RMSE (``recommender_data.baselines``)."""
    import beatloop
    from beatloop.recipes.recommender_data import baselines, synthetic_ratings

    c = beatloop.make_recipe("recommender", RECOMMENDER_QUICK if quick else {}).config
    rows = synthetic_ratings(SEED, c.users, c.items, c.ratings_per_user)
    found = baselines(*rows, c.top_k)
    return {"most rated unrated items": found["popular_recall"],
            "mean rating's RMSE": found["mean_rmse"]}  # fmt: skip


#: Every recipe picture the docs show, by the file name it is drawn into (NAME.png).
PICTURES: dict[str, Picture] = {
    "contrastive": Picture(
        recipe="contrastive",
        figures=("val_probe_accuracy",),
        title="contrastive (SimCLR): online probe, then linear probe (epoch 21 on)",
        ylabel="validation accuracy",
        epochs=40,
        quick_config=CONTRASTIVE_QUICK,
        quick_epochs=2,
        references=lambda quick: {
            "linear probe, random encoder": random_encoder_probe(
                CONTRASTIVE_QUICK if quick else {}, 1 if quick else 20
            )
        },
    ),
    "dqn": Picture(
        recipe="dqn",
        figures=("train_return", "greedy_return"),
        title="dqn on the chain (10 cells), epochs of 200 steps, seed 0",
        ylabel="return",
        config={"steps_per_epoch": 200},
        epochs=10,
        quick_config={
            "steps_per_epoch": 40,
            "hidden": 16,
            "buffer_size": 64,
            "learning_starts": 16,
            "validation_batches": 1,
        },
        quick_epochs=2,
        references=lambda quick: {"optimal return": 1.0},
    ),
    "meta": Picture(
        recipe="meta",
        figures=("val_query_loss_before", "val_query_loss_after"),
        title="meta (MAML, second order): held-out tasks' query loss",
        ylabel="mean squared error",
        epochs=10,
        quick_config=META_QUICK,
        references=_meta_references,
    ),
    # The default run (80 rollouts, the learning rate falling to 0 over them) cut into
    # 10 epochs of 8 rollouts: the same training, bit for bit, a figure every tenth.
    "ppo": Picture(
        recipe="ppo",
        figures=("train_return", "greedy_return"),
        title="ppo on cartpole (8 copies), the default run in tenths, seed 0",
        ylabel="return",
        config={"rollouts_per_epoch": 8},
        epochs=10,
        quick_config={
            "envs": 4,
            "rollout_steps": 16,
            "update_epochs": 2,
            "minibatches": 2,
            "rollouts_per_epoch": 2,
            "hidden": 16,
        },
        quick_epochs=2,
        references=lambda quick: {"optimal return": 200.0},
    ),
    "recommender": Picture(
        recipe="recommender",
        figures=("val_recall_at_k", "val_rmse"),
        title="recommender (two towers): validation recall@10 and RMSE",
        ylabel="recall@10 / RMSE",
        epochs=8,
        quick_config=RECOMMENDER_QUICK,
        references=_recommender_references,
    ),
}


class MissingFigure(LookupError):
    """A picture names a figure its run's history does not have."""


def curves(picture: Picture, quick: bool = False) -> dict[str, list[float]]:
    """Train the picture's run (seed 0) and return the figures it draws, per epoch."""
    import beatloop

    result = beatloop.fit(
        picture.recipe,
        config=picture.run_config(quick),
        epochs=picture.run_epochs(quick),
        seed=SEED,
        progress=False,
    )
    missing = [name for name in picture.figures if name not in result.history]
    if missing:
        raise MissingFigure(
            f"{picture.recipe}: the picture draws {missing}, which its history lacks; "
            f"it has {sorted(result.history)}"
        )
    return {name: list(result.history[name]) for name in picture.figures}


def draw(picture: Picture, path: Path, quick: bool = False) -> dict[str, list[float]]:
    """Draw ``picture`` into ``path`` (a PNG) and return the curves drawn in it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    drawn = curves(picture, quick)
    references = picture.references(quick) if picture.references else {}
    figure, axis = plt.subplots(figsize=(5.6, 3.4))
    for name, values in drawn.items():
        axis.plot(range(1, len(values) + 1), values, marker="o", markersize=3, label=name)
    for index, (label, value) in enumerate(references.items()):
        axis.axhline(value, linestyle="--", color=f"C{len(drawn) + index}", label=label)
    axis.set_title(picture.title, fontsize=10)
    axis.set_xlabel("epoch")
    axis.set_ylabel(picture.ylabel)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return {**drawn, **{label: [value] for label, value in references.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"pictures to draw (default all: {sorted(PICTURES)})"
    )
    parser.add_argument("--quick", action="store_true", help="the tests' small runs")
    parser.add_argument("--out", type=Path, default=IMAGES, help="where NAME.png goes")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(PICTURES))
    if unknown:
        parser.error(f"no picture named {unknown}; the pictures are {sorted(PICTURES)}")
    for name in args.names or sorted(PICTURES):
        path = args.out / f"{name}.png"
        drawn = draw(PICTURES[name], path, args.quick)
        finals = ", ".join(f"{key} {values[-1]:.4g}" for key, values in drawn.items())
        print(f"{path}: {finals}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
