"""Sequence-level and token-level distillation losses for a CRF student (multi-grained KD,
Zhou et al., NAACL 2021), as plain tensor functions.

Every loss is called `loss(prediction, target, mask)` (losses/registry.py): `prediction` is the
student's (potentials [B, T, N], transitions [N, N]) pair (its unary CRF scores with the boundary
constraints applied, as `CRF.call` returns them, and its transition matrix with forbidden moves at
-1e4), or its emissions [B, T, N] for `token_emission_kd`; `mask` [B, T] marks the real tokens of the
counted rows (each row's length is its sum: rows are left-aligned). Teacher surrogates come from the
cache (`teachers/surrogates.py`): `kbest_tags` [B, K, T], `kbest_probs` [B, K] and `kbest_valid` [B, K].

Every loss is a scalar mean over the counted rows (sequence losses) or over real tokens (token
losses), float32, finite for any finite inputs, and runs inside `tf.function` with unknown B, T.

- `hard_loss`:          L_hard (Eq. 7), -log P_s(y_hard).
- `kbest_seq_ce`:       L_Seq-ce (Eq. 4-5), k-best CE plus the residual-mass term.
- `fuzzy_loss`:         L_Seq-fuzzy (Eq. 6), binary CE on the top-K mass. Eq. 3's fuzzy-CRF
                        probability of the candidate set, with the k-best paths as the set, *is*
                        p^s_sum, so Eq. 3 and Eq. 6 describe the same quantity.
- `token_emission_kd`:  L_Token-em (Eq. 10 with softmaxed emissions).
- `token_posterior_kd`: L_Token-pos (Eq. 10 with CRF marginals).

The token losses are Eq. 10's cross-entropy -(1/N) sum_i sum_c P^t_c log P^s_c over the N real
tokens by default (`token_loss="ce"`); `token_loss="kl"` subtracts the teacher's entropy, which
gives the same gradient for the student but not the same value. The value matters under
uncertainty weighting (Eq. 9): lambda* = 1/(2 L) depends on L, and as the KL goes to 0 (the
student matches the teacher) lambda grows without bound and -1/2 log lambda makes the objective
unbounded below; the CE stays above the teacher's entropy. docs/multigrained.md.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf import ops
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses.reduce import masked_mean, row_mask

# p^s_sum is clipped to at most 1 - RESIDUAL_EPS before log(1 - p^s_sum): the student may put
# (numerically) all its mass on the k paths, and the gradient of log(1 - p) blows up as p -> 1.
RESIDUAL_EPS = 1e-6
# Floor for the student's token marginals before the log: a tag the student's constraints
# forbid has marginal exactly 0; the teacher's marginal there is 0 too unless the constraints differ.
_MARGINAL_FLOOR = 1e-30
# Token losses (Eq. 10): the cross-entropy the paper writes (default), or the KL, which is the
# cross-entropy minus the teacher's entropy.
TOKEN_LOSSES = ("ce", "kl")
DEFAULT_TOKEN_LOSS = "ce"


def _crf(prediction, mask):
    """(potentials, transitions, lengths [B] int32) of a CRF prediction over `mask` [B, T]."""
    potentials, transitions = prediction
    return potentials, transitions, tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)


def labeled_rows(label_ids, attention_mask, pad_id: int):
    """[B] bool: rows whose real positions all carry a tag other than [PAD]."""
    real = tf.cast(attention_mask, tf.bool)
    return tf.reduce_all(tf.not_equal(label_ids, pad_id) | ~real, axis=1)


def hard_targets(label_ids, attention_mask, kbest_tags, pad_id: int):
    """[B, T] tags for L_hard: the gold `label_ids` of labeled rows, the teacher's top-1 path
    `kbest_tags[:, 0]` of unlabeled rows (those with [PAD] tags inside their length)."""
    labeled = labeled_rows(label_ids, attention_mask, pad_id)
    return tf.where(labeled[:, None], tf.cast(label_ids, tf.int32), tf.cast(kbest_tags[:, 0], tf.int32))


def check_token_loss(name: str) -> str:
    """`name` if it is one of TOKEN_LOSSES; ConfigError naming --token_loss otherwise."""
    if name not in TOKEN_LOSSES:
        raise ConfigError(f"--token_loss={name!r}; expected ce (Eq. 10's cross-entropy) or kl")
    return name


def _token_loss(p_teacher, log_p_student, mask, token_loss: str):
    """Eq. 10 over real tokens: -sum_c p_t log p_s per token ("ce"), minus the teacher's entropy
    for "kl", then the mean over mask [B, T]. p_teacher, log_p_student [B, T, N]."""
    per_token = -tf.reduce_sum(p_teacher * log_p_student, axis=-1)
    if check_token_loss(token_loss) == "kl":
        per_token += tf.reduce_sum(tf.math.xlogy(p_teacher, p_teacher), axis=-1)
    return masked_mean(per_token, mask)


def hard_loss(prediction, tags, mask):
    """L_hard (Eq. 7): mean CRF NLL of `tags` [B, T] (the gold sequence for labeled data, the
    teacher's top-1 path, `kbest_tags[:, 0]`, for unlabeled data) over the rows with a counted
    position. Returns a scalar."""
    potentials, transitions, lengths = _crf(prediction, mask)
    return ops.crf_nll_loss(potentials, tags, lengths, transitions, rows=row_mask(mask))


def kbest_student_log_probs(student_potentials, lengths, transitions, kbest_tags):
    """log P_s(y_k | x) of each of the teacher's k-best paths under the student CRF.

    student_potentials [B, T, N], lengths [B], transitions [N, N], kbest_tags [B, K, T] int.
    Returns [B, K] float32 (invalid slots hold the log-prob of whatever tags they contain;
    callers mask them with `valid`).
    """
    potentials = tf.cast(student_potentials, tf.float32)
    kbest_tags = tf.convert_to_tensor(kbest_tags)
    batch, num_paths, num_steps = tf.unstack(tf.shape(kbest_tags))
    # Score all B*K paths in one call: repeat each sequence's potentials and length K times.
    # (An explicit shape: [-1, T] is ambiguous for an empty batch with T = 0.)
    flat_tags = tf.reshape(kbest_tags, [batch * num_paths, num_steps])
    flat_potentials = tf.repeat(potentials, num_paths, axis=0)
    flat_lengths = tf.repeat(tf.cast(lengths, tf.int32), num_paths, axis=0)
    scores = ops.crf_sequence_score(flat_potentials, flat_tags, flat_lengths, transitions)
    log_z = ops.crf_log_norm(potentials, lengths, transitions)
    return tf.reshape(scores, [batch, num_paths]) - log_z[:, None]


def _student_log_mass(log_probs, valid):
    """log p^s_sum [B]: log-sum-exp of the valid slots' log-probs (-1e30 if none is valid)."""
    masked = tf.where(tf.cast(valid, tf.bool), log_probs, -1e30)
    return tf.reduce_logsumexp(masked, axis=1)


def _log1m_exp(log_p):
    """log(1 - exp(log_p)) for log_p <= 0, with p clipped to at most 1 - RESIDUAL_EPS.

    Two branches for accuracy (Maechler 2012): -expm1 near p = 1, log1p(-p) for small p.
    Both branches see only the clipped value, so neither produces inf/NaN gradients.
    """
    log_p = tf.minimum(log_p, float(np.log1p(-RESIDUAL_EPS)))
    return tf.where(log_p > -np.log(2.0), tf.math.log(-tf.math.expm1(log_p)),
                    tf.math.log1p(-tf.exp(log_p)))


def _kbest(prediction, target, mask):
    """(log p^s_k [B, K], p^t_k [B, K] with invalid slots zeroed, p^t_sum [B], valid [B, K] bool)."""
    potentials, transitions, lengths = _crf(prediction, mask)
    kbest_tags, teacher_probs, valid = target
    valid = tf.cast(valid, tf.bool)
    probs = tf.where(valid, tf.cast(teacher_probs, tf.float32), 0.0)
    mass = tf.clip_by_value(tf.reduce_sum(probs, axis=1), 0.0, 1.0)
    return kbest_student_log_probs(potentials, lengths, transitions, kbest_tags), probs, mass, valid


def kbest_seq_ce(prediction, target, mask):
    """L_Seq-ce (Eq. 4-5), mean over the rows:

        -sum_k p^t_k log p^s_k - (1 - p^t_sum) log(1 - p^s_sum)

    with p^t_k the teacher's probability of its k-th best path y_k, p^s_k = P_s(y_k | x), and
    p_sum the sums over the valid slots. The second term keeps the mass of the paths outside
    the top K, which the paper shows is far from negligible (its Fig. 1b).

    prediction (potentials [B, T, N], transitions [N, N]), target (kbest_tags [B, K, T] int,
    kbest_probs [B, K], kbest_valid [B, K] bool), mask [B, T]. Returns a scalar.
    """
    log_probs, probs_t, mass_t, valid = _kbest(prediction, target, mask)
    fine = -tf.reduce_sum(probs_t * tf.where(valid, log_probs, 0.0), axis=1)
    residual = -(1.0 - mass_t) * _log1m_exp(_student_log_mass(log_probs, valid))
    return masked_mean(fine + residual, row_mask(mask))


def fuzzy_loss(prediction, target, mask):
    """L_Seq-fuzzy (Eq. 6), mean over the rows:

        -p^t_sum log p^s_sum - (1 - p^t_sum) log(1 - p^s_sum)

    p^s_sum = sum_k P_s(y_k | x) is Eq. 3's fuzzy-CRF likelihood of the candidate set
    {y_1..y_K}: the paths themselves, not the product set of their per-position tags that
    a multitag CRF score (tfa's `crf_multitag_sequence_score`) would score. Arguments as in `kbest_seq_ce`.
    """
    log_probs, _, mass_t, valid = _kbest(prediction, target, mask)
    log_mass_s = _student_log_mass(log_probs, valid)
    return masked_mean(-mass_t * log_mass_s - (1.0 - mass_t) * _log1m_exp(log_mass_s), row_mask(mask))


def token_emission_kd(prediction, target, mask, temperature=1.0, token_loss=DEFAULT_TOKEN_LOSS):
    """L_Token-em (Eq. 10): CE(softmax(t / tau), softmax(s / tau)) per token, masked mean
    ("kl": KL(softmax(t / tau) || softmax(s / tau)), 0 at a perfect match).

    prediction, target: the student's and the teacher's emissions [B, T, N] (per-position logits, no
    transitions); mask [B, T] (1 for the tokens that count). Not scaled by tau^2.
    """
    student = tf.cast(prediction, tf.float32) / temperature
    teacher = tf.cast(target, tf.float32) / temperature
    return _token_loss(tf.nn.softmax(teacher, axis=-1), tf.nn.log_softmax(student, axis=-1), mask, token_loss)


def token_posterior_kd(prediction, target, mask, token_loss=DEFAULT_TOKEN_LOSS):
    """L_Token-pos (Eq. 10 with CRF posteriors): CE(q_t, q_s) per real token ("kl": KL(q_t || q_s)),
    mean over tokens.

    q_s = crf_marginals of the student's (potentials, transitions) `prediction` [B, T, N] (forward-
    backward, so the student's transitions get gradient too); `target`: the teacher's marginals
    [B, T, N] (cached by `teachers/surrogates.py`). Positions at or past a row's length count not.
    """
    potentials, transitions, lengths = _crf(prediction, mask)
    q_student = ops.crf_marginals(potentials, lengths, transitions)
    log_q_student = tf.math.log(tf.maximum(q_student, _MARGINAL_FLOOR))
    mask = tf.sequence_mask(lengths, tf.shape(q_student)[1], dtype=tf.float32)
    return _token_loss(tf.cast(target, tf.float32), log_q_student, mask, token_loss)
