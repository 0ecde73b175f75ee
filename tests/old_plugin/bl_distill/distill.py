"""Knowledge distillation (Hinton et al., "Distilling the Knowledge in a Neural Network",
2015), teacher and student trained together on the built-in digits.

One forward pass per step computes both networks' logits (a ``Group``: docs/plugins.md,
"Groups: beats updated simultaneously"); the teacher's beat learns the labels, the
student's beat learns a mix of the labels' cross-entropy and the KL divergence from the
teacher's outputs softened by ``temperature`` (the distillation loss of
docs/schedules.md, "Models the user supplies"). The student sees its digits with a little
Gaussian noise drawn from ``models.random``, the run's checkpointed generator, so a
resumed run is exact.
"""

import attrs
import keras
import tensorflow as tf

import beatloop
from beatloop import Beat, Group, Schedule
from beatloop.data import digits

_positive = attrs.validators.gt(0)


@attrs.frozen
class DistillConfig:
    """Settings of the distillation recipe."""

    teacher_hidden: int = attrs.field(default=32, validator=_positive)
    student_hidden: int = attrs.field(default=16, validator=_positive)
    temperature: float = attrs.field(default=4.0, validator=_positive)
    alpha: float = attrs.field(
        default=0.3, validator=[attrs.validators.ge(0), attrs.validators.le(1)]
    )
    noise: float = attrs.field(default=0.05, validator=attrs.validators.ge(0))
    learning_rate: float = attrs.field(default=1e-2, validator=_positive)
    batch_size: int = attrs.field(default=64, validator=_positive)


class Distill(beatloop.Recipe):
    """A teacher and a student on digits, the student distilled from the teacher's soft outputs."""

    name = "distill"
    Config = DistillConfig
    batch_keys = {"x": 2, "y": 1}
    autograph = False  # no Python `if` or `for` on a tensor's value

    def default_data(self, seed):
        return digits(seed, self.config.batch_size)

    def build_models(self, spec):
        size = spec["x"].shape[-1]

        def network(hidden, name):
            layers = [keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(10)]
            return keras.Sequential([keras.Input((size,)), *layers], name=name)

        return {
            "teacher": network(self.config.teacher_hidden, "teacher"),
            "student": network(self.config.student_hidden, "student"),
        }

    def build_optimizers(self):
        rate = self.config.learning_rate
        return {
            "teacher_opt": keras.optimizers.Adam(rate),
            "student_opt": keras.optimizers.Adam(rate),
        }

    def forwards(self):
        return {"logits": self.logits}

    def logits(self, models, batch):  # both networks, once for both beats
        x = batch["x"]
        noisy = x + self.config.noise * models.random.normal(tf.shape(x))
        return {"teacher": models["teacher"](x), "student": models["student"](noisy)}

    def losses(self):
        return {"teacher_loss": self.teacher_loss, "distillation": self.distillation}

    def teacher_loss(self, outputs, batch):
        return tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(
                batch["y"], outputs["teacher"], from_logits=True
            )
        )

    def distillation(self, outputs, batch):
        t, alpha = self.config.temperature, self.config.alpha
        teacher = tf.stop_gradient(outputs["teacher"])  # the student learns from it, not it
        student = outputs["student"]
        soft = keras.losses.kl_divergence(tf.nn.softmax(teacher / t), tf.nn.softmax(student / t))
        hard = keras.losses.sparse_categorical_crossentropy(batch["y"], student, from_logits=True)
        return tf.reduce_mean(alpha * hard + (1 - alpha) * t**2 * soft)

    def schedule(self):
        beats = (
            Beat("teacher_loss", "teacher_opt", "teacher"),
            Beat("distillation", "student_opt", "student"),
        )
        return Schedule(Group(forward="logits", beats=beats))

    def build_metrics(self):
        return {
            "teacher_accuracy": keras.metrics.SparseCategoricalAccuracy(name="teacher_accuracy"),
            "student_accuracy": keras.metrics.SparseCategoricalAccuracy(name="student_accuracy"),
            "agreement": keras.metrics.Mean(name="agreement"),
        }

    def update_metrics(self, metrics, batch, outputs):
        logits = outputs["logits"]  # the group's forward, under its name
        metrics["teacher_accuracy"].update_state(batch["y"], logits["teacher"])
        metrics["student_accuracy"].update_state(batch["y"], logits["student"])
        same = tf.equal(tf.argmax(logits["teacher"], -1), tf.argmax(logits["student"], -1))
        metrics["agreement"].update_state(tf.cast(same, tf.float32))
