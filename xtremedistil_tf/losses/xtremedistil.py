"""XtremeDistil's three losses as plain tensor functions `loss(prediction, target, mask)`, each a
masked mean over positions (losses/registry.py lists them with their equations).

Shapes: leading dims `[...]` are [B, T] for token tagging and [B] for sentence classification;
`mask [...]` is 1 where a position counts (real tokens: attention_mask; for CE also label != PAD)
and 0 elsewhere, so padding never changes a loss. Every loss is a mean over counted positions,
which keeps its scale independent of batch size and sentence length.

- `cross_entropy`:    L_CE (Eq. 2), hard labels, from the softmax head's pre-softmax scores.
- `mse`:              squared error averaged over the last axis. `logit_mse`: L_LL (Eq. 4) to the
                      teacher's logits, mean over the tags (the authors' code compiles Keras' 'mse';
                      Eq. 4's 1/2 and sum only rescale). `representation_mse`: L_RL (Eq. 6) as MSE.
- `representation_kld`: L_RL (Eq. 6) between the GELU-projected student states and the teacher's
                      layer-l hidden states, as the paper writes it.

Default representation loss: MSE (`DEFAULT_REPRESENTATION_LOSS`). The paper's text says KLD, but
the authors' released code (XtremeDistil-v2 `models.compile_model`) trains stage 1 with 'mse', and
KLD over a softmax of the hidden dimension throws information away: it is blind to a per-token
shift of all dims and, as BERT hidden states have a few large-magnitude outlier dims, the teacher's
softmax is close to one-hot on those, so most dims get almost no gradient. MSE matches every dim
and its scale, which is what the later stages read through the projection. KLD is available with
`representation_loss="kld"`.
"""
from __future__ import annotations

import tensorflow as tf

from xtremedistil_tf.losses.reduce import masked_mean

DEFAULT_REPRESENTATION_LOSS = "mse"

# The teacher-output cache's per-piece mask of the positions a teacher's logits were trained on
# (present when the teacher learned each word's first piece only: transfer/outputs.py).
TEACHER_MASK = "teacher_mask"


def label_mask(label_ids: tf.Tensor, attention_mask: tf.Tensor, pad_id: int) -> tf.Tensor:
    """float mask [...]: real positions with a label (CLS, SEP and X count; PAD-tagged ones,
    i.e. padding and unlabeled transfer sentences, do not)."""
    return tf.cast(attention_mask, tf.float32) * tf.cast(tf.not_equal(label_ids, pad_id), tf.float32)


def teacher_mask(batch, attention_mask: tf.Tensor) -> tf.Tensor:
    """float mask [...]: the real positions where the teacher's cached logits are a target: all of
    them, or only the first pieces when the cache has a `teacher_mask`."""
    mask = tf.cast(attention_mask, tf.float32)
    return mask * tf.cast(batch[TEACHER_MASK], tf.float32) if TEACHER_MASK in batch else mask


def cross_entropy(scores: tf.Tensor, label_ids: tf.Tensor, mask: tf.Tensor = None) -> tf.Tensor:
    """Hard-label CE: scores [..., N] pre-softmax (W^s h), label_ids [...] int, mask [...] (None: every
    position) -> scalar."""
    scores = tf.cast(scores, tf.float32)
    # Masked positions may hold ids outside [0, N) (e.g. -1 padding); clip so the op stays valid.
    safe = tf.clip_by_value(tf.cast(label_ids, tf.int32), 0, tf.shape(scores)[-1] - 1)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=safe, logits=scores)
    return masked_mean(losses, mask)


def mse(prediction: tf.Tensor, target: tf.Tensor, mask: tf.Tensor = None) -> tf.Tensor:
    """Mean over counted positions of mean_d (p_d - t_d)^2: [..., D] twice, mask [...] -> scalar. Logit
    regression (r^s vs the teacher's logits), representation MSE (projected student vs teacher hidden)."""
    diff = tf.cast(prediction, tf.float32) - tf.cast(target, tf.float32)
    return masked_mean(tf.reduce_mean(tf.square(diff), axis=-1), mask)


logit_mse = representation_mse = mse


def softmax_kl(student: tf.Tensor, teacher: tf.Tensor, mask: tf.Tensor = None) -> tf.Tensor:
    """KL(softmax(teacher) || softmax(student)) over the last dim, mean over counted positions: [..., D] twice, mask
    [...] -> scalar. The representation KLD as in the paper (over the hidden dim, Eq. 6), and soft targets (Hinton
    et al., 2015, temperature 1: over the tags, the student's pre-softmax scores against the teacher's logits; its
    gradient is that of the cross-entropy against the teacher's distribution, and it is 0 where they agree)."""
    log_s = tf.nn.log_softmax(tf.cast(student, tf.float32), axis=-1)
    log_t = tf.nn.log_softmax(tf.cast(teacher, tf.float32), axis=-1)
    kl = tf.reduce_sum(tf.exp(log_t) * (log_t - log_s), axis=-1)
    return masked_mean(kl, mask)


representation_kld = soft_target_kl = softmax_kl
