"""The contrastive recipe on one device and on a MirroredStrategy over two logical CPUs,
at four steps per compiled call, in its own process (logical devices must be set before
TensorFlow runs anything).

``python contrastive_mirrored.py OUT``: for each target (``none``: SimCLR, ``ema``:
BYOL), one epoch of pretraining and one of the linear probe from the same initial
weights, data and seed, once per device setup: 28 training digits in global batches of 9
(replica shares of 5 and 4, then a last batch of one row, split 1 + 0, so one replica has
no rows) and 32 validation digits (5 + 4, then 3 + 2), each pass's shares changing within
one compiled call. Then ``defaults``: SimCLR at the recipe's default config on its
default data's digits and batch size (batches of 128: shares 64 + 64, then 15 + 14 in
training and 52 + 52 in validation), but unshuffled (the order of shuffled data is not
what is compared here), one full batch and the last of each split (``DEFAULT_ROWS``:
157 training digits, 232 validation digits), and one epoch of pretraining and one of
the probe.
Writes JSON to OUT: per case the largest weight difference between the two, how far
training moved the weights, both histories and the step counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: helpers

import tensorflow as tf
from contrastive_hand import SMALL, digits_data
from helpers import all_weights, largest_difference

import beatloop

#: Steps per compiled call on both device setups.
STEPS = 4


def train(config: dict, data, initial: dict, strategy=None):
    recipe = beatloop.make_recipe("contrastive", config)
    with strategy.scope() if strategy else contextlib.nullcontext():
        models = recipe.build_models(data[0].element_spec)
    for name, model in models.items():
        model.set_weights(initial[name])
    return beatloop.fit(
        recipe, data=data, models=models, epochs=2, seed=3, strategy=strategy,
        steps_per_execution=STEPS, progress=False,
    )  # fmt: skip


#: Rows of the default data's training and validation digits the ``defaults`` case keeps:
#: a full batch of 128 and each split's own last batch (1,437 training digits: 11 batches
#: of 128 then 29; 360 validation digits: 2 of 128 then 104), the same shares in fewer
#: steps.
DEFAULT_ROWS = (128 + 1437 % 128, 128 + 360 % 128)


def default_digits(config: dict):
    """The contrastive recipe's default data (``default_data``), unshuffled, cut to
    ``DEFAULT_ROWS``."""
    from beatloop.datasets import batches, digits_arrays

    recipe = beatloop.make_recipe("contrastive", config).config
    train, validation = digits_arrays(3, recipe.validation_fraction)
    assert (len(train["y"]), len(validation["y"])) == (1437, 360)
    return tuple(
        batches({key: value[:rows] for key, value in arrays.items()}, recipe.batch_size)
        for arrays, rows in zip((train, validation), DEFAULT_ROWS, strict=True)
    )


def compare(config: dict, data, strategy) -> dict:
    """``data``: ``(training, validation)``."""
    recipe = beatloop.make_recipe("contrastive", config)
    built = recipe.build_models(data[0].element_spec)
    initial = {name: model.get_weights() for name, model in built.items()}
    one, two = train(config, data, initial), train(config, data, initial, strategy)
    ones = all_weights(one.models)
    return {
        "replicas": strategy.num_replicas_in_sync,
        "moved": largest_difference(ones, all_weights(built)),
        "largest_difference": largest_difference(ones, all_weights(two.models)),
        "one": one.history,
        "two": two.history,
        "steps": [one.steps, two.steps],
    }


def main(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {
        target: compare({**SMALL, "target": target, "pretrain_epochs": 1},
                        digits_data(28, 9, 32), strategy)
        for target in ("none", "ema")
    }  # fmt: skip
    defaults = {"pretrain_epochs": 1}
    report["defaults"] = compare(defaults, default_digits(defaults), strategy)
    with open(out, "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main(sys.argv[1])
