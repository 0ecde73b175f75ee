"""Bind-time write checks under a MirroredStrategy over two logical CPUs, in their own
process (the devices must be set before any op runs): an act writing recipe state
trains, an update assigning outside its ``writes`` and an act assigning a model variable
are refused. Writes what happened to OUT (JSON)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder

import tensorflow as tf
from updates_recipe import Byol, byol_data

import beatloop
from beatloop import Act, Schedule, Update


class Counting(Byol):
    """An act that counts its steps in recipe state: allowed."""

    name = "counting_writes_test"

    def build_state(self):
        return {"n": tf.Variable(0, dtype=tf.int64, trainable=False)}

    def count(self, models, batch):
        models.state["n"].assign_add(1)

    def schedule(self):
        return Schedule([*super().schedule().beats, Act(self.count)])


def halve(models):
    kernel = models.raw("target").trainable_variables[0]
    kernel.assign(kernel * 0.5)


class Halving(Byol):
    """An update that assigns the frozen target without writing it."""

    name = "halving_writes_test"

    def schedule(self):
        beat = super().schedule().beats[0]
        return Schedule([beat, Update(halve, writes=())], frozen="target")


class Poking(Byol):
    """An act that assigns a trained model's bias."""

    name = "poking_writes_test"

    def poke(self, models, batch):
        bias = models.raw("online").trainable_variables[1]
        bias.assign(bias + 1.0)

    def schedule(self):
        return Schedule([*super().schedule().beats, Act(self.poke)])


def main(out: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    options = {"data": byol_data(), "epochs": 1, "seed": 5, "strategy": strategy}
    report = {"counted": int(beatloop.fit(Counting(), progress=False, **options).state["n"])}
    for recipe in (Halving(), Poking()):
        try:
            beatloop.fit(recipe, progress=False, **options)
            report[recipe.name] = None
        except beatloop.ScheduleError as error:
            report[recipe.name] = list(error.problems)
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
