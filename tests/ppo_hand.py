"""The ppo recipe's algorithm written by hand, as a TensorFlow user writes PPO: variables
for N environments and the rollout, a ``tf.function`` step that collects a rollout when
the last one's updates are done and takes one minibatch update with a ``GradientTape``,
global-norm clipping and a Keras Adam on a linearly falling learning rate. The tests
(tests/test_ppo.py) check that the built-in recipe ends bit-identical to it;
benchmarks/ppo_step.py times the two side by side.

It shares nothing with the recipe but the environment (the "data") and the config
values: acting, GAE, shuffling and the losses are written out here again. With
``target_kl`` it stops a rollout's updates as CleanRL's PPO does: after each pass over
the minibatches, if the approximate KL its last minibatch's loss computed (before that
minibatch's update) is above ``target_kl``, the rollout's remaining passes take no
update (their steps still come, one a call, and compute their loss).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from beatloop.recipes.ppo import PpoConfig


class Falling(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, rate: float, steps: int):
        self.rate, self.steps = rate, steps

    def __call__(self, step):
        return self.rate * (1.0 - tf.minimum(tf.cast(step, tf.float32) / float(self.steps), 1.0))


class HandWrittenPpo:
    """PPO on ``env`` from ``networks`` (copies of the recipe's initial models: policy
    and value, or one agent with both heads) and ``seed`` (the run's generator)."""

    def __init__(self, env, config: PpoConfig, networks: dict, seed: int):
        self.env, self.config, self.networks = env, config, networks
        self.random = tf.random.Generator.from_seed(seed)
        c = config
        self.per_rollout = c.update_epochs * c.minibatches
        rate = c.learning_rate
        if c.anneal_rollouts:
            rate = Falling(c.learning_rate, c.anneal_rollouts * self.per_rollout)
        self.optimizer = keras.optimizers.Adam(rate, epsilon=1e-5)
        self.weights = [w for model in networks.values() for w in model.trainable_variables]
        self.optimizer.build(self.weights)
        T, N = c.rollout_steps, c.envs
        initial = {
            "episode_step": tf.zeros([N], tf.int32), "episode_return": tf.zeros([N]),
            "updates": tf.constant(0, tf.int64),
            "observation": tf.zeros([T, N, env.observation_size]),
            "action": tf.zeros([T, N], tf.int32), "log_prob": tf.zeros([T, N]),
            "value": tf.zeros([T, N]), "reward": tf.zeros([T, N]), "done": tf.zeros([T, N]),
            "advantage": tf.zeros([T, N]), "returns": tf.zeros([T, N]),
            "order": tf.zeros([c.update_epochs, T * N], tf.int32),
            "epoch_episodes": tf.constant(0.0), "epoch_return": tf.constant(0.0),
        }  # fmt: skip
        initial |= {f"env_{k}": tf.stack([v] * N) for k, v in env.initial_state().items()}
        if c.target_kl is not None:  # CleanRL's break out of the passes, and its approx_kl
            initial |= {"kl_stopped": tf.constant(0), "last_approx_kl": tf.constant(0.0)}
        self.state = {k: tf.Variable(v, trainable=False) for k, v in initial.items()}
        self.step = tf.function(self.train_step, autograph=False)

    def evaluate(self, observation, training):
        """(logits, values) of a batch of observations."""
        if "agent" in self.networks:
            logits, values = self.networks["agent"](observation, training=training)
        else:
            logits = self.networks["policy"](observation, training=training)
            values = self.networks["value"](observation, training=training)
        return logits, values[:, 0]

    def gather_rollout(self) -> tf.Tensor:
        c, s, env = self.config, self.state, self.env
        T, N = c.rollout_steps, c.envs
        names = ("observation", "action", "log_prob", "value", "reward", "done")
        buffers = [tf.TensorArray(tf.int32 if n == "action" else tf.float32, T) for n in names]
        where = {k[4:]: s[k].read_value() for k in s if k.startswith("env_")}
        books = [s[k].read_value() for k in
                 ("episode_step", "episode_return", "epoch_episodes", "epoch_return")]  # fmt: skip

        def expand(flag, like):
            return tf.reshape(flag, [N] + [1] * (like.shape.rank - 1))

        def body(t, where, books, buffers):
            steps, ret, episodes, total = books
            obs = env.observe_batch(where)
            logits, values = self.evaluate(obs, False)
            noise = self.random.uniform(tf.shape(logits))
            action = tf.argmax(logits - tf.math.log(-tf.math.log(noise)), axis=1,
                               output_type=tf.int32)  # fmt: skip
            nxt, reward, terminal = env.step_batch(where, action, self.random)
            steps = steps + 1
            limit = steps >= env.horizon
            over = tf.logical_or(terminal, limit)
            boot = self.evaluate(env.observe_batch(nxt), False)[1]
            truncated = tf.logical_and(limit, tf.logical_not(terminal))
            reward_in = reward + tf.where(truncated, c.gamma * boot, 0.0)
            ret = ret + reward
            starts = env.reset_batch(self.random, N)
            where = {k: tf.where(expand(over, v), starts[k], v) for k, v in nxt.items()}
            books = (
                tf.where(over, 0, steps), tf.where(over, 0.0, ret),
                episodes + tf.reduce_sum(tf.cast(over, tf.float32)),
                total + tf.reduce_sum(tf.where(over, ret, 0.0)),
            )  # fmt: skip
            logp = tf.gather(tf.nn.log_softmax(logits), action, axis=1, batch_dims=1)
            row = (obs, action, logp, values, reward_in, tf.cast(over, tf.float32))
            buffers = [b.write(t, x) for b, x in zip(buffers, row, strict=True)]
            return t + 1, where, books, buffers

        _, where, books, buffers = tf.while_loop(
            lambda t, *rest: t < T, body, (tf.constant(0), where, books, buffers)
        )
        for k, v in where.items():
            s[f"env_{k}"].assign(v)
        for k, v in zip(("episode_step", "episode_return", "epoch_episodes", "epoch_return"),
                        books, strict=True):  # fmt: skip
            s[k].assign(v)
        got = dict(zip(names, (b.stack() for b in buffers), strict=True))
        last = self.evaluate(env.observe_batch(where), False)[1]
        self.write_advantages(got, last)
        for k, v in got.items():
            s[k].assign(v)
        s["order"].assign(tf.argsort(self.random.uniform([c.update_epochs, T * N]), axis=1))
        if c.target_kl is not None:
            s["kl_stopped"].assign(0)
            s["last_approx_kl"].assign(0.0)
        return tf.constant(0)

    def write_advantages(self, got: dict, last: tf.Tensor) -> None:
        c, s = self.config, self.state
        T = c.rollout_steps
        values, alive = got["value"], 1.0 - got["done"]
        next_values = tf.concat([values[1:], last[None]], axis=0)
        delta = got["reward"] + c.gamma * alive * next_values - values

        def back(i, running, out):
            t = T - 1 - i
            running = delta[t] + c.gamma * c.gae_lambda * alive[t] * running
            return i + 1, running, out.write(t, running)

        start = (tf.constant(0), tf.zeros_like(last), tf.TensorArray(tf.float32, T))
        advantage = tf.while_loop(lambda i, *rest: i < T, back, start)[2].stack()
        s["returns"].assign(advantage + values)
        if c.normalize_advantages:
            mean, var = tf.nn.moments(advantage, axes=[0, 1])
            advantage = (advantage - mean) / (tf.sqrt(var) + 1e-8)
        s["advantage"].assign(advantage)

    def loss(self) -> tuple[tf.Tensor, tf.Tensor | None]:
        """The minibatch's loss and, with ``target_kl``, its approximate KL (CleanRL's
        ``approx_kl``, before this minibatch's update)."""
        c, s = self.config, self.state
        size = c.envs * c.rollout_steps // c.minibatches
        k = (s["updates"] - 1) % self.per_rollout
        pass_, part = tf.cast(k // c.minibatches, tf.int32), tf.cast(k % c.minibatches, tf.int32)
        idx = s["order"][pass_][part * size : (part + 1) * size]

        def rows(name):
            v = s[name]
            return tf.gather(tf.reshape(v, [-1, *v.shape[2:]]), idx)

        logits, values = self.evaluate(rows("observation"), True)
        logp = tf.nn.log_softmax(logits)
        diff = tf.gather(logp, rows("action"), axis=1, batch_dims=1) - rows("log_prob")
        ratio = tf.exp(diff)
        adv = rows("advantage")
        low, high = 1.0 - c.clip, 1.0 + c.clip
        pg = -tf.reduce_mean(tf.minimum(ratio * adv, tf.clip_by_value(ratio, low, high) * adv))
        old, target = rows("value"), rows("returns")
        err = tf.square(values - target)
        if c.clip_value:
            kept = old + tf.clip_by_value(values - old, -c.clip, c.clip)
            err = tf.maximum(err, tf.square(kept - target))
        v_loss = 0.5 * tf.reduce_mean(err)
        entropy = -tf.reduce_mean(tf.reduce_sum(tf.exp(logp) * logp, axis=1))
        loss = pg - c.entropy_coef * entropy + c.value_coef * v_loss
        if c.target_kl is None:
            return loss, None
        return loss, tf.stop_gradient(tf.reduce_mean((ratio - 1.0) - diff))

    def train_step(self) -> tf.Tensor:
        s = self.state
        new = tf.equal(s["updates"] % self.per_rollout, 0)
        tf.cond(new, self.gather_rollout, lambda: tf.constant(0))
        s["updates"].assign_add(1)
        with tf.GradientTape() as tape:
            loss, approx_kl = self.loss()
        grads = tape.gradient(loss, self.weights)
        grads, _ = tf.clip_by_global_norm(grads, self.config.max_grad_norm)
        if self.config.target_kl is None:
            self.optimizer.apply(grads, self.weights)
        else:
            self.update_unless_stopped(grads, approx_kl)
        return loss

    def update_unless_stopped(self, grads, approx_kl) -> None:
        """CleanRL's ``target_kl``: the update unless this rollout's passes are over;
        after a pass's last minibatch, its approx_kl above the target ends them."""
        c, s = self.config, self.state
        going = tf.equal(s["kl_stopped"].read_value(), 0)

        def update():
            self.optimizer.apply(grads, self.weights)
            return tf.constant(0)

        tf.cond(going, update, lambda: tf.constant(0))
        k = (s["updates"] - 1) % self.per_rollout
        pass_ends = tf.logical_and(going, tf.equal(k % c.minibatches, c.minibatches - 1))

        def end_of_pass():
            s["last_approx_kl"].assign(approx_kl)
            s["kl_stopped"].assign(tf.cast(approx_kl > c.target_kl, tf.int32))
            return tf.constant(0)

        tf.cond(pass_ends, end_of_pass, lambda: tf.constant(0))

    def fit(self, epochs: int) -> list[float]:
        """``epochs`` epochs; each epoch's mean return of the episodes it finished (its
        accumulators then cleared, as the recipe's are)."""
        returns = []
        c = self.config
        for _ in range(epochs):
            for _ in range(c.rollouts_per_epoch * self.per_rollout):
                self.step()
            episodes = float(self.state["epoch_episodes"].numpy())
            total = float(self.state["epoch_return"].numpy())
            returns.append(total / episodes if episodes else float("nan"))
            self.state["epoch_episodes"].assign(0.0)
            self.state["epoch_return"].assign(0.0)
        return returns
