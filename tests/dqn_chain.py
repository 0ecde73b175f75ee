"""A DQN on an in-graph chain walk, as a recipe and as a hand-written TensorFlow loop
with the same ops, for the DQN tests (tests/test_dqn_schedule.py) and the benchmark
(benchmarks/dqn_step.py).

The environment is a chain of ``LENGTH`` cells: the agent starts at cell 0, steps left
or right, and is paid 1 for reaching the last cell, which (like ``HORIZON`` steps)
ends the episode. Its position, the episode's step count and a replay buffer of
``CAPACITY`` transitions are recipe state. Each training step acts once (epsilon-greedy
on the Q network, the environment stepped, the transition stored), then takes one
Q-learning step on a batch sampled from the buffer with the run's generator; the target
network is copied from the Q network every ``COPY_EVERY`` steps.
"""

from __future__ import annotations

import keras
import tensorflow as tf

import beatloop

LENGTH, HORIZON, CAPACITY, BATCH = 5, 12, 64, 16
GAMMA, EPSILON, COPY_EVERY, STEPS_PER_EPOCH = 0.9, 0.5, 8, 40


def q_network() -> keras.Model:
    dense = keras.layers.Dense
    return keras.Sequential([keras.Input((LENGTH,)), dense(32, "relu"), dense(2)])


def build_state() -> dict[str, tf.Variable]:
    """The environment (position, episode step, the reward collected so far) and the
    replay buffer, with the count of transitions ever stored."""

    def variable(value):
        return tf.Variable(value, trainable=False)

    return {
        "position": variable(tf.constant(0, tf.int32)),
        "episode_step": variable(tf.constant(0, tf.int32)),
        "collected": variable(tf.constant(0.0)),
        "stored": variable(tf.constant(0, tf.int64)),
        "observation": variable(tf.zeros([CAPACITY, LENGTH])),
        "action": variable(tf.zeros([CAPACITY], tf.int32)),
        "reward": variable(tf.zeros([CAPACITY])),
        "next_observation": variable(tf.zeros([CAPACITY, LENGTH])),
        "done": variable(tf.zeros([CAPACITY])),
    }


def act(q_values, state, random) -> None:
    """One epsilon-greedy step of the agent in the environment, stored in the buffer
    (``q_values``: observations -> Q values, in inference mode)."""
    position = state["position"].read_value()
    observation = tf.one_hot(position, LENGTH)
    greedy = tf.argmax(q_values(observation[None])[0], output_type=tf.int32)
    explore = random.uniform([]) < EPSILON
    random_action = random.uniform([], 0, 2, dtype=tf.int32)
    action = tf.where(explore, random_action, greedy)
    moved = tf.clip_by_value(position + 2 * action - 1, 0, LENGTH - 1)
    arrived = tf.equal(moved, LENGTH - 1)
    steps = state["episode_step"] + 1
    done = tf.logical_or(arrived, steps >= HORIZON)
    slot = tf.cast(state["stored"] % CAPACITY, tf.int32)
    state["observation"][slot].assign(observation)
    state["action"][slot].assign(action)
    reward = tf.cast(arrived, tf.float32)
    state["reward"][slot].assign(reward)
    state["collected"].assign_add(reward)
    state["next_observation"][slot].assign(tf.one_hot(moved, LENGTH))
    state["done"][slot].assign(tf.cast(done, tf.float32))
    state["stored"].assign_add(1)
    state["position"].assign(tf.where(done, 0, moved))
    state["episode_step"].assign(tf.where(done, 0, steps))


def td_loss(q_values, target_values, state, random) -> tf.Tensor:
    """The Q-learning loss on a batch sampled (with replacement) from the buffer's
    filled slots: squared TD error against the target network's bootstrap."""
    filled = tf.maximum(tf.minimum(state["stored"], CAPACITY), 1)
    index = random.uniform([BATCH], 0, filled, dtype=tf.int64)
    observation = tf.gather(state["observation"], index)
    action = tf.gather(state["action"], index)
    reward, done = tf.gather(state["reward"], index), tf.gather(state["done"], index)
    bootstrap = tf.reduce_max(target_values(tf.gather(state["next_observation"], index)), axis=1)
    target = tf.stop_gradient(reward + GAMMA * (1.0 - done) * bootstrap)
    chosen = tf.reduce_sum(q_values(observation) * tf.one_hot(action, 2), axis=1)
    return tf.reduce_mean(tf.square(chosen - target))


def greedy_return(q_net: keras.Model) -> float:
    """The return of the greedy policy from cell 0 (1.0: it reaches the end in time)."""
    position = 0
    for _ in range(HORIZON):
        observation = tf.one_hot([position], LENGTH)
        action = int(tf.argmax(q_net(observation, training=False)[0]))
        position = min(max(position + 2 * action - 1, 0), LENGTH - 1)
        if position == LENGTH - 1:
            return 1.0
    return 0.0


class DqnChain(beatloop.Recipe):
    """DQN on an in-graph chain walk: acting, a replay buffer and a target copy."""

    name = "dqn_chain_test"
    steps_per_epoch = STEPS_PER_EPOCH

    def default_data(self, seed):
        return beatloop.loop_data()

    def build_models(self, batch_spec):
        return {"q": q_network(), "target": q_network()}

    def build_state(self):
        return build_state()

    def build_optimizers(self):
        return {"adam": keras.optimizers.Adam(1e-2)}

    def losses(self):
        return {"td": self.td}

    def td(self, models, batch):
        q, target = models["q"], models["target"]
        return td_loss(q, target, models.state, models.random)

    def collect(self, models, batch):
        act(lambda x: models["q"](x, training=False), models.state, models.random)

    def schedule(self):
        return beatloop.Schedule(
            [
                beatloop.Act(self.collect, name="collect"),
                beatloop.Beat(loss="td", optimizer="adam", updates="q"),
                beatloop.Copy(source="q", target="target", every=COPY_EVERY),
            ]
        )


class HandWritten:
    """The same DQN as a plain ``tf.function`` / ``GradientTape`` loop, one step a call,
    from ``models`` (copies of the recipe's initial weights) and the run's seed."""

    def __init__(self, models, seed: int):
        self.q, self.target = models["q"], models["target"]
        self.state = build_state()
        self.random = tf.random.Generator.from_seed(seed)
        self.optimizer = keras.optimizers.Adam(1e-2)
        self.optimizer.build(self.q.trainable_variables)
        self.step = tf.function(self._step, autograph=False)

    def _step(self, number):
        act(lambda x: self.q(x, training=False), self.state, self.random)
        with tf.GradientTape() as tape:
            loss = td_loss(self.q, self.target, self.state, self.random)
        variables = self.q.trainable_variables
        self.optimizer.apply(tape.gradient(loss, variables), variables)

        def copy():
            for target, source in zip(self.target.trainable_variables, variables, strict=True):
                target.assign(source)
            return tf.constant(0)

        tf.cond(tf.equal(number % COPY_EVERY, 0), copy, lambda: tf.constant(0))
        return loss

    def fit(self, steps: int) -> None:
        for number in range(steps):
            self.step(tf.constant(number, tf.int64))
