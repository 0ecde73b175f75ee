"""The dqn recipe's algorithm written by hand, as a TensorFlow user writes DQN: variables
for the environment and the replay buffer, a ``tf.function`` step with a
``GradientTape`` and a Keras Adam, the target network copied or averaged after the
update. The tests (tests/test_dqn.py) check that the built-in recipe ends bit-identical
to it; benchmarks/dqn_step.py times the two side by side.

It shares nothing with the recipe but the environment (the "data") and the config
values: every op of acting, storing, sampling and learning is written out here again.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from beatloop.recipes.dqn import DqnConfig

LOSS = {"huber": keras.losses.huber, "mse": keras.losses.mean_squared_error}


class HandWrittenDqn:
    """DQN on ``env`` from ``q`` and ``target`` (copies of the recipe's initial weights)
    and ``seed`` (the run's generator), one compiled step a call (``step``)."""

    def __init__(self, env, config: DqnConfig, q: keras.Model, target: keras.Model, seed: int):
        self.env, self.config, self.q, self.target = env, config, q, target
        self.random = tf.random.Generator.from_seed(seed)
        self.optimizer = keras.optimizers.Adam(config.learning_rate)
        self.optimizer.build(q.trainable_variables)
        size, width = config.buffer_size, env.observation_size
        zeros = {
            "episode_step": tf.constant(0, tf.int32),
            "episode_return": tf.constant(0.0),
            "agent_steps": tf.constant(0, tf.int64),
            "stored": tf.constant(0, tf.int64),
            "observation": tf.zeros([size, width]),
            "action": tf.zeros([size], tf.int32),
            "reward": tf.zeros([size]),
            "next_observation": tf.zeros([size, width]),
            "terminal": tf.zeros([size]),
            "epoch_episodes": tf.constant(0.0),
            "epoch_return": tf.constant(0.0),
        }
        zeros |= {f"env_{k}": v for k, v in env.initial_state().items()}
        self.state = {k: tf.Variable(v, trainable=False) for k, v in zeros.items()}
        self.step = tf.function(self.train_step, autograph=False)
        self.number = 0

    def random_action(self) -> tf.Tensor:
        return self.random.uniform([], 0, self.env.action_count, dtype=tf.int32)

    def transition(self, choose) -> None:
        """One environment step by ``choose(observation)``, stored; a new episode on its end."""
        s, env = self.state, self.env
        position = {k[4:]: s[k].read_value() for k in s if k.startswith("env_")}
        observation = env.observe(position)
        action = choose(observation)
        following, reward, terminal = env.step(position, action, self.random)
        slot = tf.cast(s["stored"] % self.config.buffer_size, tf.int32)
        s["observation"][slot].assign(observation)
        s["action"][slot].assign(action)
        s["reward"][slot].assign(reward)
        s["next_observation"][slot].assign(env.observe(following))
        s["terminal"][slot].assign(tf.cast(terminal, tf.float32))
        s["stored"].assign_add(1)
        steps = s["episode_step"] + 1
        over = tf.logical_or(terminal, steps >= env.horizon)
        total = s["episode_return"] + reward
        s["epoch_episodes"].assign_add(tf.cast(over, tf.float32))
        s["epoch_return"].assign_add(tf.where(over, total, 0.0))
        s["episode_return"].assign(tf.where(over, 0.0, total))
        s["episode_step"].assign(tf.where(over, 0, steps))
        start = env.reset(self.random)
        for k, value in following.items():
            s[f"env_{k}"].assign(tf.where(over, start[k], value))

    def train_step(self, number: tf.Tensor) -> tf.Tensor:
        c, s = self.config, self.state

        def fill():
            def body(i):
                self.transition(lambda _: self.random_action())
                return i + 1

            return tf.while_loop(lambda i: i < c.learning_starts, body, [0])[0]

        if c.learning_starts:
            tf.cond(tf.equal(s["stored"], 0), fill, lambda: tf.constant(0))
        progress = tf.cast(s["agent_steps"].read_value(), tf.float32) / float(c.epsilon_decay_steps)
        epsilon = c.epsilon_start + (c.epsilon_end - c.epsilon_start) * tf.minimum(progress, 1.0)

        def epsilon_greedy(observation):
            best = tf.argmax(self.q(observation[None], training=False)[0], output_type=tf.int32)
            explore = self.random.uniform([]) < epsilon
            return tf.where(explore, self.random_action(), best)

        self.transition(epsilon_greedy)
        s["agent_steps"].assign_add(1)
        with tf.GradientTape() as tape:
            loss = self.td_loss()
        weights = self.q.trainable_variables
        self.optimizer.apply(tape.gradient(loss, weights), weights)
        self.follow(number)
        return loss

    def td_loss(self) -> tf.Tensor:
        c, s = self.config, self.state
        count = tf.maximum(tf.minimum(s["stored"], c.buffer_size), 1)
        rows = self.random.uniform([c.batch_size], 0, count, dtype=tf.int64)
        obs, actions = tf.gather(s["observation"], rows), tf.gather(s["action"], rows)
        rewards, ends = tf.gather(s["reward"], rows), tf.gather(s["terminal"], rows)
        next_obs = tf.gather(s["next_observation"], rows)
        target_q = self.target(next_obs, training=False)
        if c.double:
            picked = tf.argmax(self.q(next_obs, training=True), axis=1, output_type=tf.int32)
            next_value = tf.gather(target_q, picked, axis=1, batch_dims=1)
        else:
            next_value = tf.reduce_max(target_q, axis=1)
        y = tf.stop_gradient(rewards + c.gamma * (1.0 - ends) * next_value)
        q_taken = tf.reduce_sum(
            self.q(obs, training=True) * tf.one_hot(actions, self.env.action_count), axis=1
        )
        return LOSS[c.loss](y, q_taken)

    def follow(self, number: tf.Tensor) -> None:
        """The target network after the update: a copy every ``target_every`` steps, or
        Polyak averaging every step."""
        c = self.config
        pairs = list(zip(self.target.trainable_variables, self.q.trainable_variables, strict=True))
        if c.target == "polyak":
            for t, w in pairs:
                t.assign(tf.constant(c.target_decay) * t + tf.constant(1 - c.target_decay) * w)
            return

        def copy():
            for t, w in pairs:
                t.assign(w)
            return tf.constant(0)

        tf.cond(tf.equal(number % c.target_every, 0), copy, lambda: tf.constant(0))

    def fit(self, epochs: int) -> list[float]:
        """``epochs`` epochs of ``steps_per_epoch`` steps; each epoch's mean return of
        the episodes it finished (its accumulators then cleared, as the recipe's are)."""
        returns = []
        for _ in range(epochs):
            for _ in range(self.config.steps_per_epoch):
                self.step(tf.constant(self.number, tf.int64))
                self.number += 1
            episodes = float(self.state["epoch_episodes"].numpy())
            returns.append(float(self.state["epoch_return"].numpy()) / episodes)
            self.state["epoch_episodes"].assign(0.0)
            self.state["epoch_return"].assign(0.0)
        return returns
