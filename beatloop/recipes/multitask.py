"""The multi-task recipe: a shared backbone, one head per task, and dynamically weighted
task losses.

Two schedules. ``joint``: one beat whose loss is the weighted sum of the task losses;
one optimizer updates the backbone and every head at once (the brief's "concatenate the
gradient lists, apply once"). ``alternating``: one beat per task, each updating the
backbone (declared shared) and its own head.

With ``combine="pcgrad"`` the joint step takes each task's gradient separately: one
beat per task in a ``Group`` whose forward runs the backbone (and every head) once, the
backbone's task gradients combined by ``PCGrad`` (Yu et al. 2020) before one update;
``combine="sum"`` is the plain joint beat (the sum of the task gradients).

Three weightings, fixed, uncertainty (Kendall et al. 2018) and dwa (Dynamic Weight
Average, Liu et al. 2019), from ``beatloop.recipes.loss_weights`` (shared with
``recommender``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import attrs
import keras
import tensorflow as tf

from beatloop import (
    Beat,
    Callback,
    ConfigError,
    DataSplit,
    Group,
    ModelCalls,
    PCGrad,
    Recipe,
    Run,
    Schedule,
    choice,
    setting,
)
from beatloop import datasets as data
from beatloop.layers import inputs_like, joined_features
from beatloop.recipes import loss_weights
from beatloop.recipes.loss_weights import LogVariances, dwa_weights

_positive = attrs.validators.gt(0)


@attrs.frozen
class Task:
    """One task: its name, kind, and where its target comes from.

    ``classification`` tasks read integer labels, ``regression`` tasks one number per
    sample; ``target`` is a batch key, or ``"ink"``: the mean pixel value of ``x``.
    """

    name: str
    kind: Literal["classification", "regression"]
    target: str
    classes: int = 1

    def targets(self, batch) -> tf.Tensor:
        if self.target == "ink":
            return tf.reduce_mean(tf.reshape(batch["x"], [tf.shape(batch["x"])[0], -1]), axis=1)
        return tf.reshape(batch[self.target], [-1])

    def loss(self, outputs: tf.Tensor, batch) -> tf.Tensor:
        targets = self.targets(batch)
        if self.kind == "classification":
            return tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=tf.cast(targets, tf.int32), logits=outputs
                )
            )
        return tf.reduce_mean(tf.square(outputs[:, 0] - tf.cast(targets, tf.float32)))


BUILT_IN_TASKS = {
    "digit": Task("digit", "classification", "y", classes=10),
    "ink": Task("ink", "regression", "ink"),
}


def parse_task(spec: str) -> Task:
    """``"digit"``, ``"ink"``, or ``"NAME=classification:K"`` / ``"NAME=regression"``
    reading the batch key NAME."""
    if spec in BUILT_IN_TASKS:
        return BUILT_IN_TASKS[spec]
    name, sep, kind = spec.partition("=")
    kind, _, classes = kind.partition(":")
    if sep and name.isidentifier() and kind == "regression" and not classes:
        return Task(name, "regression", name)
    if sep and name.isidentifier() and kind == "classification" and classes.isdigit():
        return Task(name, "classification", name, classes=int(classes))
    raise ConfigError(
        f"task {spec!r} is not 'digit', 'ink', 'KEY=classification:CLASSES' or 'KEY=regression'"
    )


def _tasks_valid(instance, attribute, value) -> None:
    tasks = [parse_task(spec) for spec in value]
    if len(tasks) < 2:
        raise ValueError(f"multitask needs at least two tasks, got {list(value)}")
    if len({t.name for t in tasks}) != len(tasks):
        raise ValueError(f"task names must be distinct, got {[t.name for t in tasks]}")


@attrs.frozen
class MultitaskConfig:
    """Settings of the multi-task recipe."""

    tasks: tuple[str, ...] = setting(
        ("digit", "ink"),
        "the tasks: digit, ink, or KEY=classification:K / KEY=regression reading the batch's KEY",
        _tasks_valid,
    )
    schedule: Literal["joint", "alternating"] = choice(
        "joint",
        ("joint", "alternating"),
        "joint: one beat, the weighted sum of the task losses; alternating: one beat per task",
    )
    combine: Literal["sum", "pcgrad"] = choice(
        "sum",
        ("sum", "pcgrad"),
        "how the joint step combines the task gradients on the backbone: sum, or pcgrad "
        "(PCGrad, Yu et al. 2020: one beat per task, conflicts projected away)",
    )
    weighting: Literal["fixed", "uncertainty", "dwa"] = choice(
        "fixed", loss_weights.WEIGHTINGS, loss_weights.WEIGHTING_HELP
    )
    weights: tuple[float, ...] = setting(
        (), "fixed weights, one per task, each at least 0 (default: all 1)",
        loss_weights.non_negative,
    )  # fmt: skip
    dwa_temperature: float = setting(2.0, "DWA's temperature T", _positive)
    hidden: int = setting(64, "width of the shared backbone", _positive)
    learning_rate: float = setting(1e-3, "Adam's learning rate", _positive)
    batch_size: int = setting(32, "batch size of the built-in data", _positive)

    def __attrs_post_init__(self) -> None:
        if self.combine == "pcgrad" and self.schedule != "joint":
            raise ValueError(
                "combine='pcgrad' combines the task gradients of one joint update, but "
                f"schedule={self.schedule!r} updates the tasks one after another: "
                "use schedule='joint'"
            )
        if self.weights and len(self.weights) != len(self.tasks):
            raise ValueError(
                f"weights gives {len(self.weights)} value(s) for {len(self.tasks)} tasks"
            )


class Multitask(Recipe):
    """Shared backbone, one head per task, fixed/uncertainty/DWA loss weights (digits)."""

    name = "multitask"
    autograph = False  # no Python control flow on tensors: traced as written
    #: Keras callbacks see the shared backbone (every beat updates it, with "optimizer").
    primary_model = "backbone"
    quality_figure = ("val_digit_accuracy", "max")
    Config = MultitaskConfig

    @property
    def tasks(self) -> list[Task]:
        return [parse_task(spec) for spec in self.config.tasks]

    @property
    def batch_keys(self) -> dict[str, int]:
        keys = {"x": 2}
        keys.update({t.target: 1 for t in self.tasks if t.target != "ink"})
        return keys

    def label_classes(self) -> dict[str, str]:
        # Each classification task's classes come from its entry in ``tasks``.
        return {t.target: "tasks" for t in self.tasks if t.kind == "classification"}

    def default_data(self, seed: int) -> DataSplit:
        return data.digits(seed, self.config.batch_size)

    def build_models(self, batch_spec: Mapping[str, tf.TensorSpec]) -> dict[str, keras.Layer]:
        hidden = self.config.hidden
        models: dict[str, keras.Layer] = {"backbone": self._backbone(batch_spec["x"])}
        for task in self.tasks:
            models[f"head_{task.name}"] = keras.Sequential(
                [keras.Input((hidden,)), keras.layers.Dense(task.classes)], name=f"head_{task.name}"
            )
        names = [t.name for t in self.tasks]
        models.update(loss_weights.weight_models(self.config.weighting, names, self.config.weights))
        return models

    def _backbone(self, x) -> keras.Model:
        """The shared backbone: two relu layers of ``hidden`` on the features (a dict or
        tuple of them, named inputs, joined into one row)."""
        hidden = self.config.hidden
        if isinstance(x, Mapping | tuple | list):
            inputs = inputs_like(x)
            features = joined_features(inputs)
            for _ in range(2):
                features = keras.layers.Dense(hidden, activation="relu")(features)
            return keras.Model(inputs, features, name="backbone")
        return keras.Sequential(
            [
                keras.Input(tuple(x.shape[1:])),
                keras.layers.Flatten(),
                keras.layers.Dense(hidden, activation="relu"),
                keras.layers.Dense(hidden, activation="relu"),
            ],
            name="backbone",
        )

    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        return {"optimizer": keras.optimizers.Adam(self.config.learning_rate)}

    def schedule(self) -> Schedule:
        uncertain = self.config.weighting == "uncertainty"
        if self.config.schedule == "joint" and self.config.combine == "sum":
            updates = ["backbone", *(f"head_{t.name}" for t in self.tasks)]
            if uncertain:
                updates.append("uncertainty")
            return Schedule(Beat(loss="total", optimizer="optimizer", updates=tuple(updates)))
        beats = []
        for task in self.tasks:
            updates = ["backbone", f"head_{task.name}"]
            if uncertain:
                updates.append(f"uncertainty:*log_var_{task.name}")
            beats.append(
                Beat(loss=f"task_{task.name}", optimizer="optimizer", updates=tuple(updates))
            )
        if self.config.combine == "pcgrad":
            beats = [Group(forward="tasks", beats=beats, combine=PCGrad())]
        return Schedule(tuple(beats), shared="backbone")

    # --- losses ----------------------------------------------------------------------------

    def losses(self):
        if self.config.combine == "pcgrad":
            return {f"task_{t.name}": _weighted_output(t) for t in self.tasks}
        if self.config.schedule == "joint":
            return {"total": self.joint_loss}
        return {f"task_{t.name}": self._task_beat(t) for t in self.tasks}

    def forwards(self):
        return {"tasks": self.tasks_forward}

    def tasks_forward(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        """The backbone once, every head on its features, and each task's weighted loss
        (``weighted_NAME``): what the ``pcgrad`` group's task beats take."""
        features = models["backbone"](batch["x"])
        result = {}
        for index, task in enumerate(self.tasks):
            outputs = self._task_outputs(models, task, features, batch)
            loss = self._weighted(models, index, task, outputs[f"{task.name}_loss"])
            result.update({f"weighted_{task.name}": loss, **outputs})
        return result

    def _weighted(self, models: ModelCalls, index: int, task: Task, loss: tf.Tensor) -> tf.Tensor:
        return loss_weights.weighted(models, self.config.weighting, index, task.name, loss)

    def _task_outputs(self, models: ModelCalls, task: Task, features, batch) -> dict:
        outputs = models[f"head_{task.name}"](features)
        return {f"{task.name}_loss": task.loss(outputs, batch), f"{task.name}_out": outputs}

    def joint_loss(self, models: ModelCalls, batch) -> dict[str, tf.Tensor]:
        features = models["backbone"](batch["x"])
        result, total = {}, []
        for index, task in enumerate(self.tasks):
            outputs = self._task_outputs(models, task, features, batch)
            total.append(self._weighted(models, index, task, outputs[f"{task.name}_loss"]))
            result.update(outputs)
        return {"loss": tf.add_n(total), **result}

    def _task_beat(self, task: Task):
        index = self.tasks.index(task)

        def task_loss(models: ModelCalls, batch) -> dict[str, tf.Tensor]:
            features = models["backbone"](batch["x"])
            outputs = self._task_outputs(models, task, features, batch)
            loss = self._weighted(models, index, task, outputs[f"{task.name}_loss"])
            return {"loss": loss, **outputs}

        return task_loss

    # --- metrics and weights -----------------------------------------------------------

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        metrics = {}
        for task in self.tasks:
            metrics[f"{task.name}_loss"] = keras.metrics.Mean(name=f"{task.name}_loss")
            if task.kind == "classification":
                metrics[f"{task.name}_accuracy"] = keras.metrics.SparseCategoricalAccuracy()
            else:
                metrics[f"{task.name}_mae"] = keras.metrics.MeanAbsoluteError()
        return metrics

    def update_metrics(self, metrics, batch, outputs) -> None:
        merged = {key: value for beat in outputs.values() for key, value in beat.items()}
        for task in self.tasks:
            metrics[f"{task.name}_loss"].update_state(merged[f"{task.name}_loss"])
            prediction, target = merged[f"{task.name}_out"], task.targets(batch)
            if task.kind == "classification":
                metrics[f"{task.name}_accuracy"].update_state(target, prediction)
            else:
                metrics[f"{task.name}_mae"].update_state(target, prediction[:, 0])

    def current_weights(self, models: Mapping[str, keras.Layer]) -> dict[str, float]:
        """The weight each task's loss had this epoch (``exp(-s)`` for uncertainty)."""
        names = [t.name for t in self.tasks]
        return loss_weights.current_weights(models, self.config.weighting, names)

    def epoch_figures(self, run: Run) -> dict[str, float]:
        return {f"weight_{name}": w for name, w in self.current_weights(run.models).items()}

    def callbacks(self) -> list[Callback]:
        return [DynamicWeightAverage(self)] if self.config.weighting == "dwa" else []

    def inference_models(self, models):
        """One model: the backbone feeding every head, outputs by task name."""
        backbone = models["backbone"]
        inputs = inputs_like(_input_spec(backbone))
        features = backbone(inputs)
        outputs = {t.name: models[f"head_{t.name}"](features) for t in self.tasks}
        return {"multitask": keras.Model(inputs, outputs, name="multitask")}


def _input_spec(model: keras.Model):
    """The structure of ``model``'s declared inputs as tensor specs (one, or a dict or
    list of them), for a new model calling it on inputs of the same shapes."""
    spec = lambda t: tf.TensorSpec(t.shape, t.dtype)  # noqa: E731
    if isinstance(model, keras.Sequential):  # one input, which ``input`` may not say yet
        return spec(model.inputs[0])
    return tf.nest.map_structure(spec, model.input)


def _weighted_output(task: Task):
    """A ``pcgrad`` task beat's loss: its weighted loss, computed by the group's forward."""

    def task_loss(outputs, batch) -> tf.Tensor:
        return outputs[f"weighted_{task.name}"]

    task_loss.__qualname__ = f"task_{task.name}"
    return task_loss


class DynamicWeightAverage(loss_weights.DynamicWeightAverage):
    """DWA over the multitask recipe's tasks (its own class: checkpoints key a callback's
    state by its class path)."""

    def __init__(self, recipe: Multitask):
        super().__init__(
            lambda: [t.name for t in recipe.tasks], lambda: recipe.config.dwa_temperature
        )
        self.recipe = recipe


__all__ = ["DynamicWeightAverage", "LogVariances", "Multitask", "dwa_weights"]
