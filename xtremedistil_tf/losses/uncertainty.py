"""Combining several losses into one: learned uncertainty weights or a plain sum.

Both layers take the losses stacked on the last axis, `[..., num_losses]` (a list of scalars is
stacked for you), return `[...]`, and expose `lambdas` [num_losses] for logging, so
`--loss_weighting=uncertainty|equal` only changes which class `loss_weighting` builds.
"""
from __future__ import annotations

import tensorflow as tf

from xtremedistil_tf.errors import ConfigError


def _stack(losses):
    """A list/tuple of same-shape losses -> [..., num_losses]; a tensor passes through."""
    if isinstance(losses, (list, tuple)):
        return tf.stack([tf.cast(loss, tf.float32) for loss in losses], axis=-1)
    return tf.cast(losses, tf.float32)


def _check_count(losses, num_losses, name):
    count = losses.shape[-1]
    if count is not None and count != num_losses:
        raise ConfigError(f"{name} was built for {num_losses} losses but got {count}")


class _LossWeighting(tf.keras.layers.Layer):
    """What both weightings share: the loss count, output shape and config."""

    def __init__(self, num_losses, **kwargs):
        # Losses are float32 under any mixed-precision policy (engine/precision.py); so are their weights.
        kwargs["dtype"] = "float32"
        super().__init__(**kwargs)
        if int(num_losses) < 1:
            raise ConfigError(f"num_losses must be at least 1; got {num_losses}")
        self.num_losses = int(num_losses)

    def _stacked(self, losses):
        losses = _stack(losses)
        _check_count(losses, self.num_losses, self.name)
        return losses

    def compute_output_shape(self, input_shape):
        return tf.TensorShape(input_shape)[:-1]

    def get_config(self):
        config = super().get_config()
        config.update(num_losses=self.num_losses)
        return config


@tf.keras.utils.register_keras_serializable(package="xtremedistil_tf")
class UncertaintyWeighting(_LossWeighting):
    """L = sum_i lambda_i L_i - 1/2 sum_i log lambda_i (Cipolla et al. 2018; multi-grained KD Eq. 9).

    lambda_i = exp(s_i) with the trainable `log_lambdas` s_i (initialised to 0, lambda = 1), so
    lambda_i > 0 without constraints and the regulariser is just -1/2 sum_i s_i. At the optimum
    lambda_i = 1 / (2 L_i): a loss that is large (noisy) gets a small weight.
    """

    def build(self, input_shape):
        self.log_lambdas = self.add_weight(name="log_lambdas", shape=[self.num_losses],
                                           initializer="zeros", dtype=tf.float32, trainable=True)
        super().build(input_shape)

    @property
    def lambdas(self):
        """[num_losses] float32, the current weights lambda_i."""
        return tf.exp(self.log_lambdas)

    def call(self, losses):
        weighted = tf.reduce_sum(tf.exp(self.log_lambdas) * self._stacked(losses), axis=-1)
        return weighted - 0.5 * tf.reduce_sum(self.log_lambdas)


@tf.keras.utils.register_keras_serializable(package="xtremedistil_tf")
class EqualWeighting(_LossWeighting):
    """L = sum_i L_i (the paper's "equal" baseline, Table 3); no weights, lambdas are all 1."""

    @property
    def lambdas(self):
        return tf.ones([self.num_losses], tf.float32)

    def call(self, losses):
        return tf.reduce_sum(self._stacked(losses), axis=-1)


LOSS_WEIGHTINGS = {"uncertainty": UncertaintyWeighting, "equal": EqualWeighting}


def loss_weighting(name, num_losses, **kwargs):
    """The layer for `--loss_weighting=name` ("uncertainty" or "equal")."""
    if name not in LOSS_WEIGHTINGS:
        raise ConfigError(f"unknown loss weighting {name!r}; expected one of {', '.join(LOSS_WEIGHTINGS)}")
    return LOSS_WEIGHTINGS[name](num_losses, **kwargs)
