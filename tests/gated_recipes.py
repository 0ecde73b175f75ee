"""Recipes whose beats update only while a condition holds (``only_if=``) or sum their
gradients over several steps (``accumulate=``), and the hand-written TensorFlow loops
they are compared with: a classifier, a GAN whose discriminator trains only while its
loss is above a threshold, and a PPO-style policy whose repeated updates stop once the
approximate KL passes 1.5 x its target (keras-io's "Proximal Policy Optimization")."""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf
from helpers import classifier, cross_entropy

import beatloop
from beatloop import EMA, Beat, Schedule
from beatloop.datasets import digits_arrays

# --- a classifier -------------------------------------------------------------------------


def digits_rows(count: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` training digits: ``x`` in [0, 1] (n, 64), ``y`` int32."""
    train, _ = digits_arrays(0)
    return train["x"][:count], train["y"][:count]


def digit_batches(size: int, count: int = 200) -> tf.data.Dataset:
    """Unshuffled ``{"x", "y"}`` batches of ``size`` of the first ``count`` digits (a
    short last batch when ``size`` does not divide ``count``)."""
    x, y = digits_rows(count)
    return tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(size)


def mean_cross_entropy(model, batch, training: bool = True) -> tf.Tensor:
    logits = model(batch["x"], training=training)
    values = keras.losses.sparse_categorical_crossentropy(batch["y"], logits, from_logits=True)
    return tf.reduce_mean(values)


def bright(models, batch) -> tf.Tensor:
    """A condition of the batch: its mean pixel is above 0.3 (about half the batches),
    over the global batch on any number of replicas (``models.all_gather``)."""
    return tf.reduce_mean(models.all_gather(batch["x"])) > 0.3


class OneDevice:
    """What a hand-written loop hands a condition for ``models``: a gather of one device."""

    @staticmethod
    def all_gather(x):
        return x


class Classifier(beatloop.Recipe):
    """A small digits classifier (``helpers.classifier``) and its one beat,
    ``Beat(loss="loss", optimizer="optimizer", updates="model", **beat)``; the optimizer
    is ``optimizer()``. With ``ema``, a ``target`` copy of it follows by an ``EMA``
    whose ``only_if`` is ``ema`` (e.g. the beat's name)."""

    name = "gated_classifier_test"
    batch_keys = {"x": 2, "y": 1}

    def __init__(self, optimizer: Callable = lambda: keras.optimizers.SGD(0.1), *, ema=None,
                 **beat):  # fmt: skip
        super().__init__()
        self.make_optimizer, self.ema, self.beat = optimizer, ema, beat

    def default_data(self, seed):
        raise NotImplementedError("a test passes its data")

    def build_models(self, batch_spec):
        models = {"model": classifier(16, seed=0)}
        if self.ema is not None:
            models["target"] = classifier(16, seed=0)
        return models

    def build_optimizers(self):
        return {"optimizer": self.make_optimizer()}

    def losses(self):
        return {"loss": lambda models, batch: mean_cross_entropy(models["model"], batch)}

    def schedule(self):
        beat = Beat(loss="loss", optimizer="optimizer", updates="model", **self.beat)
        if self.ema is None:
            return Schedule(beat)
        return Schedule((beat, EMA("model", "target", decay=0.5, only_if=self.ema)))

    def bright(self, models, batch):
        return bright(models, batch)


def hand_written_classifier(data, epochs: int, *, optimizer, accumulate: int = 1,
                            transform=None, condition=None, ema=False):  # fmt: skip
    """A ``tf.function`` loop of the classifier: each batch's gradients, through
    ``transform``, applied when ``condition(batch)`` holds; with ``accumulate`` N,
    summed times their rows over N batches and applied once as their mean (a partial
    sum at an epoch's end too); with ``ema``, a target copy following each update.
    Returns the models."""
    model = classifier(16, seed=0)
    target = classifier(16, seed=0) if ema else None
    variables = model.trainable_variables
    optimizer.build(variables)
    sums = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables]
    rows = tf.Variable(0.0, trainable=False)
    turns = tf.Variable(0, dtype=tf.int64, trainable=False)

    def apply(grads):
        if transform is not None:
            grads = transform(grads, variables)
        optimizer.apply(grads, variables)
        if target is not None:
            for t, s in zip(target.trainable_variables, variables, strict=True):
                t.assign(0.5 * t.value + 0.5 * s.value)

    def apply_sums():
        rows_now = rows.read_value()
        apply([s.read_value() / rows_now for s in sums])
        for s in sums:
            s.assign(tf.zeros_like(s))
        rows.assign(0.0)
        turns.assign(tf.zeros([], tf.int64))
        return tf.constant(True)

    @tf.function(autograph=False)
    def step(batch):
        with tf.GradientTape() as tape:
            loss = mean_cross_entropy(model, batch)
        grads = tape.gradient(loss, variables)
        holds = tf.constant(True) if condition is None else condition(OneDevice(), batch)
        if accumulate == 1:

            def update():
                apply(grads)
                return tf.constant(True)

            return tf.cond(holds, update, lambda: tf.constant(False))
        size = tf.cast(tf.shape(batch["x"])[0], tf.float32)
        for s, g in zip(sums, grads, strict=True):
            s.assign_add(tf.where(holds, g * size, tf.zeros_like(g)))
        rows.assign_add(size * tf.cast(holds, tf.float32))
        turns.assign_add(tf.cast(holds, tf.int64))
        return tf.cond(turns >= accumulate, apply_sums, lambda: tf.constant(False))

    @tf.function(autograph=False)
    def flush():
        return tf.cond(turns > 0, apply_sums, lambda: tf.constant(False))

    for _ in range(epochs):
        for batch in data:
            step(batch)
        if accumulate > 1:
            flush()
    return {"model": model, **({"target": target} if ema else {})}


# --- a GAN whose discriminator trains while its loss is above a threshold -------------------

LATENT = 8


def gan_models(seed: int = 1) -> dict[str, keras.Model]:
    keras.utils.set_random_seed(seed)
    generator = keras.Sequential(
        [keras.Input((LATENT,)), keras.layers.Dense(16, activation="relu"),
         keras.layers.Dense(64, activation="tanh")], name="generator",
    )  # fmt: skip
    discriminator = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)],
        name="discriminator",
    )
    return {"generator": generator, "discriminator": discriminator}


def discriminator_loss(models, x, noise):
    fake = models["generator"](noise)
    real_logits, fake_logits = models["discriminator"](x), models["discriminator"](fake)
    real = cross_entropy(tf.ones_like(real_logits), real_logits)
    return real + cross_entropy(tf.zeros_like(fake_logits), fake_logits)


def generator_loss(models, noise):
    fake_logits = models["discriminator"](models["generator"](noise))
    return cross_entropy(tf.ones_like(fake_logits), fake_logits)


class ThresholdGan(beatloop.Recipe):
    """Two beats a step: the discriminator's, applied only while its loss is above
    ``threshold`` (its condition takes the loss), then the generator's."""

    name = "threshold_gan_test"
    batch_keys = {"x": 2}

    def __init__(self, threshold: float = 1.0, **discriminator_beat):
        super().__init__()
        self.threshold, self.discriminator_beat = threshold, discriminator_beat

    def default_data(self, seed):
        raise NotImplementedError("a test passes its data")

    def build_models(self, batch_spec):
        return gan_models()

    def build_optimizers(self):
        return {name: keras.optimizers.Adam(2e-3, beta_1=0.5) for name in ("d_opt", "g_opt")}

    def losses(self):
        def d_loss(models, batch):
            noise = models.random.normal([tf.shape(batch["x"])[0], LATENT])
            return discriminator_loss(models, batch["x"], noise)

        def g_loss(models, batch):
            return generator_loss(models, models.random.normal([tf.shape(batch["x"])[0], LATENT]))

        return {"d_loss": d_loss, "g_loss": g_loss}

    def schedule(self):
        options = {"only_if": "discriminator_behind", **self.discriminator_beat}
        return Schedule(
            (
                Beat("d_loss", "d_opt", "discriminator", **options),
                Beat("g_loss", "g_opt", "generator"),
            )
        )

    def discriminator_behind(self, models, batch, loss):
        return loss > self.threshold


def hand_written_threshold_gan(
    data, epochs: int, *, seed: int, threshold: float | None, accumulate: int = 1
):
    """The threshold GAN as a ``tf.function`` loop (``threshold=None``: the
    discriminator always trains; ``accumulate``: its gradients summed over that many
    steps, by rows, and applied once); returns the models and how many discriminator
    updates it made."""
    models = gan_models()
    generator, discriminator = models["generator"], models["discriminator"]
    d_opt, g_opt = (keras.optimizers.Adam(2e-3, beta_1=0.5) for _ in "dg")
    noise_source = tf.random.Generator.from_seed(seed)
    updates = tf.Variable(0, dtype=tf.int64)
    d_vars = discriminator.trainable_variables
    d_opt.build(d_vars)
    sums = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in d_vars]
    rows = tf.Variable(0.0, trainable=False)
    turns = tf.Variable(0, dtype=tf.int64, trainable=False)

    def apply_sums():
        rows_now = rows.read_value()
        d_opt.apply([s.read_value() / rows_now for s in sums], d_vars)
        updates.assign_add(1)
        for s in sums:
            s.assign(tf.zeros_like(s))
        rows.assign(0.0)
        turns.assign(tf.zeros([], tf.int64))
        return tf.constant(True)

    def discriminator_update(d_grads, d_loss, n):
        if accumulate > 1:
            size = tf.cast(n, tf.float32)
            for s, g in zip(sums, d_grads, strict=True):
                s.assign_add(g * size)
            rows.assign_add(size)
            turns.assign_add(1)
            tf.cond(turns >= accumulate, apply_sums, lambda: tf.constant(False))
            return

        def update():
            d_opt.apply(d_grads, d_vars)
            updates.assign_add(1)
            return tf.constant(True)

        holds = tf.constant(True) if threshold is None else d_loss > threshold
        tf.cond(holds, update, lambda: tf.constant(False))

    @tf.function(autograph=False)
    def flush():
        return tf.cond(turns > 0, apply_sums, lambda: tf.constant(False))

    @tf.function(autograph=False)
    def step(x):
        n = tf.shape(x)[0]
        with tf.GradientTape() as tape:
            noise = noise_source.normal([n, LATENT])
            calls = {
                "generator": lambda z: generator(z, training=False),
                "discriminator": lambda v: discriminator(v, training=True),
            }
            d_loss = discriminator_loss(calls, x, noise)
        d_grads = tape.gradient(d_loss, d_vars)
        discriminator_update(d_grads, d_loss, n)
        with tf.GradientTape() as tape:
            calls = {
                "generator": lambda z: generator(z, training=True),
                "discriminator": lambda v: discriminator(v, training=False),
            }
            g_loss = generator_loss(calls, noise_source.normal([n, LATENT]))
        g_grads = tape.gradient(g_loss, generator.trainable_variables)
        g_opt.apply(g_grads, generator.trainable_variables)

    for _ in range(epochs):
        for batch in data:
            step(batch["x"])
        if accumulate > 1:
            flush()
    return models, int(updates.numpy())


# --- PPO's early stop on the approximate KL ---------------------------------------------------

ACTIONS = 4


def policy_model(seed: int = 2) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(16, activation="tanh"),
         keras.layers.Dense(ACTIONS)], name="policy",
    )  # fmt: skip


def rollout_batches(size: int = 32, count: int = 128) -> tf.data.Dataset:
    """Observations (digits), the actions taken, their log-probabilities under the
    starting policy, and advantages: a PPO update's batches, fixed by a seed."""
    x, _ = digits_rows(count)
    rng = np.random.default_rng(4)
    actions = rng.integers(0, ACTIONS, count).astype("int32")
    advantages = rng.normal(size=count).astype("float32")
    logits = policy_model()(x)
    old = tf.gather(tf.nn.log_softmax(logits), actions, batch_dims=1).numpy()
    rows = {"x": x, "action": actions, "old_log_prob": old, "advantage": advantages}
    return tf.data.Dataset.from_tensor_slices(rows).batch(size)


def log_prob(policy, batch, training):
    logits = policy(batch["x"], training=training)
    return tf.gather(tf.nn.log_softmax(logits), batch["action"], batch_dims=1)


def clipped_surrogate(policy, batch, training=True):
    ratio = tf.exp(log_prob(policy, batch, training) - batch["old_log_prob"])
    clipped = tf.clip_by_value(ratio, 0.8, 1.2) * batch["advantage"]
    return -tf.reduce_mean(tf.minimum(ratio * batch["advantage"], clipped))


def approximate_kl(policy, batch):
    return tf.reduce_mean(batch["old_log_prob"] - log_prob(policy, batch, training=False))


class KlStop(beatloop.Recipe):
    """The policy's beat repeats ``iterations`` times a step, each update only while the
    approximate KL from the rollout's policy is at most 1.5 x ``target_kl`` (asked
    before each update: keras-io's loop breaks after the update that passes it)."""

    name = "kl_stop_test"
    batch_keys = {"x": 2, "action": 1, "old_log_prob": 1, "advantage": 1}

    def __init__(self, target_kl: float = 0.01, iterations: int = 6):
        super().__init__()
        self.target_kl, self.iterations = target_kl, iterations

    def default_data(self, seed):
        raise NotImplementedError("a test passes its data")

    def build_models(self, batch_spec):
        return {"policy": policy_model()}

    def build_optimizers(self):
        return {"policy_opt": keras.optimizers.Adam(3e-2)}

    def losses(self):
        return {"policy": lambda models, batch: clipped_surrogate(models["policy"], batch)}

    def schedule(self):
        beat = Beat("policy", "policy_opt", "policy", repeat=self.iterations, only_if="kl_ok")
        return Schedule(beat)

    def kl_ok(self, models, batch):
        return approximate_kl(models["policy"], batch) <= 1.5 * self.target_kl


def hand_written_kl_stop(data, epochs: int, *, target_kl: float, iterations: int):
    """keras-io's policy update: ``iterations`` updates a batch, breaking once the
    approximate KL after an update passes 1.5 x ``target_kl``. Returns the policy and
    the number of updates."""
    policy = policy_model()
    optimizer = keras.optimizers.Adam(3e-2)
    optimizer.build(policy.trainable_variables)
    updates = 0

    @tf.function(autograph=False)
    def train_policy(batch):
        with tf.GradientTape() as tape:
            loss = clipped_surrogate(policy, batch)
        grads = tape.gradient(loss, policy.trainable_variables)
        optimizer.apply(grads, policy.trainable_variables)
        return approximate_kl(policy, batch)

    @tf.function(autograph=False)
    def kl_now(batch):
        return approximate_kl(policy, batch)

    for _ in range(epochs):
        for batch in data:
            if kl_now(batch) > 1.5 * target_kl:  # stopped before: no update this batch
                continue
            for _ in range(iterations):
                updates += 1
                if train_policy(batch) > 1.5 * target_kl:
                    break
    return policy, updates
