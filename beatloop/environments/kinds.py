"""The built-in environments: ``chain`` (a walk to the end of a corridor, the ``dqn``
recipe's default) and ``cartpole`` (the classic pole balancing, in TensorFlow ops, the
``ppo`` recipe's default), each with batched methods on the whole stack of copies.
Registered by the built-in plugin; a recipe makes one by name with
``beatloop.make_environment``.
"""

from __future__ import annotations

import math

import attrs
import tensorflow as tf

from beatloop import Environment, setting

#: An environment's state: named tensors (``Environment``'s methods take and return it).
State = dict[str, tf.Tensor]


def _at_least(low: int):
    return attrs.validators.ge(low)


@attrs.frozen
class ChainConfig:
    """Parameters of the chain walk."""

    length: int = setting(10, "cells in the chain; the agent starts in the first", _at_least(2))
    horizon: int = setting(30, "the most steps an episode lasts", _at_least(1))


class Chain(Environment):
    """A corridor of cells: step left or right from the first; reaching the last pays 1.

    The observation is the cell, one-hot. Reaching the last cell ends the episode with
    reward 1; an episode not there after ``horizon`` steps ends with 0. A greedy
    (deterministic) policy reaches the end only by stepping right in every cell on the
    way, so a return of 1 is the optimal policy's.
    """

    name = "chain"
    Config = ChainConfig

    @property
    def observation_size(self) -> int:
        return self.config.length

    @property
    def action_count(self) -> int:
        return 2

    @property
    def horizon(self) -> int:
        return self.config.horizon

    @property
    def optimal_return(self) -> float:
        return 1.0

    def initial_state(self) -> State:
        return {"position": tf.constant(0, tf.int32)}

    def observe(self, state: State) -> tf.Tensor:
        return tf.one_hot(state["position"], self.config.length)

    def step(self, state: State, action: tf.Tensor, random: tf.random.Generator):
        last = self.config.length - 1
        moved = tf.clip_by_value(state["position"] + 2 * action - 1, 0, last)
        arrived = tf.equal(moved, last)
        return {"position": moved}, tf.cast(arrived, tf.float32), arrived

    # Chain's ops are elementwise: on a stacked state they move every copy at once.
    def reset_batch(self, random: tf.random.Generator, count: int) -> State:
        return {"position": tf.zeros([count], tf.int32)}

    def observe_batch(self, state: State) -> tf.Tensor:
        return self.observe(state)

    def step_batch(self, state: State, action: tf.Tensor, random: tf.random.Generator):
        return self.step(state, action, random)


@attrs.frozen
class CartPoleConfig:
    """Parameters of the cart-pole (the classic constants, as Barto, Sutton & Anderson
    1983 and Gym's CartPole)."""

    horizon: int = setting(200, "the most steps an episode lasts (its best return)", _at_least(1))
    gravity: float = setting(9.8, "gravity, m/s^2")
    cart_mass: float = setting(1.0, "mass of the cart, kg")
    pole_mass: float = setting(0.1, "mass of the pole, kg")
    half_length: float = setting(0.5, "half the pole's length, m")
    force: float = setting(10.0, "the force an action pushes the cart with, N")
    tau: float = setting(0.02, "seconds between steps (Euler integration)")
    angle_limit: float = setting(12.0, "the pole's lean that ends the episode, degrees")
    position_limit: float = setting(2.4, "the cart's distance from the centre that ends it, m")


class CartPole(Environment):
    """Balance a pole on a cart by pushing it left or right; 1 for every step it stands.

    The observation is (cart position, cart velocity, pole angle, pole angular velocity);
    an episode starts with each drawn from U(-0.05, 0.05) and ends when the pole leans
    past ``angle_limit`` or the cart leaves ``position_limit``, or after ``horizon`` steps.
    """

    name = "cartpole"
    Config = CartPoleConfig

    @property
    def observation_size(self) -> int:
        return 4

    @property
    def action_count(self) -> int:
        return 2

    @property
    def horizon(self) -> int:
        return self.config.horizon

    @property
    def optimal_return(self) -> float:
        return float(self.config.horizon)

    def initial_state(self) -> State:
        return {"physics": tf.zeros([4])}

    def reset(self, random: tf.random.Generator) -> State:
        return {"physics": random.uniform([4], -0.05, 0.05)}

    def observe(self, state: State) -> tf.Tensor:
        return state["physics"]

    def step(self, state: State, action: tf.Tensor, random: tf.random.Generator):
        physics, fallen = self._advance(state["physics"], action, axis=0)
        return {"physics": physics}, tf.constant(1.0), fallen

    def reset_batch(self, random: tf.random.Generator, count: int) -> State:
        return {"physics": random.uniform([count, 4], -0.05, 0.05)}

    def observe_batch(self, state: State) -> tf.Tensor:
        return state["physics"]

    def step_batch(self, state: State, action: tf.Tensor, random: tf.random.Generator):
        physics, fallen = self._advance(state["physics"], action, axis=-1)
        return {"physics": physics}, tf.ones_like(physics[:, 0]), fallen

    def _advance(self, physics: tf.Tensor, action: tf.Tensor, axis: int):
        """One Euler step of the physics (the four quantities along ``axis``: one cart,
        or a batch of them) and whether the pole fell or the cart left the track."""
        c = self.config
        x, x_dot, theta, theta_dot = tf.unstack(physics, num=4, axis=axis)
        force = tf.where(tf.equal(action, 1), c.force, -c.force)
        cos, sin = tf.cos(theta), tf.sin(theta)
        total_mass, pole_moment = c.cart_mass + c.pole_mass, c.pole_mass * c.half_length
        push = (force + pole_moment * theta_dot * theta_dot * sin) / total_mass
        theta_acc = (c.gravity * sin - cos * push) / (
            c.half_length * (4.0 / 3.0 - c.pole_mass * cos * cos / total_mass)
        )
        x_acc = push - pole_moment * theta_acc * cos / total_mass
        moved = [x + c.tau * x_dot, x_dot + c.tau * x_acc, theta + c.tau * theta_dot,
                 theta_dot + c.tau * theta_acc]  # fmt: skip
        angle_limit = c.angle_limit * math.pi / 180.0
        fallen = tf.logical_or(tf.abs(moved[0]) > c.position_limit, tf.abs(moved[2]) > angle_limit)
        return tf.stack(moved, axis=axis), fallen


BUILT_IN = (Chain, CartPole)
