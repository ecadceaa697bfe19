"""The feedback controller (KD-NAS section 3, A): an LSTM that predicts a state's reward.

Its input is a sequence of three encoded states: the global best state (highest reward of all
earlier episodes), the previous best state (highest reward of the previous episode) and the state
to score, read in that order so the LSTM's last step sees the candidate. A missing context state
(the first episodes) is all zeros. Rewards are standardised with the mean and standard deviation of
the rewards seen so far before the MSE: the paper's rewards differ in the second decimal
(Table 3: 1.01 to 1.07), which a small network at learning rate 1e-4 would fit only as their
mean; standardising changes no ranking, which is all the search uses.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from xtremedistil_tf.io import atomic_write_json, read_json
from xtremedistil_tf.methods.nas.space import Arch, SearchSpace


@dataclass
class ControllerConfig:
    """The reward predictor's training; defaults are the paper's (appendix B) where it gives them."""

    units: int = 32                  # LSTM cells
    learning_rate: float = 1e-4      # RMSProp's, decayed exponentially:
    decay_steps: int = 100           # x decay_rate every decay_steps steps
    decay_rate: float = 0.96
    rho: float = 0.95                # RMSProp's
    epochs: int = 10                 # per episode
    batch_size: int = 16
    seed: int = 0


class Controller:
    """Reward predictor over `space`; `fit` continues training from the current weights."""

    def __init__(self, space: SearchSpace, config: Optional[ControllerConfig] = None):
        self.space = space
        self.config = config or ControllerConfig()
        self.reward_mean, self.reward_std = 0.0, 1.0
        tf.keras.utils.set_random_seed(self.config.seed)
        size = space.encoding_size
        inputs = tf.keras.Input((3, size), name="states")
        hidden = tf.keras.layers.LSTM(self.config.units, name="lstm")(inputs)
        outputs = tf.keras.layers.Dense(1, name="reward")(hidden)
        self.model = tf.keras.Model(inputs, outputs, name="nas_controller")
        schedule = tf.keras.optimizers.schedules.ExponentialDecay(
            self.config.learning_rate, self.config.decay_steps, self.config.decay_rate)
        self.model.compile(optimizer=tf.keras.optimizers.RMSprop(schedule, rho=self.config.rho), loss="mse")

    def _encode(self, arch: Optional[Arch]) -> np.ndarray:
        return np.zeros(self.space.encoding_size, np.float32) if arch is None else self.space.encode(arch)

    def inputs(self, states: Sequence[Arch], global_best: Sequence[Optional[Arch]],
               previous_best: Sequence[Optional[Arch]]) -> np.ndarray:
        """[N, 3, encoding_size]: (global best, previous best, state) per row."""
        return np.stack([np.stack([self._encode(g), self._encode(p), self._encode(s)])
                         for s, g, p in zip(states, global_best, previous_best)])

    def fit(self, states: Sequence[Arch], global_best: Sequence[Optional[Arch]],
            previous_best: Sequence[Optional[Arch]], rewards: Sequence[float], epochs: Optional[int] = None) -> float:
        """Train on (context, state) -> reward pairs with MSE; returns the last epoch's loss."""
        rewards = np.asarray(rewards, np.float64)
        self.reward_mean = float(rewards.mean())
        self.reward_std = float(rewards.std()) or 1.0
        targets = ((rewards - self.reward_mean) / self.reward_std).astype(np.float32)[:, None]
        history = self.model.fit(self.inputs(states, global_best, previous_best), targets, verbose=0,
                                 epochs=epochs or self.config.epochs, batch_size=self.config.batch_size,
                                 shuffle=True)
        return float(history.history["loss"][-1])

    def predict(self, states: Sequence[Arch], global_best: Optional[Arch], previous_best: Optional[Arch]) -> np.ndarray:
        """Predicted rewards [N] of `states` under one context."""
        if not states:
            return np.zeros(0)
        n = len(states)
        x = self.inputs(states, [global_best] * n, [previous_best] * n)
        out = self.model.predict(x, verbose=0, batch_size=1024)[:, 0]
        return out * self.reward_std + self.reward_mean

    def save(self, path) -> None:
        """Weights and reward scale, written to a temporary name and renamed (atomic)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp.weights.h5")
        self.model.save_weights(str(tmp))
        os.replace(tmp, path)
        atomic_write_json(str(path) + ".scale.json", {"mean": self.reward_mean, "std": self.reward_std})

    def load(self, path) -> None:
        self.model.load_weights(str(path))
        scale_file = Path(str(path) + ".scale.json")
        if scale_file.exists():
            scale = read_json(scale_file)
            self.reward_mean, self.reward_std = float(scale["mean"]), float(scale["std"])
