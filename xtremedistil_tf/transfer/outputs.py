"""The teacher's outputs over a transfer set, computed once and cached as TFRecord shards.

Per example (one encoded window): `input_ids`, `attention_mask`, `label_ids` [T] int32 (PAD tag
ids for unlabeled sentences), `logits` [T, N] float32 and `hidden` [T, H], the teacher's
hidden_states[layer] (stored as float16 by default: half the disk, and a student regressing
onto it does not need more precision).

A teacher fine-tuned on each word's first piece only (`first_piece` supervision, and most
`*ForTokenClassification` checkpoints of the hub) never learned what to say at continuation
pieces, [CLS] and [SEP]; its cache then also holds `teacher_mask` [T] int32, 1 at the first
pieces, and the student's logit loss and teacher-argmax labels count only those positions.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.alignment import Windows
from xtremedistil_tf.losses.xtremedistil import TEACHER_MASK
from xtremedistil_tf.transfer.cache import write_sharded


def teacher_outputs_fn(teacher, layer: int, distribution=None):
    """A compiled function from a batch of ids and mask to (logits, hidden_states[layer]).

    Under a tf.distribute strategy (the teacher built in its scope) each replica runs the teacher
    on its slice of the batch (padded with empty rows to a multiple of the replicas) and the
    slices are gathered back in order: every worker gets the whole batch's outputs."""
    spec = tf.TensorSpec([None, None], tf.int32)
    if distribution is not None:
        return _distributed_outputs_fn(teacher, layer, distribution)

    @tf.function(input_signature=[spec, spec])
    def run(input_ids, attention_mask):
        return teacher.call_with_hidden({"input_ids": input_ids, "attention_mask": attention_mask}, layer)

    return run


def _distributed_outputs_fn(teacher, layer: int, distribution):
    spec = tf.TensorSpec([None, None], tf.int32)
    replicas = distribution.num_replicas_in_sync

    def replica_slice(input_ids, attention_mask):
        per = tf.shape(input_ids)[0] // replicas
        start = tf.distribute.get_replica_context().replica_id_in_sync_group * per
        return teacher.call_with_hidden({"input_ids": input_ids[start:start + per],
                                         "attention_mask": attention_mask[start:start + per]}, layer)

    @tf.function(input_signature=[spec, spec])
    def run(input_ids, attention_mask):
        rows = tf.shape(input_ids)[0]
        pad = (-rows) % replicas
        input_ids, attention_mask = (tf.pad(x, [[0, pad], [0, 0]]) for x in (input_ids, attention_mask))
        logits, hidden = distribution.run(replica_slice, args=(input_ids, attention_mask))
        return (distribution.gather(logits, axis=0)[:rows], distribution.gather(hidden, axis=0)[:rows])

    return run


def compute_window_outputs(run, windows: Windows, start: int, end: int,
                           first_pieces: bool = False) -> Dict[str, np.ndarray]:
    """Teacher outputs for windows [start, end), computed on the batch's real length and
    padded back to max_seq_length (padding positions hold zeros); with `first_pieces`, also
    `teacher_mask` (1 at each word's first piece: what a first-piece teacher was trained on)."""
    ids = windows.input_ids[start:end]
    mask = windows.attention_mask[start:end]
    length = max(1, int(mask.sum(1).max()))
    logits, hidden = run(tf.constant(ids[:, :length]), tf.constant(mask[:, :length]))
    pad = ((0, 0), (0, ids.shape[1] - length), (0, 0))
    # Zero the padding so cached values do not depend on which windows shared a batch.
    real = mask[:, :length, None].astype(np.float32)
    out = {"input_ids": ids, "attention_mask": mask, "label_ids": windows.label_ids[start:end],
           "logits": np.pad(logits.numpy() * real, pad), "hidden": np.pad(hidden.numpy() * real, pad)}
    if first_pieces:
        out[TEACHER_MASK] = (windows.word_index[start:end] >= 0).astype(np.int32)
    return out


def write_teacher_outputs(teacher, windows: Windows, out_dir, layer: int, fingerprint: dict, *,
                          shard_size: int = 1000, batch_size: int = 64,
                          hidden_dtype: str = "float16", progress: bool = True,
                          overwrite: bool = False, distribution=None, first_pieces: bool = False) -> dict:
    """Run the teacher over every window and cache the outputs; resumes a killed run.
    `first_pieces`: the teacher was trained on first pieces only (adds `teacher_mask`).

    Returns the cache manifest. `fingerprint` must identify the teacher, the data and the
    settings, so that a cache made by another configuration is never reused.
    """
    run = teacher_outputs_fn(teacher, layer, distribution)
    return write_sharded(out_dir, len(windows), lambda s, e: compute_window_outputs(run, windows, s, e, first_pieces),
                         shard_size=shard_size, batch_size=batch_size, fingerprint=fingerprint,
                         dtypes={"hidden": hidden_dtype}, progress=progress, overwrite=overwrite)
