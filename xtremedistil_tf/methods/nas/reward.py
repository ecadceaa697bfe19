"""The KD-NAS reward (paper Eq. 4): distillation loss traded against CPU latency."""
from __future__ import annotations

from xtremedistil_tf.errors import ConfigError

ALPHA = -0.06
BETA = 0.6


def reward(loss: float, latency_ms: float, teacher_latency_ms: float, alpha: float = ALPHA,
           beta: float = BETA) -> float:
    """(1 - loss) * (latency / (beta * teacher_latency)) ** alpha.

    alpha < 0 rewards students faster than the target latency beta * teacher_latency (the
    factor is > 1 below it, < 1 above it); a smaller |alpha| weighs the loss more (the paper
    takes -0.06, smaller than MnasNet's -0.07). The loss must be below 1 for the trade-off to
    point the right way: (1 - loss) <= 0 would reward slower students.
    """
    if latency_ms <= 0 or teacher_latency_ms <= 0 or beta <= 0:
        raise ConfigError(f"reward needs positive latencies and beta (latency {latency_ms}, "
                          f"teacher {teacher_latency_ms}, beta {beta})")
    return (1.0 - loss) * (latency_ms / (beta * teacher_latency_ms)) ** alpha
