"""Teacher outputs for multi-grained KD: the XtremeDistil cache (`transfer/outputs.py`) plus the
CRF teacher's k-best surrogates (`teachers/surrogates.py`), computed in the same pass and written
to the same sharded cache.

Per example, on top of `compute_window_outputs`' input_ids, attention_mask, label_ids, logits,
hidden (computed padded to max_seq_length, zeros past the length; stored at the window's real
length, and hidden only with `hidden=True`: no multi-grained loss reads it):
    kbest_tags  [K, T] uint8 (int32 when there are more than 255 tags), best first
    kbest_probs [K]    float32
    kbest_valid [K]    bool
    residual    []     float32
    marginals   [T, N] float32
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from xtremedistil_tf.data.alignment import Windows
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.transfer.cache import write_sharded
from xtremedistil_tf.teachers.crf_head import CRFTokenTeacher
from xtremedistil_tf.transfer.outputs import compute_window_outputs, teacher_outputs_fn, window_layout, window_lengths
from xtremedistil_tf.teachers.surrogates import SurrogateFn

MAX_KBEST = 15  # the paper's sweep (Fig. 4) goes up to K=15


def check_kbest(k: int) -> int:
    """`--kbest` as an int in [1, MAX_KBEST]."""
    if not 1 <= int(k) <= MAX_KBEST:
        raise ConfigError(f"--kbest={k} must be between 1 and {MAX_KBEST}")
    return int(k)


def kbest_dtype(num_tags: int) -> str:
    """Storage dtype of kbest_tags: a byte per tag id while the ids fit."""
    return "uint8" if num_tags <= 256 else "int32"


def add_surrogates(outputs: Dict[str, np.ndarray], surrogates: SurrogateFn,
                   transitions: np.ndarray) -> Dict[str, np.ndarray]:
    """`compute_window_outputs`' dict plus the surrogates of its logits, padded to its length.

    outputs: logits [B, L, N] (zeros past each length), attention_mask [B, L]. The surrogates are
    computed on the batch's real length only (k-best Viterbi over padding is wasted work) and
    padded back with zeros, so cached values do not depend on which windows shared a batch.
    """
    mask = outputs["attention_mask"]
    lengths = mask.sum(1).astype(np.int32)
    # At least 2 steps: every window is [CLS] ... [SEP], and the CRF scans need a step.
    length = max(2, int(lengths.max()))
    extra = surrogates(outputs["logits"][:, :length], transitions, lengths)
    pad = mask.shape[1] - length
    extra["kbest_tags"] = np.pad(extra["kbest_tags"], ((0, 0), (0, 0), (0, pad)))
    extra["marginals"] = np.pad(extra["marginals"], ((0, 0), (0, pad), (0, 0)))
    return {**outputs, **extra}


def write_multigrained_outputs(teacher: CRFTokenTeacher, windows: Windows, out_dir, k: int, fingerprint: dict, *,
                               layer: Optional[int] = None, shard_size: int = 1000, batch_size: int = 64,
                               hidden_dtype: str = "float16", progress: bool = True,
                               overwrite: bool = False, distribution=None, hidden: bool = False,
                               logits_topk: int = 0) -> dict:
    """Run the CRF teacher over every window and cache its outputs and k-best surrogates.

    `layer`: the hidden_states index cached as `hidden` (default: the last layer). `k` (1..15) is
    added to the fingerprint, so a cache made with another K is never reused. Resumes a killed
    run like `write_teacher_outputs`; returns the manifest. `hidden`, `hidden_dtype`, `logits_topk`:
    as `write_teacher_outputs` (the surrogates are computed from the full logits either way).
    """
    if not isinstance(teacher, CRFTokenTeacher):
        raise ConfigError(f"multi-grained surrogates need a CRF teacher; got {type(teacher).__name__} "
                          "(train the teacher with the crf head)")
    k = check_kbest(k)
    run = teacher_outputs_fn(teacher, teacher.num_layers if layer is None else layer, distribution)
    surrogates = teacher.surrogate_fn(k)
    transitions = teacher.transitions.numpy()

    def compute_batch(rows):
        outputs = add_surrogates(compute_window_outputs(run, windows, rows), surrogates, transitions)
        return outputs if hidden else {key: v for key, v in outputs.items() if key != "hidden"}

    keys = ["input_ids", "attention_mask", "label_ids", "logits", "kbest_tags", "marginals",
            *(["hidden"] if hidden else [])]
    layout = window_layout(windows, keys, hidden_dtype, logits_topk)
    layout["dtypes"]["kbest_tags"] = kbest_dtype(len(teacher.tag_vocab))
    return write_sharded(out_dir, len(windows), compute_batch, shard_size=shard_size, batch_size=batch_size,
                         fingerprint={**fingerprint, "kbest": k}, progress=progress, overwrite=overwrite,
                         lengths=window_lengths(windows), **layout)
