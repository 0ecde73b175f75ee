"""docs/pictures.py: the recipes' pictures in the docs are drawn from real runs."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from PIL import Image

import beatloop

DOCS = Path(__file__).resolve().parents[1] / "docs"


def load_pictures():
    """``docs/pictures.py`` as a module (``docs`` is not a package)."""
    spec = importlib.util.spec_from_file_location("beatloop_docs_pictures", DOCS / "pictures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pictures = load_pictures()

SMALL = pictures.Picture(
    recipe="supervised",
    figures=("loss", "val_accuracy"),
    title="supervised",
    ylabel="figure",
    config={"batch_size": 128, "hidden": 16},
    epochs=5,
    quick_epochs=2,
    references=lambda quick: {"chance": 0.1},
)


def test_a_picture_draws_its_runs_history(tmp_path):
    path = tmp_path / "small.png"
    drawn = pictures.draw(SMALL, path, quick=True)
    # The same run again: the drawn figures are its history, epoch by epoch.
    result = beatloop.fit("supervised", config=SMALL.config, epochs=2, seed=0, progress=False)
    assert drawn == {
        "loss": result.history["loss"],
        "val_accuracy": result.history["val_accuracy"],
        "chance": [0.1],
    }
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (560, 340)


def test_a_figure_the_history_lacks_is_named(tmp_path):
    wrong = pictures.Picture(recipe="supervised", figures=("val_acuracy",), title="t",
                             ylabel="y", config=SMALL.config, quick_epochs=1)  # fmt: skip
    with pytest.raises(pictures.MissingFigure, match=r"\['val_acuracy'\].*'val_accuracy'"):
        pictures.draw(wrong, tmp_path / "wrong.png", quick=True)
    assert not (tmp_path / "wrong.png").exists()


@pytest.mark.parametrize("name", sorted(pictures.PICTURES))
def test_every_docs_picture_draws_at_its_quick_size(tmp_path, name):
    picture = pictures.PICTURES[name]
    drawn = pictures.draw(picture, tmp_path / f"{name}.png", quick=True)
    for figure in picture.figures:
        assert len(drawn[figure]) == picture.quick_epochs, figure
        assert all(math.isfinite(value) for value in drawn[figure]), figure
    assert (tmp_path / f"{name}.png").stat().st_size > 0


def test_every_picture_is_in_the_checkout_and_shown_on_the_recipes_page():
    page = (DOCS / "recipes.md").read_text()
    for name, picture in pictures.PICTURES.items():
        assert (DOCS / "img" / f"{name}.png").is_file(), name
        assert f"](img/{name}.png)" in page.split(f"## `{picture.recipe}`", 1)[1], name
