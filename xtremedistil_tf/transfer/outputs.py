"""The teacher's outputs over a transfer set, computed once and cached as TFRecord shards.

Per example (one encoded window): `input_ids`, `attention_mask`, `label_ids` [T] int32 (PAD tag
ids for unlabeled sentences), `logits` [T, N] float32 and `hidden` [T, H], the teacher's
hidden_states[layer] (stored as float16 by default: half the disk, and a student regressing
onto it does not need more precision; int8 with a scale per position, `--cache_hidden_dtype`).
Every window is stored at its real length T (not padded to max_seq_length); `hidden` only when
the students read it (`hidden=False` leaves it out), `logits` optionally as the top K per position
(`--cache_logits_topk`, `logits_topk`): docs/cache.md says which losses allow it.

A teacher fine-tuned on each word's first piece only (`first_piece` supervision, and most
`*ForTokenClassification` checkpoints of the hub) never learned what to say at continuation
pieces, [CLS] and [SEP]; its cache then also holds `teacher_mask` [T] int32, 1 at the first
pieces, and the student's logit loss and teacher-argmax labels count only those positions.
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.alignment import Windows
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses.xtremedistil import TEACHER_MASK
from xtremedistil_tf.transfer.cache import INT8, TOPK, pad_values_of, write_sharded

HIDDEN_DTYPES = ("float16", "float32", INT8)   # --cache_hidden_dtype
# The keys of a window cache with a sequence axis (stored at the window's real length), and that axis.
SEQUENCE_AXES = {"input_ids": 0, "attention_mask": 0, "label_ids": 0, "logits": 0, "hidden": 0, TEACHER_MASK: 0,
                 "marginals": 0, "kbest_tags": 1}


def storage(hidden_dtype: str = "float16", logits_topk: int = 0) -> dict:
    """write_sharded's `dtypes` and `encodings` for `hidden` and `logits`: hidden as float16,
    float32 or int8 (one scale per position), logits whole (`logits_topk` 0) or their top K."""
    if hidden_dtype not in HIDDEN_DTYPES:
        raise ConfigError(f"--cache_hidden_dtype={hidden_dtype}; expected one of {', '.join(HIDDEN_DTYPES)}")
    if int(logits_topk) < 0:
        raise ConfigError(f"--cache_logits_topk={logits_topk}; expected 0 (every logit) or K >= 1")
    encodings = {"hidden": INT8} if hidden_dtype == INT8 else {}
    if logits_topk:
        encodings["logits"] = f"{TOPK}{int(logits_topk)}"
    return {"dtypes": {} if hidden_dtype == INT8 else {"hidden": hidden_dtype}, "encodings": encodings}


def window_layout(windows: Windows, keys: Sequence[str], hidden_dtype: str = "float16", logits_topk: int = 0) -> dict:
    """write_sharded's layout arguments for a cache of `keys` over `windows`: each key at the window's
    real length, padding ids and tags as `windows` pads them, `storage` for hidden and logits."""
    layout = storage(hidden_dtype, logits_topk)
    layout["dtypes"] = {k: v for k, v in layout["dtypes"].items() if k in keys}
    layout["encodings"] = {k: v for k, v in layout["encodings"].items() if k in keys}
    layout["ragged"] = {k: axis for k, axis in SEQUENCE_AXES.items() if k in keys}
    layout["pad_values"] = pad_values_of({"input_ids": windows.input_ids, "label_ids": windows.label_ids},
                                         windows.attention_mask)
    return layout


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


def compute_window_outputs(run, windows: Windows, rows: np.ndarray,
                           first_pieces: bool = False) -> Dict[str, np.ndarray]:
    """Teacher outputs for the windows `rows` (indices), computed on the batch's real length and
    padded back to max_seq_length (padding positions hold zeros); with `first_pieces`, also
    `teacher_mask` (1 at each word's first piece: what a first-piece teacher was trained on)."""
    ids = windows.input_ids[rows]
    mask = windows.attention_mask[rows]
    length = max(1, int(mask.sum(1).max()))
    logits, hidden = run(tf.constant(ids[:, :length]), tf.constant(mask[:, :length]))
    pad = ((0, 0), (0, ids.shape[1] - length), (0, 0))
    # Zero the padding so cached values do not depend on which windows shared a batch.
    real = mask[:, :length, None].astype(np.float32)
    out = {"input_ids": ids, "attention_mask": mask, "label_ids": windows.label_ids[rows],
           "logits": np.pad(logits.numpy() * real, pad), "hidden": np.pad(hidden.numpy() * real, pad)}
    if first_pieces:
        out[TEACHER_MASK] = (windows.word_index[rows] >= 0).astype(np.int32)
    return out


def write_teacher_outputs(teacher, windows: Windows, out_dir, layer: int, fingerprint: dict, *,
                          shard_size: int = 1000, batch_size: int = 64,
                          hidden_dtype: str = "float16", progress: bool = True,
                          overwrite: bool = False, distribution=None, first_pieces: bool = False,
                          hidden: bool = True, logits_topk: int = 0, group_by_length: bool = True) -> dict:
    """Run the teacher over every window and cache the outputs; resumes a killed run.
    `group_by_length`: batch each shard's windows by length (`write_sharded`'s `lengths`; the same
    outputs, to float rounding, for a fraction of the padding work: docs/benchmarks.md 4.1).
    `first_pieces`: the teacher was trained on first pieces only (adds `teacher_mask`).
    `hidden`: store the hidden states (False when no student loss reads them); `hidden_dtype`,
    `logits_topk`: how hidden states and logits are stored (`storage`).

    Returns the cache manifest. `fingerprint` must identify the teacher, the data and the
    settings, so that a cache made by another configuration is never reused.
    """
    run = teacher_outputs_fn(teacher, layer, distribution)
    keys = ["input_ids", "attention_mask", "label_ids", "logits", *(["hidden"] if hidden else []),
            *([TEACHER_MASK] if first_pieces else [])]

    def compute(rows: np.ndarray) -> Dict[str, np.ndarray]:
        return {k: v for k, v in compute_window_outputs(run, windows, rows, first_pieces).items() if k in keys}

    return write_sharded(out_dir, len(windows), compute, shard_size=shard_size, batch_size=batch_size,
                         fingerprint=fingerprint, progress=progress, overwrite=overwrite,
                         lengths=window_lengths(windows) if group_by_length else None,
                         **window_layout(windows, keys, hidden_dtype, logits_topk))


def window_lengths(windows: Windows) -> np.ndarray:
    """Each window's real length in pieces (what a batch is trimmed to)."""
    return np.asarray(windows.attention_mask).sum(1)
