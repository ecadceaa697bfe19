"""k-best surrogate label sequences of a CRF teacher, as per-window arrays for the cache.

For each window the teacher's k best paths (k-best Viterbi, the paper's Algorithm 1), their
probabilities under the teacher CRF, the mass left outside them, and the teacher's token
marginals (for L_Token-pos). Computed once with the other teacher outputs, so the student's
sequence losses (`losses/sequence.py`) never run the teacher.

Per window (numpy, ready to merge into the dict `compute_batch` returns to `write_sharded`):
    kbest_tags  [K, T] int32   best first; 0 past the length and in invalid slots
    kbest_probs [K]    float32 exp(log-prob), 0 for invalid slots
    kbest_valid [K]    bool    False where the window has fewer than K allowed labelings
    residual    []     float32 1 - sum(kbest_probs), clipped at 0 (rounding can push it below)
    marginals   [T, N] float32 p(y_t = j | x); 0 past the length
kbest_tags fits `uint8` storage (pass dtypes={"kbest_tags": "uint8"} to the cache) when N <= 255.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf import ops

SurrogateFn = Callable[[np.ndarray, np.ndarray, np.ndarray], Dict[str, np.ndarray]]


def kbest_surrogates(potentials, transitions, lengths, k: int) -> Dict[str, tf.Tensor]:
    """Surrogates of a batch as tensors (see the module docstring, with a leading B).

    potentials [B, T, N] (boundary constraints already applied), transitions [N, N] (forbidden
    moves at -1e4), lengths [B], k a Python int.
    """
    tags, _, log_probs, valid = ops.crf_kbest_decode(potentials, transitions, lengths, k)
    # where() first: exp of the -inf log-probs of invalid slots is 0 anyway, but keep it explicit.
    probs = tf.where(valid, tf.exp(tf.where(valid, log_probs, 0.0)), 0.0)
    residual = tf.maximum(1.0 - tf.reduce_sum(probs, axis=1), 0.0)
    return {"kbest_tags": tags, "kbest_probs": probs, "kbest_valid": valid, "residual": residual,
            "marginals": ops.crf_marginals(potentials, lengths, transitions)}


def make_surrogate_fn(k: int, start_allowed: Optional[np.ndarray] = None,
                      end_allowed: Optional[np.ndarray] = None) -> SurrogateFn:
    """A compiled `(logits [B, T, N], transitions [N, N], lengths [B]) -> {key: numpy}`.

    `logits` are the teacher's raw emission scores, as the cache stores them (zeros past the
    length); the CRF layer's start/end constraints ([N] bool masks, e.g. only [CLS] may start a
    window) are applied here, as `CRF.call` applies them, so the paths are the teacher CRF's own.
    Traced once for any B and T.
    """
    num_tags = None if start_allowed is None else len(start_allowed)

    @tf.function(input_signature=[tf.TensorSpec([None, None, num_tags], tf.float32),
                                  tf.TensorSpec([num_tags, num_tags], tf.float32),
                                  tf.TensorSpec([None], tf.int32)])
    def run(logits, transitions, lengths):
        potentials = ops.apply_boundary_constraints(logits, lengths, start_allowed, end_allowed)
        return kbest_surrogates(potentials, transitions, lengths, k)

    def surrogates(logits, transitions, lengths):
        out = run(tf.convert_to_tensor(logits, tf.float32), tf.convert_to_tensor(transitions, tf.float32),
                  tf.convert_to_tensor(lengths, tf.int32))
        return {key: value.numpy() for key, value in out.items()}

    return surrogates
