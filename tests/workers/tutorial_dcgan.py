"""The TensorFlow DCGAN tutorial's hand-written step against beatloop's simultaneous
groups, bit for bit, for ``test_groups.py``: ``python tutorial_dcgan.py OUT``.

Runs in a process of its own because the comparison is exact: grappler's arithmetic
optimizer may add a gradient's terms in another order when earlier graphs in the same
process shifted its node names. Writes, per comparison, the largest weight difference
between the two loops and how far training moved the weights, to OUT (JSON).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import keras
from helpers import (
    all_weights,
    find_block,
    gan_data,
    largest_difference,
    tutorial_dcgan_training,
    twin_models,
)

import beatloop

GAN = {"architecture": "conv", "hidden": 16, "latent_dim": 8, "batch_size": 16}


def compare(recipe, data, latent: int, tutorial=None, **fit_options) -> dict[str, float]:
    """Train twin models with beatloop and with the tutorial's loop (2 epochs, seed 7;
    ``tutorial``: the loop's optimizer and loss, if not the gan recipe's)."""
    ours, theirs = twin_models(recipe, data)
    start = all_weights(ours)
    beatloop.fit(recipe, data=data, models=ours, epochs=2, seed=7, progress=False, **fit_options)
    tutorial_dcgan_training(
        theirs["generator"], theirs["discriminator"], data, epochs=2, seed=7, latent=latent,
        **(tutorial or {}),
    )  # fmt: skip
    return {
        "max_difference": largest_difference(all_weights(ours), all_weights(theirs)),
        "moved": largest_difference(all_weights(ours), start, same_names=True),
    }


def readme_recipe():
    """The docs' DCGAN recipe class (docs/schedules.md; its block is run, training
    included)."""
    namespace: dict = {}
    find_block("class Dcgan").run(namespace)
    return namespace["Dcgan"]


def main(out: str) -> None:
    data = gan_data(80, 16)  # five steps an epoch: spe=3 also runs a short call
    gan = beatloop.make_recipe("gan", {**GAN, "update": "simultaneous"})
    report = {
        f"gan spe={k}": compare(gan, data, GAN["latent_dim"], steps_per_execution=k) for k in (1, 3)
    }
    dcgan = readme_recipe()
    as_written = {  # the tutorial's optimizers and loss, as the README recipe has them
        "optimizer": lambda: keras.optimizers.Adam(1e-4),
        "loss": keras.losses.BinaryCrossentropy(from_logits=True),
    }
    report["readme dcgan"] = compare(dcgan(), data, dcgan.latent_dim, as_written)
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
