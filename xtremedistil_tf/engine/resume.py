"""Exact resume of the training loops after a kill (`tf.train.CheckpointManager`).

Every training loop (teacher fine-tuning, the staged student loop, multi-grained KD) saves at each
epoch boundary, into one directory of the work dir:
- the model (its weights, and the state of its dropout random generators: see `stateful_dropout`),
- the optimizer(s) (slots, iteration count, so the learning-rate schedule continues; the dynamic
  loss scale under mixed_float16), the uncertainty weights of multi-grained KD,
- the best-so-far weights (`WeightsSlot`), and the position in the schedule as a JSON string
  (stage, unfreeze step, epoch, best value, patience counter, the records of finished steps).
A rerun of the same command reads the position (`EpochCheckpoint.position`), rebuilds the same
objects, restores them and continues with the next epoch; work done after the last save is redone.

What makes the continuation exact rather than merely close:
- data order: each epoch's shuffle seed is `epoch_seed(seed, *position)`, a function of the run's
  seed and where the epoch sits, never of how many iterators a dataset has already handed out;
- dropout: layers built under `stateful_dropout()` draw from `tf.random.Generator`s, which
  `reseed_dropout` resets at the start of every epoch from the epoch's seed (Keras' default, legacy
  stateful random ops, keeps its state in kernels that neither a checkpoint nor a reseed reaches,
  and Keras leaves the generators out of checkpoints on purpose).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
import shutil
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import tensorflow as tf

log = logging.getLogger(__name__)

POSITION_KEY = "position/.ATTRIBUTES/VARIABLE_VALUE"

# The run's seed unless one is given: bin/train's --seed and the seed of the configs it builds from it
# (FinetuneConfig, DistilConfig; MultiGrainedConfig states the same 42, tests/test_pipeline.py checks).
DEFAULT_SEED = 42


def epoch_seed(seed: int, *position: int) -> int:
    """A 31-bit shuffle seed determined by the run's seed and an epoch's position (e.g. stage,
    step, epoch); neighbouring positions get unrelated seeds."""
    return int(np.random.SeedSequence([int(seed), *map(int, position)]).generate_state(1)[0] & 0x7FFFFFFF)


@contextlib.contextmanager
def stateful_dropout() -> Iterator[None]:
    """Build models whose dropout layers use `tf.random.Generator` (a checkpointable state variable).

    Keras' switch is global and read when a layer is constructed; it is restored afterwards."""
    backend = tf.keras.backend.experimental
    was = backend.is_tf_random_generator_enabled()
    backend.enable_tf_random_generator()
    try:
        yield
    finally:
        if not was:
            backend.disable_tf_random_generator()


def dropout_generators(model) -> List[tf.random.Generator]:
    """The random generators of every layer of `model` (nested ones included), in layer order."""
    generators = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if generator is not None:
            generators.append(generator)
    return generators


def reseed_epoch(models, seed: int) -> None:
    """Make an epoch's randomness a function of `seed` alone: the Python and NumPy seeds, and each
    dropout generator of `models` (generator i gets its own stream)."""
    # Not tf.random.set_seed: in eager mode it clears the kernel cache, so every compiled
    # tf.function is instantiated and optimised again at its next call (1-3 s per function per
    # epoch), and legacy stateful random ops restart their streams (the same masks every epoch).
    random.seed(seed)
    np.random.seed(seed)
    generators = [g for model in models for g in dropout_generators(model)]
    for index, generator in enumerate(generators):
        generator.reset_from_seed(epoch_seed(seed, index))


def weight_variables(model) -> list:
    """The variables whose values are `model.get_weights()`, in its order: `model.weight_variables()` where a step
    defines it (a multi-grained step adds its uncertainty weights to its student's), else `model.weights`."""
    own = getattr(model, "weight_variables", None)
    return list(own()) if callable(own) else list(model.weights)


class WeightsSlot(tf.Module):
    """A checkpointable copy of a model's weights (the best-so-far weights of a loop), copied variable to variable
    (`weight_variables`): no array copy of a base-sized teacher's 0.4 GiB in between, which would raise the step's
    peak memory by as much at every new best epoch."""

    def __init__(self, model):
        super().__init__(name="best_weights")
        self.values = [tf.Variable(v.read_value(), trainable=False) for v in weight_variables(model)]

    def numpy(self) -> List[np.ndarray]:
        return [v.numpy() for v in self.values]

    def capture(self, model) -> "WeightsSlot":
        """Copy `model`'s weights in; this slot."""
        for slot, weight in zip(self.values, weight_variables(model), strict=True):
            slot.assign(weight.read_value())
        return self

    def restore_into(self, model) -> None:
        """Put the slot's weights back into `model`."""
        for weight, slot in zip(weight_variables(model), self.values, strict=True):
            weight.assign(slot.read_value())


