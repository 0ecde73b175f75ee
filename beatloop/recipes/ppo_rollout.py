"""The ``ppo`` recipe's acting: a rollout of N environment copies for T steps, its
advantages (GAE) and returns, and the shuffles of its minibatches, written into recipe
state; and the greedy roll-out of the epoch figures. Pure functions of the config, the
environment, the policy and the generator: the recipe (``beatloop.recipes.ppo``) calls
them from its ``Act``.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from beatloop import Environment

#: ``heads(observations) -> (logits [n, actions], values [n])``: the policy and critic.
Heads = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]

#: The rollout's records, each ``[T, N]`` (``observation``: ``[T, N, size]``).
RECORDS = ("observation", "action", "log_prob", "value", "reward", "done")


def where_done(done: tf.Tensor, fresh: tf.Tensor, after: tf.Tensor) -> tf.Tensor:
    """``fresh`` in the copies that are done, ``after`` in the others (``done`` is
    ``[N]``; the states have N rows of any shape)."""
    shape = tf.concat([tf.shape(done), tf.ones([after.shape.rank - 1], tf.int32)], 0)
    return tf.where(tf.reshape(done, shape), fresh, after)


def sample_actions(logits: tf.Tensor, random: tf.random.Generator) -> tf.Tensor:
    """One action per row drawn from ``softmax(logits)`` by the Gumbel-max trick, with
    the run's generator (``tf.random.categorical`` takes no generator)."""
    uniform = random.uniform(tf.shape(logits))
    return tf.argmax(logits - tf.math.log(-tf.math.log(uniform)), axis=1, output_type=tf.int32)


def chosen(log_probabilities: tf.Tensor, action: tf.Tensor) -> tf.Tensor:
    """Each row's log-probability of its action."""
    return tf.gather(log_probabilities, action, axis=1, batch_dims=1)


def collect(env: Environment, config, heads: Heads, state: dict, random) -> tf.Tensor:
    """T steps of the N copies by the sampled policy: the records written into recipe
    state, the episodes' books kept (``episode_*``, ``epoch_*``), a copy whose episode
    ended reset. A copy cut at the horizon (not terminal) has its last reward bootstrap
    the critic's value of the state it was cut in, as the horizon is not an end of the
    task. Then the advantages and the shuffles. Returns the rollout's step count."""
    count, gamma = config.envs, config.gamma
    env_keys = [key for key in state if key.startswith("env_")]
    start = {
        "env": {key[4:]: state[key].read_value() for key in env_keys},
        "steps": state["episode_step"].read_value(),
        "returns": state["episode_return"].read_value(),
        "episodes": state["epoch_episodes"].read_value(),
        "finished": state["epoch_return"].read_value(),
    }
    arrays = {key: tf.TensorArray(tf.int32 if key == "action" else tf.float32, config.rollout_steps)
              for key in RECORDS}  # fmt: skip

    def body(t, now, arrays):
        observation = env.observe_batch(now["env"])
        logits, value = heads(observation)
        action = sample_actions(logits, random)
        after, reward, terminal = env.step_batch(now["env"], action, random)
        steps = now["steps"] + 1
        cut = steps >= env.horizon
        done = tf.logical_or(terminal, cut)
        kept = tf.logical_and(cut, tf.logical_not(terminal))
        bootstrap = heads(env.observe_batch(after))[1]
        learned = reward + tf.where(kept, gamma * bootstrap, 0.0)
        total = now["returns"] + reward
        fresh = env.reset_batch(random, count)
        later = {
            "env": {k: where_done(done, fresh[k], v) for k, v in after.items()},
            "steps": tf.where(done, 0, steps),
            "returns": tf.where(done, 0.0, total),
            "episodes": now["episodes"] + tf.reduce_sum(tf.cast(done, tf.float32)),
            "finished": now["finished"] + tf.reduce_sum(tf.where(done, total, 0.0)),
        }
        log_prob = chosen(tf.nn.log_softmax(logits), action)
        records = (observation, action, log_prob, value, learned, tf.cast(done, tf.float32))
        arrays = {k: arrays[k].write(t, r) for k, r in zip(RECORDS, records, strict=True)}
        return t + 1, later, arrays

    loop = (tf.constant(0), start, arrays)
    _, end, arrays = tf.while_loop(lambda t, *_: t < config.rollout_steps, body, loop)
    records = {key: array.stack() for key, array in arrays.items()}
    for key in env_keys:
        state[key].assign(end["env"][key[4:]])
    for key, name in (("steps", "episode_step"), ("returns", "episode_return"),
                      ("episodes", "epoch_episodes"), ("finished", "epoch_return")):  # fmt: skip
        state[name].assign(end[key])
    last_value = heads(env.observe_batch(end["env"]))[1]
    advantage = advantages(records, last_value, gamma, config.gae_lambda)
    returns = advantage + records["value"]
    if config.normalize_advantages:
        mean, variance = tf.nn.moments(advantage, axes=[0, 1])
        advantage = (advantage - mean) / (tf.sqrt(variance) + 1e-8)
    for key, value in records.items():
        state[key].assign(value)
    state["advantage"].assign(advantage)
    state["returns"].assign(returns)
    rows = config.rollout_steps * count
    state["order"].assign(tf.argsort(random.uniform([config.update_epochs, rows]), axis=1))
    return tf.constant(config.rollout_steps)


def advantages(records: dict, last_value: tf.Tensor, gamma: float, lam: float) -> tf.Tensor:
    """GAE(gamma, lambda) (Schulman et al., 2016) of a rollout, ``[T, N]``: from the last
    step back, ``A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}`` with
    ``delta_t = r_t + gamma * (1 - done_t) * V_{t+1} - V_t``."""
    values, rewards, dones = records["value"], records["reward"], records["done"]
    following = tf.concat([values[1:], last_value[None]], axis=0)
    going = 1.0 - dones
    deltas = rewards + gamma * going * following - values

    def back(later, step):
        delta, go = step
        return delta + gamma * lam * go * later

    return tf.scan(back, (deltas, going), tf.zeros_like(last_value), reverse=True)


def greedy_episode(env: Environment, logits_of: Callable, random) -> tf.Tensor:
    """The return of one episode of the policy's most likely actions, from a start
    drawn by ``random``, on loop variables of its own."""

    def going(t, state, total, done):
        return tf.logical_and(t < env.horizon, tf.logical_not(done))

    def body(t, state, total, done):
        logits = logits_of(env.observe(state)[None])
        action = tf.argmax(logits[0], output_type=tf.int32)
        after, reward, terminal = env.step(state, action, random)
        return t + 1, after, total + reward, terminal

    start = (0, env.reset(random), tf.constant(0.0), tf.constant(False))
    return tf.while_loop(going, body, start)[2]
