"""The ppo recipe: proximal policy optimisation (Schulman et al., 2017) on N parallel
copies of an environment written in TensorFlow ops, every part inside the compiled step.

One step is one minibatch update. An ``Act`` collects a rollout (T steps of the N
copies, actions sampled with the run's generator; ``beatloop.recipes.ppo_rollout``)
whenever the previous rollout's ``update_epochs`` x ``minibatches`` updates are done,
computes GAE advantages and returns, and draws the shuffles of its minibatches; the beat
takes the clipped surrogate, a value loss and an entropy bonus on the next minibatch,
its gradients clipped to a global norm. With ``target_kl`` the beat updates only until
CleanRL's early stop on the approximate KL ends the rollout's passes
(``within_target_kl``). The rollout, the environments, the shuffles and the counters
(the early stop's too) are recipe state, so a checkpoint (mid-rollout or mid-update)
holds all of it. Advantages are normalised over the whole rollout, so a minibatch split
over replicas is the one-device minibatch.
"""

from __future__ import annotations

import math
import warnings

import attrs
import keras
import tensorflow as tf

from beatloop import (
    Act,
    Beat,
    Callback,
    ClipByGlobalNorm,
    DataSplit,
    Environment,
    IgnoredSettingWarning,
    Recipe,
    Run,
    Schedule,
    loop_data,
    make_environment,
    setting,
)
from beatloop.recipes import ppo_rollout as rollout

_positive = attrs.validators.gt(0)
_fraction = [attrs.validators.ge(0), attrs.validators.le(1)]
_non_negative = attrs.validators.ge(0)


@attrs.frozen
class PpoConfig:
    """Settings of the ppo recipe."""

    env: str = setting("cartpole", "the environment, by name: cartpole, chain, or a plugin's")
    env_settings: tuple[str, ...] = setting(
        (), "the environment's parameters as NAME=VALUE items (e.g. horizon=100)"
    )
    envs: int = setting(8, "copies of the environment stepped side by side (N)", _positive)
    rollout_steps: int = setting(128, "steps of every copy in one rollout (T)", _positive)
    update_epochs: int = setting(4, "passes over each rollout (E)", _positive)
    minibatches: int = setting(4, "minibatches each pass is shuffled into (M)", _positive)
    rollouts_per_epoch: int = setting(
        80, "rollouts an epoch collects; an epoch is rollouts x E x M steps", _positive
    )
    hidden: int = setting(64, "width of the two hidden tanh layers of actor and critic", _positive)
    shared_torso: bool = setting(False, "actor and critic share their hidden layers (one model)")
    learning_rate: float = setting(1e-3, "Adam's (first) learning rate", _positive)
    anneal_rollouts: int = setting(
        80, "rollouts over which the learning rate falls linearly to 0, then stays there (a "
        "run with more is warned of; 0: no annealing)", _non_negative,
    )  # fmt: skip
    gamma: float = setting(0.99, "the discount of future rewards", _fraction)
    gae_lambda: float = setting(0.95, "GAE's lambda: the bias-variance trade of advantages",
                                _fraction)  # fmt: skip
    clip: float = setting(0.2, "the surrogate's clip range epsilon: ratio in [1-eps, 1+eps]",
                          _positive)  # fmt: skip
    clip_value: bool = setting(True, "clip the critic's change to +-clip as the policy's is")
    value_coef: float = setting(0.5, "weight of the value loss", _non_negative)
    entropy_coef: float = setting(0.01, "weight of the entropy bonus", _non_negative)
    max_grad_norm: float = setting(0.5, "gradients clipped to this global norm", _positive)
    normalize_advantages: bool = setting(True, "advantages to mean 0, std 1 over the rollout")
    target_kl: float | None = setting(
        None,
        "stop a rollout's remaining passes once a pass ends with its last minibatch's "
        "approximate KL above this (CleanRL's target_kl; None: never)",
        attrs.validators.optional(_positive),
    )
    validation_batches: int = setting(
        1, "batches of the validation loss (the last minibatch under the weights now)", _positive
    )

    def __attrs_post_init__(self) -> None:
        rows = self.envs * self.rollout_steps
        if rows % self.minibatches:
            raise ValueError(
                f"envs x rollout_steps ({self.envs} x {self.rollout_steps} = {rows} rows) "
                f"must split into minibatches ({self.minibatches}) of equal size"
            )

    @property
    def updates_per_rollout(self) -> int:
        return self.update_epochs * self.minibatches

    @property
    def minibatch_size(self) -> int:
        return self.envs * self.rollout_steps // self.minibatches


class LinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """A learning rate falling linearly from ``initial`` to 0 over ``updates`` optimizer
    iterations, then 0 (read from the optimizer's checkpointed ``iterations``)."""

    def __init__(self, initial: float, updates: int):
        self.initial, self.updates = initial, updates

    def __call__(self, step):
        done = tf.minimum(tf.cast(step, tf.float32) / float(self.updates), 1.0)
        return self.initial * (1.0 - done)

    def get_config(self):
        return {"initial": self.initial, "updates": self.updates}


def annealing_outlasted(config: PpoConfig, epochs: int, steps_per_epoch: int | None) -> str | None:
    """What to warn of when a run of ``epochs`` of ``steps_per_epoch`` outlasts the
    learning rate's annealing (its steps after the rate reached 0 train nothing); ``None``
    when it does not."""
    updates = config.updates_per_rollout
    if not config.anneal_rollouts or not steps_per_epoch:
        return None
    annealed, planned = config.anneal_rollouts * updates, epochs * steps_per_epoch
    if planned <= annealed:
        return None
    needed = math.ceil(planned / updates)
    stopped = " (target_kl's stopped updates delay it)" if config.target_kl is not None else ""
    return (
        f"recipe 'ppo': the learning rate falls linearly to 0 over anneal_rollouts="
        f"{config.anneal_rollouts} rollouts ({annealed} updates){stopped}, reached in epoch "
        f"{math.ceil(annealed / steps_per_epoch)} of the {epochs} this run asks for: the "
        f"steps after it train nothing. To anneal over the whole run set anneal_rollouts="
        f"{needed} (--set anneal_rollouts={needed}: {epochs} epochs of {steps_per_epoch} "
        "updates), or 0 to keep the rate"
    )


class AnnealingCheck(Callback):
    """Warns at a run's start (``IgnoredSettingWarning``) when its epochs outlast the
    learning rate's annealing: ``anneal_rollouts`` counts rollouts, not the run's epochs,
    as CleanRL's annealing counts the timesteps it is told."""

    def __init__(self, config: PpoConfig):
        self.config = config

    def on_fit_start(self, run: Run) -> None:
        if run.epoch >= run.epochs:  # nothing left to train
            return
        warning = annealing_outlasted(self.config, run.epochs, run.steps_per_epoch)
        if warning is not None:
            warnings.warn(warning, IgnoredSettingWarning, stacklevel=2)


