"""Keras callbacks for the staged loop."""
from __future__ import annotations

import math
from typing import List, Optional

import tensorflow as tf

from xtremedistil_tf.errors import ConfigError


class BestWeights(tf.keras.callbacks.Callback):
    """Keep the weights of the epoch with the lowest `monitor` and restore them when training ends.

    Unlike EarlyStopping(restore_best_weights=True) it restores whenever the last epoch is not the
    best, stopped early or not. With `baseline` (the monitored value of the weights training starts
    from) the starting weights compete too, so a step never ends worse than it began.
    `patience` epochs without improvement stop training (None: never). NaN counts as no improvement.

    After training: `best` (value), `best_epoch` (1-based; 0 = the starting weights; None when no
    epoch had a finite value and there was no baseline), `values` (one per epoch run).
    """

    def __init__(self, monitor: str = "val_loss", patience: Optional[int] = None,
                 baseline: Optional[float] = None):
        super().__init__()
        self.monitor = monitor
        self.patience = patience
        self.baseline = baseline

    def on_train_begin(self, logs=None):
        self.values: List[float] = []
        self.wait = 0
        self.best = math.inf
        self.best_epoch: Optional[int] = None
        self._best_weights = None
        if self.baseline is not None and math.isfinite(self.baseline):
            self.best, self.best_epoch = float(self.baseline), 0
            self._best_weights = self.model.get_weights()

    def on_epoch_end(self, epoch, logs=None):
        if not logs or self.monitor not in logs:
            raise ConfigError(f"BestWeights monitors {self.monitor!r} but the epoch logs have "
                              f"{sorted(logs or {})}; pass validation data to fit")
        value = float(logs[self.monitor])
        self.values.append(value)
        if value < self.best:
            self.best, self.best_epoch, self.wait = value, epoch + 1, 0
            self._best_weights = self.model.get_weights()
            return
        self.wait += 1
        if self.patience is not None and self.wait >= self.patience:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self._best_weights is not None:
            self.model.set_weights(self._best_weights)
            self._best_weights = None
