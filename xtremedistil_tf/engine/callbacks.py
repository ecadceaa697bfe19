"""Best-so-far selection with patience (`BestSoFar`, and `BestWeights` over one Keras fit) and the
engine's progress bar."""
from __future__ import annotations

import math
from typing import List, Optional

import tensorflow as tf

from xtremedistil_tf.errors import ConfigError


class BestSoFar:
    """The selection state of a loop that keeps its best epoch (lowest value), as plain data so a
    checkpoint can hold it: every epoch's value, the best value and epoch (1-based; 0 = the starting
    weights given as `baseline`), epochs since the last improvement, and the best weights.
    NaN counts as no improvement; `patience` epochs without one set `stopped` (None: never)."""

    def __init__(self, patience: Optional[int] = None, baseline: Optional[float] = None, weights=None):
        self.patience = patience
        self.baseline = baseline
        self.values: List[float] = []
        self.wait = 0
        self.best, self.best_epoch, self.best_weights = math.inf, None, None
        if baseline is not None and math.isfinite(baseline):
            self.best, self.best_epoch, self.best_weights = float(baseline), 0, weights

    @property
    def stopped(self) -> bool:
        return self.patience is not None and self.wait >= self.patience

    def update(self, value: float, get_weights) -> bool:
        """Record one epoch's `value`; on improvement keep `get_weights()`. Returns whether it improved."""
        value = float(value)
        self.values.append(value)
        if value < self.best:
            self.best, self.best_epoch, self.wait = value, len(self.values), 0
            self.best_weights = get_weights()
            return True
        self.wait += 1
        return False

    def state(self) -> dict:
        """Everything but the weights (a checkpoint holds those as variables)."""
        return {"values": self.values, "wait": self.wait, "best": self.best, "best_epoch": self.best_epoch,
                "baseline": self.baseline}

    @classmethod
    def from_state(cls, state: dict, patience: Optional[int], weights) -> "BestSoFar":
        tracker = cls(patience)
        tracker.baseline = state["baseline"]
        tracker.values, tracker.wait = list(state["values"]), int(state["wait"])
        tracker.best, tracker.best_epoch = float(state["best"]), state["best_epoch"]
        tracker.best_weights = weights if state["best_epoch"] is not None else None
        return tracker


class BestWeights(tf.keras.callbacks.Callback):
    """`BestSoFar` as a Keras callback over one fit call: keeps the weights of the epoch with the
    lowest `monitor` and restores them when training ends (stopped early or not, unlike
    EarlyStopping(restore_best_weights=True)). With `baseline` (the monitored value of the starting
    weights) the starting weights compete too. `patience` epochs without improvement stop training.
    After training: `values`, `best`, `best_epoch` (1-based; 0 = the starting weights)."""

    def __init__(self, monitor: str = "val_loss", patience: Optional[int] = None,
                 baseline: Optional[float] = None):
        super().__init__()
        self.monitor, self.patience, self.baseline = monitor, patience, baseline

    def on_train_begin(self, logs=None):
        self.tracker = BestSoFar(self.patience, self.baseline, self.model.get_weights())

    def on_epoch_end(self, epoch, logs=None):
        if not logs or self.monitor not in logs:
            raise ConfigError(f"BestWeights monitors {self.monitor!r} but the epoch logs have "
                              f"{sorted(logs or {})}; pass validation data to fit")
        self.tracker.update(logs[self.monitor], self.model.get_weights)
        if self.tracker.stopped:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self.tracker.best_weights is not None:
            self.model.set_weights(self.tracker.best_weights)

    values = property(lambda self: self.tracker.values)
    best = property(lambda self: self.tracker.best)
    best_epoch = property(lambda self: self.tracker.best_epoch)


class BatchBar(tf.keras.callbacks.Callback):
    """A tqdm bar over one fit call's batches, described by the caller (e.g. "D4.2 stage 2/3
    (logits) step 1/4 +logits epoch 3/10"): Keras' own progress counts epochs of the fit call."""

    def __init__(self, description: str):
        super().__init__()
        self.description = description
        self.bar = None

    def on_epoch_begin(self, epoch, logs=None):
        from tqdm.auto import tqdm

        total = self.params.get("steps") if self.params else None
        self.bar = tqdm(total=total, desc=self.description, unit="batch", leave=False)

    def on_train_batch_end(self, batch, logs=None):
        self.bar.update(1)
        if logs and "loss" in logs:
            self.bar.set_postfix(loss=f"{float(logs['loss']):.4f}")

    def on_epoch_end(self, epoch, logs=None):
        self.bar.close()
