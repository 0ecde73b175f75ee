"""The dqn recipe: deep Q-learning (Mnih et al., 2015) on an environment written in
TensorFlow ops, every part of it inside the compiled step.

One step: an ``Act`` moves the agent once (epsilon-greedy on the Q network, epsilon
falling linearly) and stores the transition in a replay buffer; a beat takes one
Q-learning update on a batch sampled from the buffer with the run's generator; the
target network follows the Q network by a hard ``Copy`` every ``target_every`` steps or
by Polyak averaging (an ``EMA``). ``double=True`` is double DQN (van Hasselt et al.,
2016): the Q network picks the next action, the target network values it.

The environment, its state, the buffer and the agent's counters are recipe state, so a
checkpoint holds all of it. The data are ``beatloop.loop_data()`` ticks. On the first
step the buffer is first filled with ``learning_starts`` transitions of the random
policy, so every update samples from at least that many.
"""

from __future__ import annotations

from typing import Literal

import attrs
import keras
import tensorflow as tf

from beatloop import (
    EMA,
    Act,
    Beat,
    Copy,
    DataSplit,
    Environment,
    Recipe,
    Schedule,
    choice,
    loop_data,
    make_environment,
    setting,
)

_positive = attrs.validators.gt(0)
_fraction = [attrs.validators.ge(0), attrs.validators.le(1)]

#: The TD losses, each the batch's mean of ``fn(target, chosen)``.
LOSSES = {"huber": keras.losses.huber, "mse": keras.losses.mean_squared_error}


@attrs.frozen
class DqnConfig:
    """Settings of the dqn recipe."""

    env: str = setting("chain", "the environment, by name: chain, cartpole, or a plugin's")
    env_settings: tuple[str, ...] = setting(
        (), "the environment's parameters as NAME=VALUE items (e.g. length=12,horizon=40)"
    )
    steps_per_epoch: int = setting(1000, "agent steps, each with one update, an epoch", _positive)
    hidden: int = setting(64, "width of the Q network's two hidden Dense layers (relu)", _positive)
    learning_rate: float = setting(1e-3, "Adam's learning rate", _positive)
    gamma: float = setting(0.9, "the discount of future rewards", _fraction)
    loss: Literal["huber", "mse"] = choice("huber", tuple(LOSSES), "the TD loss: huber or mse")
    batch_size: int = setting(32, "transitions sampled from the buffer per update", _positive)
    buffer_size: int = setting(5000, "transitions the replay buffer keeps (the newest)", _positive)
    learning_starts: int = setting(
        100, "random-policy transitions stored before the first update", attrs.validators.ge(0)
    )
    epsilon_start: float = setting(1.0, "exploration rate at the first step", _fraction)
    epsilon_end: float = setting(0.05, "exploration rate after the decay", _fraction)
    epsilon_decay_steps: int = setting(
        1000, "agent steps over which epsilon falls linearly to epsilon_end", _positive
    )
    target: Literal["copy", "polyak"] = choice(
        "copy", ("copy", "polyak"), "copy: the Q network copied every target_every steps; "
        "polyak: an EMA of it every step"
    )  # fmt: skip
    target_every: int = setting(100, "steps between target copies (target=copy)", _positive)
    target_decay: float = setting(
        0.99, "the EMA's decay d (target=polyak): target becomes d·target + (1-d)·q", _fraction
    )
    double: bool = setting(False, "double DQN: the Q network picks the next action")
    validation_batches: int = setting(
        8, "batches of buffer samples in each epoch's validation TD loss (val_td)", _positive
    )

    def __attrs_post_init__(self) -> None:
        if self.learning_starts > self.buffer_size:
            raise ValueError(
                f"learning_starts ({self.learning_starts}) must not exceed buffer_size "
                f"({self.buffer_size}): the buffer holds the warm-up transitions"
            )


