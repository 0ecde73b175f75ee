"""What an environment is: the ``Environment`` base class, an episodic task written in
TensorFlow ops that a recipe (``dqn``, ``ppo``) steps inside its compiled training step.

An environment is pure functions of its state, a dict of tensors: ``reset`` starts an
episode, ``observe`` reads what the agent sees, ``step`` moves it on; the ``*_batch`` methods do
the same for N copies at once (stacked states). The state lives
wherever the caller keeps it: in recipe state variables for training (``build_state``),
in loop variables for a greedy roll-out that must not touch them. This module imports
nothing of the plugins, so the registry, the built-in kinds and the recipe all import it.
"""

from __future__ import annotations

import abc
import inspect
from typing import Any, ClassVar

import attrs
import tensorflow as tf

from beatloop.core.data.environment_check import check_environment

State = dict[str, tf.Tensor]


@attrs.frozen
class NoEnvironmentConfig:
    """Config of an environment with nothing to configure."""


class Environment(abc.ABC):
    """Base class of environments. One instance is one configured environment.

    Subclasses set ``name`` (an identifier: what the ``dqn`` recipe's ``env`` names) and
    ``Config`` (an attrs frozen class of parameters, every one with a default, set by the
    recipe's ``env_settings``), and implement the sizes (``observation_size``,
    ``action_count``, ``horizon``) and ``initial_state``, ``observe`` and ``step`` in
    TensorFlow ops, traced without AutoGraph: control flow on tensors is ``tf.where``
    or ``tf.cond``. Randomness comes from the ``random`` generator passed in (the run's,
    checkpointed), never from global random ops. The first line of the class docstring
    is its description.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoEnvironmentConfig

    def __init__(self, config: Any = None):
        self.config = self.Config() if config is None else config

    @classmethod
    def description(cls) -> str:
        """The first line of the class docstring."""
        doc = (inspect.getdoc(cls) or "").strip()
        return doc.splitlines()[0] if doc else ""

    @property
    @abc.abstractmethod
    def observation_size(self) -> int:
        """Length of the float32 vector ``observe`` returns."""

    @property
    @abc.abstractmethod
    def action_count(self) -> int:
        """Number of discrete actions: an action is an int32 in ``[0, action_count)``."""

    @property
    @abc.abstractmethod
    def horizon(self) -> int:
        """The most steps an episode lasts: the agent cuts it there (a time limit, not a
        terminal state: its last transition still bootstraps)."""

    @property
    def optimal_return(self) -> float | None:
        """The best return an episode can have, when it is known (``None`` if not)."""
        return None

    @abc.abstractmethod
    def initial_state(self) -> State:
        """A valid state, the same every time: the variables' first value."""

    def reset(self, random: tf.random.Generator) -> State:
        """A new episode's first state (drawn from ``random`` when episodes start at
        random); by default ``initial_state()``."""
        return self.initial_state()

    @abc.abstractmethod
    def observe(self, state: State) -> tf.Tensor:
        """What the agent sees in ``state``: a float32 vector of ``observation_size``."""

    @abc.abstractmethod
    def step(
        self, state: State, action: tf.Tensor, random: tf.random.Generator
    ) -> tuple[State, tf.Tensor, tf.Tensor]:
        """One move: ``(next_state, reward, terminal)``, a float32 reward and a bool
        that says the episode ended in a terminal state (nothing follows it)."""

    # -- N copies at once (the ``ppo`` recipe's parallel environments) -----------------
    # A state of N copies holds each entry of a single state stacked along a new first
    # dimension. The defaults unroll the single-copy methods over the copies (so any
    # environment works); a built-in overrides them with ops on the whole batch.

    def reset_batch(self, random: tf.random.Generator, count: int) -> State:
        """``count`` new episodes' first states, stacked: ``reset`` once per copy."""
        starts = [self.reset(random) for _ in range(count)]
        return {key: tf.stack([start[key] for start in starts]) for key in starts[0]}

    def observe_batch(self, state: State) -> tf.Tensor:
        """What the agent sees in each copy: ``[count, observation_size]`` float32."""
        return tf.stack([self.observe(one) for one in _copies(state)])

    def step_batch(
        self, state: State, action: tf.Tensor, random: tf.random.Generator
    ) -> tuple[State, tf.Tensor, tf.Tensor]:
        """Every copy moved by its action (``[count]`` int32): the stacked next states,
        ``[count]`` rewards and ``[count]`` terminal flags (``step`` once per copy)."""
        moves = [self.step(one, action[i], random) for i, one in enumerate(_copies(state))]
        after = {key: tf.stack([move[0][key] for move in moves]) for key in moves[0][0]}
        rewards = tf.stack([tf.cast(move[1], tf.float32) for move in moves])
        return after, rewards, tf.stack([tf.cast(move[2], tf.bool) for move in moves])

    def build_state(self) -> dict[str, tf.Variable]:
        """Variables holding a state, started at ``initial_state()``: what a recipe puts
        in its recipe state (non-trainable, so checkpointed with it)."""
        return {
            key: tf.Variable(value, trainable=False, name=key)
            for key, value in self.initial_state().items()
        }

    def check(self, copies: int | None = None) -> None:
        """Refuse this environment before a run's first step when its methods do not
        fit its sizes: ``reset``, ``observe`` and ``step`` (with ``copies``, also
        ``reset_batch``, ``observe_batch`` and ``step_batch`` on that many copies) traced
        once without AutoGraph, as a recipe traces them; nothing runs. The state must
        keep ``initial_state()``'s keys, dtypes and shapes, an observation be float32 of
        ``observation_size``, a reward float32 and a terminal flag bool (scalars, or one
        per copy). A mismatch is a ``ConfigError`` naming the environment, the method,
        what was expected and what was found; an exception a method raises, a
        ``UserCodeError`` (a Python branch on a tensor: a ``ConfigError`` saying to use
        ``tf.where``/``tf.cond``). The ``dqn`` and ``ppo`` recipes call it as they build
        their state."""
        check_environment(self, copies)

    def describe(self) -> str:
        """``chain (observation 10, 2 actions, horizon 30)``: for messages and ``show``."""
        return (
            f"{self.name} (observation {self.observation_size}, {self.action_count} "
            f"actions, horizon {self.horizon})"
        )


def _copies(state: State) -> list[State]:
    """The single-copy states of a stacked state (its copy count known when traced)."""
    count = next(iter(state.values())).shape[0]
    return [{key: value[i] for key, value in state.items()} for i in range(count)]
