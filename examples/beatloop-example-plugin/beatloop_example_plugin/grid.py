"""A grid walk for the built-in ``dqn`` recipe: an environment in TensorFlow ops that a
plugin adds (``beatloop run dqn --set env=grid``)."""

import attrs
import tensorflow as tf

import beatloop


@attrs.frozen
class GridConfig:
    """``width`` x ``height`` cells; an episode is cut after ``horizon`` steps."""

    width: int = attrs.field(default=4, validator=attrs.validators.ge(2))
    height: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    horizon: int = attrs.field(default=30, validator=attrs.validators.ge(1))


class Grid(beatloop.Environment):
    """Walk a grid from its top-left corner to the bottom-right one, which pays 1.

    Four actions (right, down, left, up; a step into the wall stays put); the
    observation is the column and the row, each one-hot.
    """

    name = "grid"
    Config = GridConfig

    @property
    def observation_size(self):
        return self.config.width + self.config.height

    @property
    def action_count(self):
        return 4

    @property
    def horizon(self):
        return self.config.horizon

    @property
    def optimal_return(self):
        return 1.0

    def initial_state(self):
        return {"column": tf.constant(0), "row": tf.constant(0)}

    def observe(self, state):
        width, height = self.config.width, self.config.height
        return tf.concat([tf.one_hot(state["column"], width), tf.one_hot(state["row"], height)], 0)

    def step(self, state, action, random):
        moves = tf.constant([[1, 0], [0, 1], [-1, 0], [0, -1]])[action]
        column = tf.clip_by_value(state["column"] + moves[0], 0, self.config.width - 1)
        row = tf.clip_by_value(state["row"] + moves[1], 0, self.config.height - 1)
        arrived = tf.logical_and(
            tf.equal(column, self.config.width - 1), tf.equal(row, self.config.height - 1)
        )
        return {"column": column, "row": row}, tf.cast(arrived, tf.float32), arrived
