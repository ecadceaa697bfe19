"""Batches of windows of similar length, for the training loops (teacher fine-tuning and the student's stages).

A batch is trimmed to its longest window, so a batch of one long and 31 short windows costs what 32 long
ones do. `group_by_length` takes `group` batches' worth of already shuffled windows at a time, sorts them
by real length and cuts them into batches, then shuffles those batches within a buffer of `group`: each
batch holds windows of similar length, the order of batches stays random, and every window is still
seen once per epoch. It changes which windows share a batch, so a run with it is not the same run as
one without (bin/train --group_by_length; the teacher-output cache groups its inference batches by
length always, with the same outputs: transfer/cache.write_sharded's `lengths`).
"""
from __future__ import annotations

from typing import Mapping, Optional

import tensorflow as tf

from xtremedistil_tf.errors import ConfigError


def group_by_length(ds: tf.data.Dataset, batch_size: int, group: int, seed: int = 0, reshuffle: bool = True,
                    padding: Optional[Mapping] = None, length_key: str = "attention_mask") -> tf.data.Dataset:
    """Per-example dicts (shuffled beforehand) -> batches of `batch_size`, each of `group` x batch_size
    consecutive examples sorted by the number of nonzeros of `length_key` (stable) and cut into batches,
    the batches shuffled in a buffer of `group` (seeded; anew each iteration when `reshuffle`). Sequence
    keys are padded to the group's longest example with `padding`'s value per key (default 0); trim each
    batch to its own longest afterwards (teachers.finetune.trim_to_longest)."""
    if group < 1 or batch_size < 1:
        raise ConfigError(f"group_by_length needs group >= 1 and batch_size >= 1, got {group} and {batch_size}")
    padding = dict(padding or {})
    values = {k: tf.cast(padding.get(k, 0), spec.dtype) for k, spec in ds.element_spec.items()}
    groups = ds.padded_batch(group * batch_size, padding_values=values)

    def sorted_batches(examples):
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(examples[length_key], 0), tf.int32), axis=1)
        order = tf.argsort(lengths, stable=True)
        return tf.data.Dataset.from_tensor_slices({k: tf.gather(v, order) for k, v in examples.items()}
                                                  ).batch(batch_size)

    return groups.flat_map(sorted_batches).shuffle(group, seed=seed, reshuffle_each_iteration=reshuffle)