class Dqn(Recipe):
    """Deep Q-learning in TF ops: epsilon-greedy acting, replay buffer, target network."""

    name = "dqn"
    autograph = False  # control flow is tf.cond / tf.while_loop, written out
    primary_model = "q"
    quality_figure = ("greedy_return", "max")
    Config = DqnConfig

    def __init__(self, config=None):
        super().__init__(config)
        self.environment: Environment = make_environment(self.config.env, self.config.env_settings)
        self._rollout = None  # the greedy roll-out, traced at the first epoch's end
        self._evaluation_random = None

    @property
    def steps_per_epoch(self) -> int:
        return self.config.steps_per_epoch

    def default_data(self, seed: int) -> DataSplit:
        ticks = loop_data().train
        return DataSplit(ticks, validation=ticks.take(self.config.validation_batches))

    def build_models(self, batch_spec) -> dict[str, keras.Model]:
        q, target = self.q_network("q"), self.q_network("target")
        target.set_weights(q.get_weights())  # the target starts as a copy
        return {"q": q, "target": target}

    def q_network(self, name: str = "q") -> keras.Model:
        """Observation -> one Q value per action: two relu layers of ``hidden``."""
        env, hidden = self.environment, self.config.hidden
        return keras.Sequential(
            [
                keras.Input((env.observation_size,)),
                keras.layers.Dense(hidden, activation="relu"),
                keras.layers.Dense(hidden, activation="relu"),
                keras.layers.Dense(env.action_count),
            ],
            name=name,
        )

    def build_state(self) -> dict[str, tf.Variable]:
        """The environment's state (``env_*``), the episode's step and return, the
        agent's step count (epsilon's clock), the replay buffer with the count of
        transitions ever stored, and this epoch's finished episodes and their returns.
        The environment is checked first (``Environment.check``): its methods traced
        once, as the step and the greedy roll-out trace them."""
        self.environment.check()
        size, width = self.config.buffer_size, self.environment.observation_size

        def variable(value):
            return tf.Variable(value, trainable=False)

        env = {f"env_{k}": v for k, v in self.environment.build_state().items()}
        return env | {
            "episode_step": variable(tf.constant(0, tf.int32)),
            "episode_return": variable(tf.constant(0.0)),
            "agent_steps": variable(tf.constant(0, tf.int64)),
            "stored": variable(tf.constant(0, tf.int64)),
            "observation": variable(tf.zeros([size, width])),
            "action": variable(tf.zeros([size], tf.int32)),
            "reward": variable(tf.zeros([size])),
            "next_observation": variable(tf.zeros([size, width])),
            "terminal": variable(tf.zeros([size])),
            "epoch_episodes": variable(tf.constant(0.0)),
            "epoch_return": variable(tf.constant(0.0)),
        }

    def build_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
        return {"adam": keras.optimizers.Adam(self.config.learning_rate)}

    def losses(self):
        return {"td": self.td}

    def schedule(self) -> Schedule:
        if self.config.target == "copy":
            follow = Copy(source="q", target="target", every=self.config.target_every)
        else:
            follow = EMA(source="q", target="target", decay=self.config.target_decay)
        learn = Beat(loss="td", optimizer="adam", updates="q")
        return Schedule([Act(self.act, name="act"), learn, follow])

    # -- acting -------------------------------------------------------------------------
    def act(self, models, batch) -> None:
        """One epsilon-greedy move of the agent, stored in the buffer (after the first
        step's warm-up)."""
        state, random, config = models.state, models.random, self.config
        if config.learning_starts:
            tf.cond(
                tf.equal(state["stored"], 0),
                lambda: self.warm_up(state, random),
                lambda: tf.constant(0),
            )
        epsilon = self.epsilon(state["agent_steps"].read_value())
        actions = self.environment.action_count

        def policy(observation):
            greedy = tf.argmax(models["q"](observation[None])[0], output_type=tf.int32)
            explore = random.uniform([]) < epsilon
            return tf.where(explore, random.uniform([], 0, actions, dtype=tf.int32), greedy)

        self.move(state, random, policy)
        state["agent_steps"].assign_add(1)

    def warm_up(self, state, random) -> tf.Tensor:
        """``learning_starts`` moves of the random policy, filling the buffer."""
        actions = self.environment.action_count

        def body(count):
            self.move(state, random, lambda _: random.uniform([], 0, actions, dtype=tf.int32))
            return count + 1

        return tf.while_loop(lambda count: count < self.config.learning_starts, body, [0])[0]

    def epsilon(self, agent_steps: tf.Tensor) -> tf.Tensor:
        """Epsilon after ``agent_steps`` moves: linear from start to end, then flat."""
        c = self.config
        done = tf.minimum(tf.cast(agent_steps, tf.float32) / float(c.epsilon_decay_steps), 1.0)
        return c.epsilon_start + (c.epsilon_end - c.epsilon_start) * done

    def move(self, state, random, policy) -> None:
        """The environment stepped by ``policy(observation)``'s action, the transition
        stored, the episode's books kept, and a new episode begun when it ended."""
        env, slot = self.environment, tf.cast(state["stored"] % self.config.buffer_size, tf.int32)
        now = {key[4:]: v.read_value() for key, v in state.items() if key.startswith("env_")}
        observation = env.observe(now)
        action = policy(observation)
        after, reward, terminal = env.step(now, action, random)
        steps = state["episode_step"] + 1
        done = tf.logical_or(terminal, steps >= env.horizon)
        for key, value in (
            ("observation", observation), ("action", action), ("reward", reward),
            ("next_observation", env.observe(after)), ("terminal", tf.cast(terminal, tf.float32)),
        ):  # fmt: skip
            state[key][slot].assign(value)
        state["stored"].assign_add(1)
        finished = state["episode_return"] + reward
        state["epoch_episodes"].assign_add(tf.cast(done, tf.float32))
        state["epoch_return"].assign_add(tf.where(done, finished, 0.0))
        state["episode_return"].assign(tf.where(done, 0.0, finished))
        state["episode_step"].assign(tf.where(done, 0, steps))
        fresh = env.reset(random)
        for key, value in after.items():
            state[f"env_{key}"].assign(tf.where(done, fresh[key], value))

    # -- learning -----------------------------------------------------------------------
    def td(self, models, batch) -> tf.Tensor:
        """The TD loss on a batch sampled (with replacement) from the filled buffer: a
        batch the loss makes itself (``models.own_batch``), so on N replicas each
        computes its share of the one sample one device would draw."""
        state, c = models.state, self.config
        filled = tf.maximum(tf.minimum(state["stored"], c.buffer_size), 1)
        sample = models.own_batch(c.batch_size)
        index = sample.random.uniform([sample.size], 0, filled, dtype=tf.int64)
        observation, action, reward, next_observation, terminal = (
            tf.gather(state[key], index)
            for key in ("observation", "action", "reward", "next_observation", "terminal")
        )
        next_values = models["target"](next_observation)
        if c.double:
            best = tf.argmax(models["q"](next_observation), axis=1, output_type=tf.int32)
            bootstrap = tf.gather(next_values, best, axis=1, batch_dims=1)
        else:
            bootstrap = tf.reduce_max(next_values, axis=1)
        target = tf.stop_gradient(reward + c.gamma * (1.0 - terminal) * bootstrap)
        chosen_of = tf.one_hot(action, self.environment.action_count)
        chosen = tf.reduce_sum(models["q"](observation) * chosen_of, axis=1)
        return LOSSES[c.loss](target, chosen)

    # -- figures ------------------------------------------------------------------------
    def epoch_figures(self, run) -> dict[str, float]:
        """``train_return``: the mean return of the episodes finished this epoch (NaN if
        none); ``greedy_return``: the greedy policy's return from a start drawn by the
        run's seed; ``epsilon``: the exploration rate now."""
        state = run.bound.state
        episodes = float(state["epoch_episodes"].numpy())
        returns = float(state["epoch_return"].numpy())
        state["epoch_episodes"].assign(0.0)  # the next epoch counts its own
        state["epoch_return"].assign(0.0)
        return {
            "train_return": returns / episodes if episodes else float("nan"),
            "greedy_return": self.greedy_return(run.models["q"], run.seed),
            "epsilon": float(self.epsilon(state["agent_steps"].read_value())),
        }

    def greedy_return(self, q: keras.Model, seed: int) -> float:
        """The return of one episode of the greedy policy, in inference mode, on an
        environment of its own: neither the training environment, the buffer nor the
        run's generator is touched. Its start is drawn from a generator of ``seed``,
        the same every epoch."""
        if self._rollout is None or self._rollout[0] is not q:
            self._evaluation_random = tf.random.Generator.from_seed(seed)
            episode = tf.function(lambda: self._greedy_episode(q), autograph=False)
            self._rollout = (q, episode)
        self._evaluation_random.reset_from_seed(seed)
        return float(self._rollout[1]())

    def _greedy_episode(self, q: keras.Model) -> tf.Tensor:
        env, random = self.environment, self._evaluation_random

        def going(t, state, total, done):
            return tf.logical_and(t < env.horizon, tf.logical_not(done))

        def body(t, state, total, done):
            action = tf.argmax(q(env.observe(state)[None], training=False)[0], output_type=tf.int32)
            after, reward, terminal = env.step(state, action, random)
            return t + 1, after, total + reward, terminal

        start = (0, env.reset(random), tf.constant(0.0), tf.constant(False))
        return tf.while_loop(going, body, start)[2]

    def inference_models(self, models):
        return {"q": models["q"]}
