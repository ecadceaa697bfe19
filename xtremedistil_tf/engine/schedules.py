"""Learning-rate schedules, serializable so optimizers can be checkpointed with them, and BERT's
fine-tuning optimizer over one."""
from __future__ import annotations

import tensorflow as tf


@tf.keras.utils.register_keras_serializable(package="xtremedistil_tf")
class WarmupLinearDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak` over `warmup_steps`, then linear decay to 0 at `total_steps`.

    The schedule BERT fine-tuning uses; `scale` multiplies it so that layer-wise learning-rate
    decay can give each layer group its own copy of one schedule.
    """

    def __init__(self, peak: float, total_steps: int, warmup_steps: int, scale: float = 1.0):
        self.peak = float(peak)
        self.total_steps = int(max(1, total_steps))
        self.warmup_steps = int(max(0, warmup_steps))
        self.scale = float(scale)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warm = step / float(max(1, self.warmup_steps))
        decay = (self.total_steps - step) / float(max(1, self.total_steps - self.warmup_steps))
        factor = tf.where(step < self.warmup_steps, warm, decay)
        return self.peak * self.scale * tf.clip_by_value(factor, 0.0, 1.0)

    def get_config(self) -> dict:
        return {"peak": self.peak, "total_steps": self.total_steps,
                "warmup_steps": self.warmup_steps, "scale": self.scale}


def warmup_adamw(peak, total_steps, warmup, weight_decay):
    """BERT's fine-tuning optimizer: AdamW with linear warm-up to `peak` over `warmup` steps, then
    linear decay to 0 at `total_steps`; no weight decay on LayerNorm parameters and biases."""
    optimizer = tf.keras.optimizers.AdamW(
        learning_rate=WarmupLinearDecay(peak, total_steps, warmup), weight_decay=weight_decay,
        epsilon=1e-8)
    optimizer.exclude_from_weight_decay(var_names=["LayerNorm", "layer_norm", "bias"])
    return optimizer