class EpochCheckpoint:
    """A CheckpointManager over `directory` (None: a no-op, nothing saved or restored).

    `save(objects, position)` writes `objects` (name -> trackable: models, optimizers, WeightsSlots)
    and the JSON-able `position`; `position()` reads the latest position without restoring anything,
    so the caller can rebuild the objects that belong to it; `restore(objects)` then loads them.
    Only the latest checkpoint is kept; a save is complete or absent (the manager updates its
    index file after the data are written)."""

    def __init__(self, directory, keep: int = 1):
        self.directory = None if directory is None else Path(directory)
        self.keep = keep
        self._position = tf.Variable("", dtype=tf.string, trainable=False)

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def latest(self) -> Optional[str]:
        return tf.train.latest_checkpoint(str(self.directory)) if self.enabled and self.directory.exists() else None

    def position(self) -> Optional[dict]:
        path = self.latest()
        if path is None:
            return None
        return json.loads(tf.train.load_checkpoint(path).get_tensor(POSITION_KEY).decode())

    def restore(self, objects: Dict[str, object]) -> None:
        path = self.latest()
        # expect_partial: a checkpoint of a step boundary holds no optimizer.
        tf.train.Checkpoint(position=self._position, **objects).restore(path).expect_partial()
        log.info("resumed from %s at %s", path, self._position.numpy().decode())

    def save(self, objects: Dict[str, object], position: dict) -> None:
        if not self.enabled:
            return
        self._position.assign(json.dumps(position, sort_keys=True))
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(position=self._position, **objects),
                                             str(self.directory), max_to_keep=self.keep)
        manager.save(checkpoint_number=self._next_number(self.directory))

    @staticmethod
    def _next_number(directory: Path) -> int:
        # Every save gets a new name: a kill during a save leaves the previous checkpoint whole.
        latest = tf.train.latest_checkpoint(str(directory)) if directory.exists() else None
        return 1 + (int(latest.rsplit("-", 1)[1]) if latest else 0)

    def clear(self) -> None:
        """Remove the checkpoints once the loop's artifact is safely written."""
        if self.enabled:
            shutil.rmtree(self.directory, ignore_errors=True)


class SharedStages:
    """Checkpoints of a staged run at the end of its first stages, which a later run that begins with
    the same stages starts from instead of training them again (bin/ablate: D3.1, D3.2, D4.1 and
    D4.2 all begin with the representation stage, so it is trained once per seed and size).

    One checkpoint directory per prefix under `directory`, named by the hash of `key` (everything
    the run's result depends on except its stages: e.g. a student step's fingerprint less the
    strategy, seed included) and the prefix's stages (JSON-able descriptions). A run that takes a
    prefix continues from it as a killed run continues from its checkpoint at a stage boundary, so
    its student is the one it would have trained. Whoever makes them removes them."""

    def __init__(self, directory, key):
        self.directory, self.key = Path(directory), key

    def path(self, stages: Sequence) -> Path:
        blob = json.dumps({"key": self.key, "stages": list(stages)}, sort_keys=True, default=str).encode()
        return self.directory / hashlib.sha256(blob).hexdigest()[:16]

    def take(self, checkpoint: EpochCheckpoint, prefixes: Sequence[Sequence]) -> int:
        """Copy the first of `prefixes` (longest first) that has a checkpoint into `checkpoint`'s
        directory, which must hold none; returns its number of stages (0: none was there)."""
        if not checkpoint.enabled or checkpoint.latest():
            return 0
        for stages in prefixes:
            source = self.path(stages)
            if EpochCheckpoint(source).latest():
                shutil.rmtree(checkpoint.directory, ignore_errors=True)
                shutil.copytree(source, checkpoint.directory)
                return len(stages)
        return 0

    def keep(self, checkpoint: EpochCheckpoint, stages: Sequence) -> None:
        """Copy `checkpoint` (saved at the end of `stages`) as that prefix, unless it is kept already;
        whole or absent (copied aside, then renamed)."""
        target = self.path(stages)
        if not checkpoint.latest() or EpochCheckpoint(target).latest():
            return
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(checkpoint.directory, partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
