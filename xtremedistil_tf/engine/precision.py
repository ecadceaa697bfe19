"""Mixed precision (`--mixed_precision`): Keras dtype policies for every model a step builds, and
loss scaling where float16 needs it.

Under `mixed_float16` or `mixed_bfloat16`, layers compute in 16 bits and keep float32 weights.
Losses, softmax outputs and the CRF (layer, log-likelihood, k-best Viterbi) stay float32: the CRF
layer is float32 whatever the policy, and every loss casts its inputs. float16 has a narrow range,
so its gradients are loss-scaled (Keras' dynamic `LossScaleOptimizer`); bfloat16 has float32's
range and needs none. Precision is an execution setting like the batch placement: it is not part of
a step's fingerprint, and the saved weights are float32 either way. A student saved from a mixed run
keeps the policy in its layer configs, so `tf.keras.models.load_model` computes it in 16 bits too.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import tensorflow as tf

from xtremedistil_tf.errors import ConfigError

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise ConfigError(f"--mixed_precision={name!r}; expected one of {', '.join(POLICIES)}")
    return name


@contextmanager
def precision_policy(name: str) -> Iterator[None]:
    """Build and train under the Keras global policy `name`; the previous policy is restored after."""
    previous = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy(check_policy(name))
    try:
        yield
    finally:
        tf.keras.mixed_precision.set_global_policy(previous)


def needs_loss_scaling() -> bool:
    return tf.keras.mixed_precision.global_policy().name == "mixed_float16"


def with_loss_scaling(optimizer):
    """`optimizer` wrapped in a dynamic LossScaleOptimizer under mixed_float16, else unchanged.
    Train with `optimizer.minimize(loss, variables, tape=tape)`, which scales and unscales."""
    if needs_loss_scaling() and not isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
        return tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def all_finite(gradients: Sequence[tf.Tensor]) -> tf.Tensor:
    """True when no gradient holds an inf or NaN (a float16 overflow)."""
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients if g is not None]
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])
