"""The one masked reduction of every loss (losses/registry.py lists them)."""
from __future__ import annotations

from typing import Optional

import tensorflow as tf


def masked_mean(values: tf.Tensor, mask: Optional[tf.Tensor] = None) -> tf.Tensor:
    """sum(values * mask) / sum(mask), 0 when nothing counts: the mean of `values` over the positions
    where `mask` (broadcast to the shape of `values`; None: every position) is non-zero."""
    mask = tf.ones_like(values) if mask is None else tf.broadcast_to(tf.cast(mask, values.dtype), tf.shape(values))
    return tf.math.divide_no_nan(tf.reduce_sum(values * mask), tf.reduce_sum(mask))


def row_mask(mask: tf.Tensor) -> tf.Tensor:
    """[B] float32: 1 for the rows of `mask` [B, T] with a counted position (what sequence losses average over)."""
    return tf.cast(tf.reduce_any(tf.not_equal(mask, 0), axis=1), tf.float32)
