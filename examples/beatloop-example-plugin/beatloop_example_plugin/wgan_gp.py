"""WGAN-GP: a Wasserstein GAN whose critic is kept 1-Lipschitz by a gradient penalty.

Gulrajani et al., "Improved Training of Wasserstein GANs" (2017). The critic beat runs
``n_critic`` times per step, then the generator beat once; the penalty on the critic's
gradient norm at points between real and generated samples is computed with a nested
``GradientTape`` inside the critic's loss, so the outer tape differentiates through it.
"""

import attrs
import keras
import tensorflow as tf

import beatloop
from beatloop.datasets import digits

_positive = attrs.validators.gt(0)


@attrs.frozen
class WganGpConfig:
    """Settings of the WGAN-GP recipe."""

    latent_dim: int = attrs.field(default=16, validator=_positive)
    hidden: int = attrs.field(default=128, validator=_positive)
    n_critic: int = attrs.field(default=5, validator=_positive)
    gp_weight: float = attrs.field(default=10.0, validator=attrs.validators.ge(0))
    learning_rate: float = attrs.field(default=1e-4, validator=_positive)
    batch_size: int = attrs.field(default=64, validator=_positive)


class WganGp(beatloop.Recipe):
    """Wasserstein GAN with gradient penalty on digits (critic trained n_critic times)."""

    name = "wgan_gp"
    Config = WganGpConfig
    batch_keys = {"x": 2}

    def default_data(self, seed):
        return digits(seed, self.config.batch_size, signed=True)  # pixels in [-1, 1]

    def build_models(self, spec):
        size, hidden, latent = spec["x"].shape[-1], self.config.hidden, self.config.latent_dim
        generator = keras.Sequential(
            [
                keras.Input((latent,)),
                keras.layers.Dense(hidden, activation="relu"),
                keras.layers.Dense(hidden, activation="relu"),
                keras.layers.Dense(size, activation="tanh"),
            ],
            name="generator",
        )
        critic = keras.Sequential(
            [
                keras.Input((size,)),
                keras.layers.Dense(hidden, activation="leaky_relu"),
                keras.layers.Dense(hidden, activation="leaky_relu"),
                keras.layers.Dense(1),
            ],
            name="critic",
        )
        return {"generator": generator, "critic": critic}

    def build_optimizers(self):
        adam = lambda: keras.optimizers.Adam(self.config.learning_rate, beta_1=0.5, beta_2=0.9)  # noqa: E731
        return {"critic_opt": adam(), "generator_opt": adam()}

    def losses(self):
        return {"critic_loss": self.critic_loss, "generator_loss": self.generator_loss}

    def schedule(self):
        return beatloop.Schedule(
            (
                beatloop.Beat(
                    loss="critic_loss",
                    optimizer="critic_opt",
                    updates="critic",
                    repeat=self.config.n_critic,
                ),
                beatloop.Beat(
                    loss="generator_loss", optimizer="generator_opt", updates="generator"
                ),
            )
        )

    def _generate(self, models, count):
        noise = models.random.normal([count, self.config.latent_dim])
        return models["generator"](noise)

    def critic_loss(self, models, batch):
        real = batch["x"]
        fake = self._generate(models, tf.shape(real)[0])
        critic = models["critic"]
        wasserstein = tf.reduce_mean(critic(real)) - tf.reduce_mean(critic(fake))
        mix = models.random.uniform([tf.shape(real)[0], 1])
        between = mix * real + (1.0 - mix) * fake
        with tf.GradientTape() as inner:
            inner.watch(between)
            scores = critic(between)
        norms = tf.norm(inner.gradient(scores, between), axis=1)
        penalty = tf.reduce_mean(tf.square(norms - 1.0))
        return {
            "loss": -wasserstein + self.config.gp_weight * penalty,
            "wasserstein": wasserstein,
            "penalty": penalty,
        }

    def generator_loss(self, models, batch):
        fake = self._generate(models, tf.shape(batch["x"])[0])
        return -tf.reduce_mean(models["critic"](fake))

    def build_metrics(self):
        return {
            "wasserstein": keras.metrics.Mean(name="wasserstein"),
            "penalty": keras.metrics.Mean(name="penalty"),
        }

    def update_metrics(self, metrics, batch, outputs):
        metrics["wasserstein"].update_state(outputs["critic_loss"]["wasserstein"])
        metrics["penalty"].update_state(outputs["critic_loss"]["penalty"])
