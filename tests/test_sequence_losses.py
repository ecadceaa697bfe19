"""Sequence and token KD losses against brute force over every label sequence (N=3, T=4)."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from xtremedistil_tf.crf import ops
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses import sequence as seq
from xtremedistil_tf.methods.multigrained import MultiGrainedConfig

N, T, K = 3, 4, 4
LENGTHS = np.array([4, 1, 3, 2], np.int32)  # length 1 has 3 < K paths: one slot invalid


def _crf(seed, scale):
    rng = np.random.default_rng(seed)
    pots = rng.normal(0, scale, (len(LENGTHS), T, N)).astype(np.float32)
    trans = rng.normal(0, 1.0, (N, N)).astype(np.float32)
    trans[0, 2] = ops.FORBIDDEN  # a scheme-style hard constraint
    return pots, trans


def _enumerate(pots, trans, length):
    """{path: probability} over all N**length paths, float64."""
    paths = list(itertools.product(range(N), repeat=length))
    scores = np.array([sum(pots[t, y] for t, y in enumerate(p)) + sum(trans[a, b] for a, b in zip(p, p[1:]))
                       for p in paths], np.float64)
    probs = np.exp(scores - scores.max())
    return dict(zip(paths, probs / probs.sum()))


def _teacher_kbest(pots, trans):
    """Brute-force top-K paths of each sequence: tags [B, K, T], probs [B, K], valid [B, K]."""
    tags = np.zeros((len(LENGTHS), K, T), np.int32)
    probs = np.zeros((len(LENGTHS), K), np.float32)
    valid = np.zeros((len(LENGTHS), K), bool)
    for b, length in enumerate(LENGTHS):
        dist = _enumerate(pots[b], trans, length)
        allowed = [(p, q) for p, q in dist.items() if q > 0]
        for k, (path, q) in enumerate(sorted(allowed, key=lambda item: -item[1])[:K]):
            tags[b, k, :length], probs[b, k], valid[b, k] = path, q, True
    return tags, probs, valid


@pytest.fixture(scope="module")
def case():
    s_pots, s_trans = _crf(0, scale=1.5)
    t_pots, t_trans = _crf(1, scale=0.7)  # a flat teacher: its top K leave real residual mass
    tags, probs, valid = _teacher_kbest(t_pots, t_trans)
    assert not valid[1, 3] and valid.sum() == 15
    student = [_enumerate(s_pots[b], s_trans, n) for b, n in enumerate(LENGTHS)]
    p_s = np.array([[student[b].get(tuple(tags[b, k, :n]), 0.0) if valid[b, k] else 0.0 for k in range(K)]
                    for b, n in enumerate(LENGTHS)])
    return dict(s_pots=s_pots, s_trans=s_trans, t_pots=t_pots, t_trans=t_trans, tags=tags, probs=probs,
                valid=valid, student=student, p_s=p_s)


def _mask(lengths, steps=T):
    """[B, steps] float32: 1 for the first `lengths[b]` positions of row b."""
    return tf.sequence_mask(lengths, steps, dtype=tf.float32)


def _args(c):
    """(prediction, target, mask) of the sequence losses."""
    return ((tf.constant(c["s_pots"]), tf.constant(c["s_trans"])), (c["tags"], c["probs"], c["valid"]), _mask(LENGTHS))


def test_student_log_probs_of_kbest_paths(case):
    log_probs = seq.kbest_student_log_probs(case["s_pots"], LENGTHS, case["s_trans"], case["tags"]).numpy()
    np.testing.assert_allclose(np.exp(log_probs)[case["valid"]], case["p_s"][case["valid"]], rtol=1e-4)


def test_kbest_seq_ce_matches_brute_force_with_residual_term(case):
    p_t, p_s, valid = case["probs"].astype(np.float64), case["p_s"], case["valid"]
    fine = -np.sum(np.where(valid, p_t * np.log(np.where(valid, p_s, 1.0)), 0.0), axis=1)
    residual = -(1 - p_t.sum(1)) * np.log(1 - p_s.sum(1))
    assert residual.max() > 0.1, "the residual term must matter in this case"
    got = seq.kbest_seq_ce(*_args(case)).numpy()
    np.testing.assert_allclose(got, np.mean(fine + residual), rtol=1e-4)
    # Dropping the residual term (Kim and Rush; Wang et al.) would give a different value.
    assert abs(got - np.mean(fine)) > 1e-3


def test_fuzzy_is_binary_ce_on_the_top_k_mass(case):
    mass_t, mass_s = case["probs"].sum(1).astype(np.float64), case["p_s"].sum(1)
    expected = -(mass_t * np.log(mass_s) + (1 - mass_t) * np.log(1 - mass_s))
    got = seq.fuzzy_loss(*_args(case)).numpy()
    np.testing.assert_allclose(got, expected.mean(), rtol=1e-4)


def test_kbest_with_every_path_is_the_full_cross_entropy():
    """K >= N**T: p^t_sum = 1, so seq-CE is the exact sequence CE and fuzzy is -log 1 = 0."""
    rng = np.random.default_rng(3)
    s_pots, t_pots = rng.normal(size=(2, 2, 3, N)).astype(np.float32)
    trans = rng.normal(size=(N, N)).astype(np.float32)
    lengths = np.array([3, 2])
    k = N ** 3
    tags, probs, log_probs, valid = ops.crf_kbest_decode(t_pots, trans, lengths, k)
    probs = tf.where(valid, tf.exp(log_probs), 0.0)
    expected = 0.0
    for b, n in enumerate(lengths):
        teacher, student = _enumerate(t_pots[b], trans, n), _enumerate(s_pots[b], trans, n)
        expected += -sum(q * np.log(student[p]) for p, q in teacher.items()) / 2
    args = ((s_pots, trans), (tags, probs, valid), _mask(lengths, 3))
    got = seq.kbest_seq_ce(*args).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    np.testing.assert_allclose(seq.fuzzy_loss(*args).numpy(), 0.0, atol=1e-5)


def test_hard_loss_is_gold_nll(case):
    gold = np.array([[0, 1, 1, 2], [2, 0, 0, 0], [1, 0, 1, 0], [2, 2, 0, 0]], np.int32)
    expected = -np.mean([np.log(case["student"][b][tuple(gold[b, :n])]) for b, n in enumerate(LENGTHS)])
    got = seq.hard_loss((case["s_pots"], case["s_trans"]), gold, _mask(LENGTHS)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def _brute_marginals(pots, trans):
    marginals = np.zeros((len(LENGTHS), T, N))
    for b, n in enumerate(LENGTHS):
        for path, q in _enumerate(pots[b], trans, n).items():
            marginals[b, np.arange(n), path] += q
    return marginals


def test_token_posterior_kd_uses_exact_crf_marginals(case):
    q_t = _brute_marginals(case["t_pots"], case["t_trans"])
    q_s = _brute_marginals(case["s_pots"], case["s_trans"])
    real = np.arange(T)[None, :] < LENGTHS[:, None]
    # Eq. 10: -(1/N) sum over the N real tokens of sum_c q_t log q_s (the student's forbidden tags
    # have q_s = 0 where q_t = 0 too; they add nothing).
    with np.errstate(divide="ignore", invalid="ignore"):
        ce = -np.where(q_t > 0, q_t * np.log(q_s), 0.0).sum(-1)
        entropy = -np.where(q_t > 0, q_t * np.log(q_t), 0.0).sum(-1)
    student = (case["s_pots"], case["s_trans"])
    got = seq.token_posterior_kd(student, q_t.astype(np.float32), _mask(LENGTHS)).numpy()
    np.testing.assert_allclose(got, ce[real].mean(), rtol=1e-4)
    kl = seq.token_posterior_kd(student, q_t.astype(np.float32), _mask(LENGTHS), token_loss="kl")
    np.testing.assert_allclose(kl.numpy(), (ce - entropy)[real].mean(), rtol=1e-4)
    assert entropy[real].mean() > 0.3   # a flat teacher: CE and KL are far apart
    # The student's marginals are not its softmaxed emissions: transitions matter.
    emission_only = seq.token_emission_kd(case["s_pots"], np.log(np.maximum(q_t, 1e-30)), real).numpy()
    assert abs(emission_only - got) > 1e-2
    # A student that matches the teacher: KL 0, CE the teacher's entropy (Eq. 10's value).
    for token_loss, expected in (("kl", 0.0), ("ce", -np.where(q_s > 0, q_s * np.log(np.maximum(q_s, 1e-300)),
                                                                  0.0).sum(-1)[real].mean())):
        same = seq.token_posterior_kd(student, q_s.astype(np.float32), _mask(LENGTHS), token_loss=token_loss).numpy()
        assert same == pytest.approx(expected, abs=1e-5)


def test_token_posterior_kd_gradient_reaches_transitions(case):
    trans = tf.Variable(case["s_trans"])
    q_t = _brute_marginals(case["t_pots"], case["t_trans"]).astype(np.float32)
    with tf.GradientTape() as tape:
        loss = seq.token_posterior_kd((case["s_pots"], trans), q_t, _mask(LENGTHS))
    grad = tape.gradient(loss, trans).numpy()
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 1e-3


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_token_emission_kd_is_eq10_cross_entropy_over_real_tokens():
    rng = np.random.default_rng(5)
    s, t = rng.normal(0, 2.0, size=(2, 3, 5, N)).astype(np.float32)
    # Padding: a short row, a row with no real token; the padded positions hold large garbage.
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], np.float32)
    s[mask == 0], t[mask == 0] = 40.0, -40.0
    real = mask.astype(bool)
    for tau in (1.0, 2.0):
        p_t, p_s = _np_softmax(t.astype(np.float64) / tau), _np_softmax(s.astype(np.float64) / tau)
        ce = -(p_t * np.log(p_s)).sum(-1)               # Eq. 10's L_ij per token
        entropy = -(p_t * np.log(p_t)).sum(-1)
        expected = ce[real].sum() / real.sum()          # -(1/N) sum_i sum_j over the N real tokens
        got = seq.token_emission_kd(s, t, mask, temperature=tau).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5)
        assert got == pytest.approx(seq.token_emission_kd(s, t, mask, temperature=tau, token_loss="ce").numpy())
        kl = seq.token_emission_kd(s, t, mask, temperature=tau, token_loss="kl").numpy()
        # KL = CE - the teacher's entropy, token by token and so in the mean.
        np.testing.assert_allclose(kl, (ce - entropy)[real].mean(), rtol=1e-5)
        np.testing.assert_allclose(got - kl, entropy[real].mean(), rtol=1e-5)
        assert entropy[real].mean() > 0.2
    # At a perfect match the KL is 0 and the CE the teacher's entropy (> 0).
    assert seq.token_emission_kd(s, s, mask, token_loss="kl").numpy() == pytest.approx(0.0, abs=1e-6)
    p = _np_softmax(s.astype(np.float64))
    assert seq.token_emission_kd(s, s, mask).numpy() == pytest.approx(-(p * np.log(p)).sum(-1)[real].mean(), rel=1e-5)
    # Nothing real: 0, not NaN.
    assert seq.token_emission_kd(s, t, np.zeros_like(mask)).numpy() == 0.0


def test_unknown_token_loss_is_refused_naming_the_flag():
    s = np.zeros((1, 2, N), np.float32)
    with pytest.raises(ConfigError, match=r"^--token_loss='mse'; expected ce .* or kl$"):
        seq.token_emission_kd(s, s, np.ones((1, 2), np.float32), token_loss="mse")
    with pytest.raises(ConfigError, match="--token_loss='KL'"):
        MultiGrainedConfig(losses=("hard", "token_em"), token_loss="KL")
    assert MultiGrainedConfig().token_loss == "ce"


def test_residual_term_is_finite_when_student_puts_all_mass_on_the_k_paths():
    """Teacher leaves residual mass, the student has none left: log(1 - 1) must be clamped."""
    pots = np.zeros((1, 2, 2), np.float32)
    pots[0, :, 0] = 50.0  # the student is certain of path (0, 0)
    trans = np.zeros((2, 2), np.float32)
    tags = np.zeros((1, 1, 2), np.int32)
    probs, valid = np.array([[0.6]], np.float32), np.array([[True]])
    pots = tf.Variable(pots)
    for loss_fn in (seq.kbest_seq_ce, seq.fuzzy_loss):
        with tf.GradientTape() as tape:
            loss = loss_fn((pots, trans), (tags, probs, valid), np.ones((1, 2), np.float32))
        grad = tape.gradient(loss, pots).numpy()
        assert np.isfinite(loss.numpy()) and np.all(np.isfinite(grad))
        # -(0.4) * log(1e-6) from the clamp: large, not inf.
        assert 0.4 * 13 < loss.numpy() < 0.4 * 14.5


def test_losses_run_in_graph_mode_with_unknown_shapes(case):
    f32, i32, b = tf.float32, tf.int32, tf.bool

    @tf.function(input_signature=[tf.TensorSpec([None, None, N], f32), tf.TensorSpec([None, None], f32),
                                  tf.TensorSpec([N, N], f32), tf.TensorSpec([None, None, None], i32),
                                  tf.TensorSpec([None, None], f32), tf.TensorSpec([None, None], b)])
    def all_losses(pots, mask, trans, tags, probs, valid):
        prediction, target = (pots, trans), (tags, probs, valid)
        return tf.stack([seq.kbest_seq_ce(prediction, target, mask), seq.fuzzy_loss(prediction, target, mask),
                         seq.hard_loss(prediction, tags[:, 0], mask)])

    graph = all_losses(case["s_pots"], _mask(LENGTHS), case["s_trans"], case["tags"], case["probs"],
                       case["valid"]).numpy()
    prediction, _, mask = _args(case)
    eager = [seq.kbest_seq_ce(*_args(case)), seq.fuzzy_loss(*_args(case)),
             seq.hard_loss(prediction, case["tags"][:, 0], mask)]
    np.testing.assert_allclose(graph, [e.numpy() for e in eager], rtol=1e-5)
    # T = 2: the CRF ops' tf.scan cannot stack an empty time loop when B is unknown and T <= 1.
    empty = all_losses(np.zeros((0, 2, N), np.float32), np.zeros([0, 2], np.float32), case["s_trans"],
                       np.zeros((0, K, 2), np.int32), np.zeros((0, K), np.float32), np.zeros((0, K), bool))
    np.testing.assert_array_equal(empty.numpy(), 0.0)
