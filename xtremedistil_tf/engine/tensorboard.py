"""TensorBoard scalars for every training loop: teacher fine-tuning, the staged student loop and
multi-grained training write under `<work_dir>/tensorboard/<step>/` (`tensorboard --logdir
<work_dir>/tensorboard`). Loss terms, learning rates, dev scores and uncertainty weights are logged
once per epoch; the x axis counts epochs across a whole step (all stages of a strategy).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Union

import tensorflow as tf


class ScalarLog:
    """A summary writer for one training step; a no-op when `log_dir` is None."""

    def __init__(self, log_dir: Optional[Union[str, Path]]):
        self.writer = tf.summary.create_file_writer(str(log_dir)) if log_dir else None

    def write(self, step: int, values: Mapping[str, Optional[float]]) -> None:
        """Log every value of `values` that is not None at `step`."""
        if self.writer is None:
            return
        with self.writer.as_default():
            for name, value in values.items():
                if value is not None:
                    tf.summary.scalar(name, float(value), step=step)
        self.writer.flush()


def current_learning_rate(optimizer) -> float:
    """The optimizer's learning rate at its current iteration (schedules evaluated)."""
    rate = optimizer.learning_rate
    if isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
        rate = rate(optimizer.iterations)
    return float(tf.convert_to_tensor(rate))


class EpochScalars(tf.keras.callbacks.Callback):
    """Keras callback: each epoch's logs (every loss term, train and dev) and the learning rate,
    under `prefix`, at a step counter shared by every `fit` of a staged run."""

    def __init__(self, log: ScalarLog, prefix: str = ""):
        super().__init__()
        self.log = log
        self.prefix = prefix
        self.epoch = 0

    def on_epoch_end(self, epoch, logs=None):
        self.epoch += 1
        values = {f"{self.prefix}{k}": v for k, v in (logs or {}).items()}
        values[f"{self.prefix}learning_rate"] = current_learning_rate(self.model.optimizer)
        self.log.write(self.epoch, values)
