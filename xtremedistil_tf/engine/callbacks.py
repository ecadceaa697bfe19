"""Best-so-far selection with patience (`BestSoFar`) and the engine's progress bar."""
from __future__ import annotations

import math
from typing import List, Optional

import tensorflow as tf
from tqdm.auto import tqdm


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


class BatchBar(tf.keras.callbacks.Callback):
    """A tqdm bar over one fit call's batches, described by the caller (e.g. "D4.2 stage 2/3
    (logits) step 1/4 +logits epoch 3/10"): Keras' own progress counts epochs of the fit call.

    Its total is Keras' step count when the data has a known length; batches grouped by length have none (making
    it known changes how many steps Keras runs), so `estimate`, the batches the caller counted in an earlier epoch
    of the same data, stands in, and the bar shows a time left from the first batch on. `count` is this epoch's."""

    def __init__(self, description: str, estimate: Optional[int] = None):
        super().__init__()
        self.description = description
        self.estimate = estimate
        self.bar = None
        self.count = 0

    def on_epoch_begin(self, epoch, logs=None):
        total = (self.params.get("steps") if self.params else None) or self.estimate
        self.count = 0
        self.bar = tqdm(total=total, desc=self.description, unit="batch", leave=False)

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1
        if self.bar.total is not None and self.count > self.bar.total:   # an estimate short of this epoch's batches
            self.bar.total = self.count
        self.bar.update(1)
        if logs and "loss" in logs:
            self.bar.set_postfix(loss=f"{float(logs['loss']):.4f}")

    def on_epoch_end(self, epoch, logs=None):
        self.bar.close()