class Ppo(Recipe):
    """Proximal policy optimisation on N batched environments in TF ops (clipped surrogate)."""

    name = "ppo"
    autograph = False  # control flow is tf.cond / tf.while_loop, written out
    quality_figure = ("greedy_return", "max")
    Config = PpoConfig

    def __init__(self, config=None):
        super().__init__(config)
        self.environment: Environment = make_environment(self.config.env, self.config.env_settings)
        self._rollout = None  # the greedy roll-out, traced at the first epoch's end
        self._evaluation_random = None

    @property
    def primary_model(self) -> str:
        return "agent" if self.config.shared_torso else "policy"

    @property
    def steps_per_epoch(self) -> int:
        return self.config.rollouts_per_epoch * self.config.updates_per_rollout

    def default_data(self, seed: int) -> DataSplit:
        ticks = loop_data().train
        return DataSplit(ticks, validation=ticks.take(self.config.validation_batches))

    # -- models -------------------------------------------------------------------------
    def build_models(self, batch_spec) -> dict[str, keras.Model]:
        return self.networks()

    def networks(self) -> dict[str, keras.Model]:
        """Actor and critic: two tanh layers of ``hidden`` each (orthogonal weights, as
        in the PPO paper's code), or one torso with both heads (``shared_torso``)."""
        env, hidden = self.environment, self.config.hidden

        def dense(name, units, gain, activation=None):
            init = keras.initializers.Orthogonal(gain)
            return keras.layers.Dense(units, activation, kernel_initializer=init, name=name)

        def model(name, heads):
            x = body = keras.Input((env.observation_size,))
            for index in (1, 2):
                body = dense(f"hidden_{index}", hidden, math.sqrt(2), "tanh")(body)
            outputs = [dense(head, units, gain)(body) for head, units, gain in heads]
            return keras.Model(x, outputs if len(outputs) > 1 else outputs[0], name=name)

        logits, value = ("logits", env.action_count, 0.01), ("value", 1, 1.0)
        if self.config.shared_torso:
            return {"agent": model("agent", [logits, value])}
        return {"policy": model("policy", [logits]), "value": model("value", [value])}

    def heads(self, models, observation, **call) -> tuple[tf.Tensor, tf.Tensor]:
        """The policy's logits and the critic's values (``[n]``) of ``observation``."""
        if self.config.shared_torso:
            logits, value = models["agent"](observation, **call)
        else:
            logits, value = (
                models["policy"](observation, **call),
                models["value"](observation, **call),
            )
        return logits, value[:, 0]

    def build_state(self) -> dict[str, tf.Variable]:
        """The N environments (``env_*``) and their episodes' step and return, the
        updates taken, the rollout's records, advantages and returns (``[T, N]``), its
        E shuffles (``order``), and this epoch's finished episodes and their returns.
        The environment is checked first (``Environment.check``): its batched methods on
        ``envs`` copies, as the rollout traces them, and its single-copy ones, as the
        greedy roll-out does."""
        c, env = self.config, self.environment
        env.check(copies=c.envs)
        shape, rows = [c.rollout_steps, c.envs], c.rollout_steps * c.envs

        def variable(value):
            return tf.Variable(value, trainable=False)

        first = env.initial_state()  # every copy's, until its first episode ends
        state = {f"env_{k}": variable(tf.stack([v] * c.envs)) for k, v in first.items()}
        records = {key: variable(tf.zeros(shape)) for key in rollout.RECORDS}
        records["observation"] = variable(tf.zeros([*shape, env.observation_size]))
        records["action"] = variable(tf.zeros(shape, tf.int32))
        return (
            state
            | records
            | {
                "episode_step": variable(tf.zeros([c.envs], tf.int32)),
                "episode_return": variable(tf.zeros([c.envs])),
                "updates": variable(tf.constant(0, tf.int64)),
                "advantage": variable(tf.zeros(shape)),
                "returns": variable(tf.zeros(shape)),
                "order": variable(tf.zeros([c.update_epochs, rows], tf.int32)),
                "epoch_episodes": variable(tf.constant(0.0)),
                "epoch_return": variable(tf.constant(0.0)),
            }
            | self.early_stop_state()
        )

    def early_stop_state(self) -> dict[str, tf.Variable]:
        """With ``target_kl``: whether this rollout's remaining updates are stopped
        (``kl_stopped``, 0 or 1) and the approximate KL of the last pass's last minibatch
        (``last_approx_kl``), both reset when a rollout is collected; nothing without."""
        if self.config.target_kl is None:
            return {}
        return {
            "kl_stopped": tf.Variable(tf.constant(0), trainable=False),
            "last_approx_kl": tf.Variable(tf.constant(0.0), trainable=False),
        }

    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        c = self.config
        rate = c.learning_rate
        if c.anneal_rollouts:
            rate = LinearDecay(c.learning_rate, c.anneal_rollouts * c.updates_per_rollout)
        return {"adam": keras.optimizers.Adam(rate, epsilon=1e-5)}

    def losses(self):
        return {"ppo": self.ppo}

    def callbacks(self) -> list[Callback]:
        return [AnnealingCheck(self.config)]

    def schedule(self) -> Schedule:
        updates = "agent" if self.config.shared_torso else ("policy", "value")
        clip = ClipByGlobalNorm(self.config.max_grad_norm)
        gate = {} if self.config.target_kl is None else {"only_if": "within_target_kl"}
        learn = Beat(loss="ppo", optimizer="adam", updates=updates, transform=clip, **gate)
        return Schedule([Act(self.act, name="act"), learn])

    # -- acting -------------------------------------------------------------------------
    def act(self, models, batch) -> None:
        """A new rollout when the last one's updates are all taken (the first step's
        too; with ``target_kl`` its early stop cleared); then the update about to be
        taken is counted."""
        state, c = models.state, self.config

        def collect():
            heads = lambda x: self.heads(models, x, training=False)  # noqa: E731
            collected = rollout.collect(self.environment, c, heads, state, models.random)
            if c.target_kl is not None:  # a new rollout: its passes start unstopped
                state["kl_stopped"].assign(0)
                state["last_approx_kl"].assign(0.0)
            return collected

        due = tf.equal(state["updates"] % c.updates_per_rollout, 0)
        tf.cond(due, collect, lambda: tf.constant(0))
        state["updates"].assign_add(1)

    # -- learning -----------------------------------------------------------------------
    def ppo(self, models, batch) -> dict[str, tf.Tensor]:
        """The clipped surrogate, value loss and entropy bonus on this update's
        minibatch of the rollout: a batch the loss makes itself (``models.own_batch``),
        so on N replicas each computes its share of the one minibatch."""
        state, c = models.state, self.config
        rows = self.minibatch_rows(state)
        rows = models.own_batch(c.minibatch_size).take(rows)
        take = rollout_rows(state, rows)
        log_probabilities, log_ratio, value = self.policy_change(models, take)
        ratio = tf.exp(log_ratio)
        advantage = take("advantage")
        clipped = tf.clip_by_value(ratio, 1.0 - c.clip, 1.0 + c.clip)
        surrogate = -tf.reduce_mean(tf.minimum(ratio * advantage, clipped * advantage))
        value_loss = self.value_loss(value, take("value"), take("returns"))
        entropy = -tf.reduce_mean(
            tf.reduce_sum(tf.exp(log_probabilities) * log_probabilities, axis=1)
        )
        loss = surrogate - c.entropy_coef * entropy + c.value_coef * value_loss
        figures = {
            "approx_kl": tf.reduce_mean((ratio - 1.0) - log_ratio),
            "clip_fraction": tf.reduce_mean(tf.cast(tf.abs(ratio - 1.0) > c.clip, tf.float32)),
            "entropy": entropy,
            "value_loss": value_loss,
        }
        return {"loss": loss} | {k: tf.stop_gradient(v) for k, v in figures.items()}

    def minibatch_rows(self, state) -> tf.Tensor:
        """The rows of the rollout (of its ``T x N``) in this step's minibatch: the
        ``part``-th slice of the ``epoch``-th pass's shuffle (the act counted the update)."""
        c = self.config
        taken = (state["updates"] - 1) % c.updates_per_rollout
        size = c.minibatch_size
        epoch, part = taken // c.minibatches, taken % c.minibatches
        rows = state["order"][tf.cast(epoch, tf.int32)]
        return tf.slice(rows, [tf.cast(part, tf.int32) * size], [size])

    def within_target_kl(self, models, batch) -> tf.Tensor:
        """The ``ppo`` beat's condition with ``target_kl``: CleanRL's early stop. The
        update is taken unless this rollout is stopped (``kl_stopped``). At a pass's
        last minibatch, the approximate KL ``mean((ratio - 1) - log ratio)`` of that
        minibatch under the weights before its update (the loss's ``approx_kl``, computed
        again here on the whole minibatch) is kept (``last_approx_kl``); above
        ``target_kl``, this update is still taken but the rollout's remaining passes are
        not (CleanRL breaks out of its epochs loop after the pass). Their steps still run
        and compute their losses; the next rollout starts unstopped (``act``)."""
        state, c = models.state, self.config
        going = tf.equal(state["kl_stopped"].read_value(), 0)
        taken = (state["updates"] - 1) % c.updates_per_rollout
        last = tf.equal(taken % c.minibatches, c.minibatches - 1)

        def check():
            kl = self.approx_kl(models, state, self.minibatch_rows(state))
            state["last_approx_kl"].assign(kl)
            state["kl_stopped"].assign(tf.cast(kl > c.target_kl, tf.int32))
            return tf.constant(0)

        tf.cond(tf.logical_and(going, last), check, lambda: tf.constant(0))
        return going

    def approx_kl(self, models, state, rows) -> tf.Tensor:
        """The approximate KL from the rollout's policy to the policy now over ``rows``
        of the rollout, as the loss computes it (its ``approx_kl``)."""
        _, log_ratio, _ = self.policy_change(models, rollout_rows(state, rows))
        ratio = tf.exp(log_ratio)
        return tf.reduce_mean((ratio - 1.0) - log_ratio)

    def policy_change(self, models, take) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """On the rollout's rows ``take`` gives: the policy's log-probabilities now, the
        log-ratio of the actions taken against the rollout's, and the critic's values."""
        logits, value = self.heads(models, take("observation"))
        log_probabilities = tf.nn.log_softmax(logits)
        log_ratio = rollout.chosen(log_probabilities, take("action")) - take("log_prob")
        return log_probabilities, log_ratio, value

    def value_loss(self, value, old_value, returns) -> tf.Tensor:
        """Half the mean squared error to the returns; with ``clip_value`` the larger of
        it and that of the value moved at most ``clip`` from the rollout's."""
        squared = tf.square(value - returns)
        if self.config.clip_value:
            moved = old_value + tf.clip_by_value(
                value - old_value, -self.config.clip, self.config.clip
            )
            squared = tf.maximum(squared, tf.square(moved - returns))
        return 0.5 * tf.reduce_mean(squared)

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        names = ("approx_kl", "clip_fraction", "entropy", "value_loss")
        return {name: keras.metrics.Mean(name=name) for name in names}

    def update_metrics(self, metrics, batch, outputs) -> None:
        for name, metric in metrics.items():
            metric.update_state(outputs["ppo"][name])

    # -- figures ------------------------------------------------------------------------
    def epoch_figures(self, run) -> dict[str, float]:
        """``train_return``: the mean return of the episodes finished this epoch (NaN if
        none); ``greedy_return``: the return of the policy's most likely actions from a
        start drawn by the run's seed."""
        state = run.bound.state
        episodes = float(state["epoch_episodes"].numpy())
        returns = float(state["epoch_return"].numpy())
        state["epoch_episodes"].assign(0.0)  # the next epoch counts its own
        state["epoch_return"].assign(0.0)
        return {
            "train_return": returns / episodes if episodes else float("nan"),
            "greedy_return": self.greedy_return(run.models, run.seed),
        }

    def greedy_return(self, models, seed: int) -> float:
        """The return of one greedy episode, in inference mode, on an environment of its
        own: neither the training environments nor the run's generator is touched. Its
        start is drawn from a generator of ``seed``, the same every epoch."""
        key = tuple(id(models[name]) for name in sorted(self.inference_models(models)))
        if self._rollout is None or self._rollout[0] != key:
            self._evaluation_random = tf.random.Generator.from_seed(seed)
            policy = models[self.primary_model]

            def logits_of(x):
                out = policy(x, training=False)
                return out[0] if isinstance(out, list | tuple) else out

            episode = rollout.greedy_episode
            run = tf.function(
                lambda: episode(self.environment, logits_of, self._evaluation_random),
                autograph=False,
            )
            self._rollout = (key, run)
        self._evaluation_random.reset_from_seed(seed)
        return float(self._rollout[1]())

    def inference_models(self, models):
        names = ("agent",) if self.config.shared_torso else ("policy", "value")
        return {name: models[name] for name in names}


def rollout_rows(state, rows):
    """``take(key)``: the rollout record ``key``'s rows ``rows`` (of its ``T x N``)."""

    def take(key):
        flat = tf.reshape(state[key], [-1, *state[key].shape[2:]])
        return tf.gather(flat, rows)

    return take
