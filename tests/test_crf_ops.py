"""CRF ops against tensorflow-addons' own outputs and against brute-force enumeration."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from xtremedistil_tf.crf import ops
from xtremedistil_tf.errors import ConfigError

RTOL, ATOL = 1e-4, 1e-5


def crf_multitag_sequence_score(potentials, allowed, lengths, transitions):
    """tfa's op of that name: the log-sum of the scores of every path whose tag at each position is in `allowed`
    [B, T, N] bool (the numerator of a fuzzy-CRF loss), as the log norm of the potentials with every other tag
    at -1e9, far below any sum of FORBIDDEN moves so those paths never mix with the allowed ones (docs/crf.md)."""
    potentials = tf.cast(potentials, tf.float32)
    return ops.crf_log_norm(tf.where(tf.cast(allowed, tf.bool), potentials, -1e9), lengths, transitions)


# ---------------------------------------------------------------- tfa reference


def _case(fixtures_dir, i):
    data = np.load(fixtures_dir / "crf_tfa_reference.npz")
    if i >= int(data["num_cases"]):
        pytest.skip(f"fixture has no case {i}")
    return {key[len(f"c{i}_"):]: data[key] for key in data.files if key.startswith(f"c{i}_")}


@pytest.mark.parametrize("case", [0, 1, 2, 3])
def test_matches_tensorflow_addons(fixtures_dir, case):
    c = _case(fixtures_dir, case)
    pots, trans = tf.constant(c["pots"]), tf.constant(c["trans"])
    with tf.GradientTape() as tape:
        tape.watch([pots, trans])
        log_likelihood = ops.crf_log_likelihood(pots, c["tags"], c["lens"], trans)
        loss = -tf.reduce_sum(log_likelihood)
    grad_pots, grad_trans = tape.gradient(loss, [pots, trans])
    tags, score = ops.crf_decode(pots, trans, c["lens"])
    ours = {
        "log_likelihood": log_likelihood,
        "log_norm": ops.crf_log_norm(pots, c["lens"], trans),
        "sequence_score": ops.crf_sequence_score(pots, c["tags"], c["lens"], trans),
        "multitag_score": crf_multitag_sequence_score(pots, c["allowed"], c["lens"], trans),
        "grad_pots": grad_pots,
        "grad_trans": grad_trans,
        "decode": tags,
        "decode_score": score,
    }
    empty = c["lens"] == 0
    for key, value in ours.items():
        value, expected = value.numpy(), c[key]
        if key in ("decode", "decode_score"):
            # On purpose: a zero-length sequence decodes to the empty path (tags 0, score 0);
            # tfa returns the best first-position tag and its potential.
            np.testing.assert_array_equal(value[empty], 0)
            value, expected = value[~empty], expected[~empty]
        # Gradients sum B*T marginals of either sign (entries up to ~40 with some near 0):
        # float32 rounding of those sums is relative to the largest entry, not to each.
        atol = 1e-5 * np.abs(expected).max() if key.startswith("grad") else ATOL
        np.testing.assert_allclose(value, expected, rtol=RTOL, atol=atol, err_msg=f"case {case}: {key}")
    if case == 3:
        assert empty.any(), "case 3 is the zero-length case"
        np.testing.assert_array_equal(ours["log_likelihood"].numpy()[empty], 0.0)


# ---------------------------------------------------------------- brute force


def _paths(pots, trans, length):
    """All N**length paths of one sequence with float64 scores, best first."""
    num_tags = pots.shape[-1]
    scored = []
    for path in itertools.product(range(num_tags), repeat=length):
        score = sum(pots[t, tag] for t, tag in enumerate(path))
        score += sum(trans[a, b] for a, b in zip(path[:-1], path[1:]))
        scored.append((float(score), path))
    return sorted(scored, key=lambda item: -item[0])


def _log_sum_exp(scores):
    scores = np.asarray(scores, np.float64)
    peak = scores.max()
    return peak + np.log(np.exp(scores - peak).sum())


def _random_crf(num_tags, num_steps, batch, seed, lengths=None):
    rng = np.random.default_rng(seed)
    pots = rng.normal(0, 2, [batch, num_steps, num_tags]).astype(np.float32)
    trans = rng.normal(0, 1, [num_tags, num_tags]).astype(np.float32)
    if lengths is None:
        lengths = np.array([num_steps, max(num_steps - 1, 0), 1, 0][:batch], np.int32)
    return pots, trans, np.asarray(lengths, np.int32)


IOB2_LABELS = ["O", "B-A", "I-A", "B-B"]  # small enough to enumerate, rich enough to forbid moves


def _constrained(pots, trans, lengths):
    """IOB2 constraints of IOB2_LABELS applied to the transitions and boundary potentials."""
    mask, start, end = ops.allowed_transitions(IOB2_LABELS, "IOB2")
    trans = ops.apply_transition_constraints(trans, mask).numpy()
    pots = ops.apply_boundary_constraints(pots, lengths, start, end).numpy()
    return pots, trans


CONFIGS = [  # (num_tags, num_steps, forbidden)
    (3, 4, False),
    (4, 3, False),
    (4, 4, True),
    (3, 1, False),  # T = 1: no transition step at all
    (4, 1, True),
]


@pytest.mark.parametrize("k", [3, 20])  # fewer and more than some sequences' labelings
@pytest.mark.parametrize("num_tags,num_steps,forbidden", CONFIGS)
def test_kbest_and_log_norm_match_enumeration(num_tags, num_steps, forbidden, k):
    pots, trans, lengths = _random_crf(num_tags, num_steps, 4, seed=num_tags * 10 + num_steps)
    if forbidden:
        pots, trans = _constrained(pots, trans, lengths)
    tags, scores, log_probs, valid = (x.numpy() for x in ops.crf_kbest_decode(pots, trans, lengths, k))
    log_norm = ops.crf_log_norm(pots, lengths, trans).numpy()
    best_tags, best_score = (x.numpy() for x in ops.crf_decode(pots, trans, lengths))
    for b, length in enumerate(lengths):
        paths = _paths(pots[b], trans, length)
        log_z = _log_sum_exp([s for s, _ in paths])
        np.testing.assert_allclose(log_norm[b], log_z, rtol=RTOL, atol=ATOL)
        # Forbidden paths score about -1e4: k-best must leave them out.
        allowed = [(s, p) for s, p in paths if s > ops.FORBIDDEN_THRESHOLD]
        if forbidden and length > 1:
            assert len(allowed) < len(paths)
        count = min(k, len(allowed))
        gaps = np.diff([s for s, _ in allowed[: count + 1]])
        assert (np.abs(gaps) > 1e-3).all(), "test data must have no near-ties"
        assert valid[b].tolist() == [True] * count + [False] * (k - count)
        for r, (score, path) in enumerate(allowed[:count]):
            assert tuple(tags[b, r, :length]) == path, (b, r)
            np.testing.assert_allclose(scores[b, r], score, rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(np.exp(log_probs[b, r]), np.exp(score - log_z), rtol=RTOL, atol=1e-7)
        np.testing.assert_array_equal(tags[b, :, length:], 0)
        # Filler of the slots with no path.
        np.testing.assert_array_equal(tags[b, count:], 0)
        assert np.isneginf(scores[b, count:]).all() and np.isneginf(log_probs[b, count:]).all()
        assert np.exp(log_probs[b][valid[b]]).sum() <= 1 + 1e-5
        assert tuple(best_tags[b, :length]) == allowed[0][1]
        np.testing.assert_allclose(best_score[b], allowed[0][0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("k", [4, 15])
def test_kbest_with_fewer_labelings_than_k(k):
    # N=2, T=3: exactly 8 labelings for the full sequence, 2 for length 1, 1 (empty) for length 0.
    pots, trans, lengths = _random_crf(2, 3, 3, seed=7, lengths=[3, 1, 0])
    tags, scores, log_probs, valid = (x.numpy() for x in ops.crf_kbest_decode(pots, trans, lengths, k))
    assert valid.sum(axis=1).tolist() == [min(k, 8), 2, 1]
    paths = _paths(pots[0], trans, 3)
    assert [tuple(t) for t in tags[0, : min(k, 8)]] == [p for _, p in paths[:k]]
    # All labelings of the shorter ones are listed, so their probabilities add up to 1.
    np.testing.assert_allclose(np.exp(log_probs[1, :2]).sum(), 1.0, rtol=1e-5)
    if k >= 8:
        np.testing.assert_allclose(np.exp(log_probs[0, :8]).sum(), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(scores[2, 0], 0.0)
    np.testing.assert_array_equal(log_probs[2, 0], 0.0)
    assert not np.isnan(scores).any() and not np.isnan(log_probs).any()
    assert np.isneginf(scores[~valid]).all()


@pytest.mark.parametrize("k", [3, 7])
def test_kbest_lists_each_path_once(k):
    # At t=1 each tag has only N=2 finite candidates (rank 0 of each previous tag),
    # fewer than k: the empty slots must stay -inf, not repeat the best candidate,
    # which here would put (0, 0) twice ahead of (0, 1).
    pots = np.array([[[10.0, 0.0], [0.0, -1.0]]], np.float32)
    tags, scores, _, valid = (x.numpy() for x in ops.crf_kbest_decode(pots, np.zeros([2, 2], np.float32), [2], k))
    expected = [(0, 0), (0, 1), (1, 0), (1, 1)][:k]
    assert [tuple(t) for t in tags[0, : len(expected)]] == expected
    np.testing.assert_array_equal(scores[0, : len(expected)], [10.0, 9.0, 0.0, -1.0][:k])
    assert valid[0].tolist() == [True] * len(expected) + [False] * (k - len(expected))


def test_kbest_counts_only_allowed_labelings():
    # IOB2 over O, B-A, I-A, B-B with T=3: 64 labelings, of which those never moving
    # O/B-B -> I-A nor starting with I-A are allowed: count them by enumeration.
    pots, trans, lengths = _random_crf(4, 3, 1, seed=3, lengths=[3])
    pots, trans = _constrained(pots, trans, lengths)
    mask, start, _ = ops.allowed_transitions(IOB2_LABELS, "IOB2")
    expected = sum(
        start[p[0]] and all(mask[a, b] for a, b in zip(p[:-1], p[1:]))
        for p in itertools.product(range(4), repeat=3)
    )
    _, _, log_probs, valid = (x.numpy() for x in ops.crf_kbest_decode(pots, trans, lengths, 64))
    assert valid.sum() == expected < 64
    np.testing.assert_allclose(np.exp(log_probs[valid]).sum(), 1.0, rtol=1e-5)


@pytest.mark.parametrize("num_tags,num_steps,forbidden", CONFIGS)
def test_marginals_and_multitag_match_enumeration(num_tags, num_steps, forbidden):
    pots, trans, lengths = _random_crf(num_tags, num_steps, 4, seed=num_tags + num_steps)
    if forbidden:
        pots, trans = _constrained(pots, trans, lengths)
    rng = np.random.default_rng(num_tags)
    allowed = rng.random([4, num_steps, num_tags]) < 0.5
    allowed[:, :, 0] = True
    marginals = ops.crf_marginals(pots, lengths, trans).numpy()
    multitag = crf_multitag_sequence_score(pots, allowed, lengths, trans).numpy()
    for b, length in enumerate(lengths):
        paths = _paths(pots[b], trans, length)
        log_z = _log_sum_exp([s for s, _ in paths])
        expected = np.zeros([num_steps, num_tags])
        for score, path in paths:
            expected[np.arange(length), list(path)] += np.exp(score - log_z)
        np.testing.assert_allclose(marginals[b], expected, rtol=RTOL, atol=1e-6)
        np.testing.assert_allclose(marginals[b, :length].sum(-1), 1.0, rtol=1e-5)
        inside = [s for s, p in paths if all(allowed[b, t, tag] for t, tag in enumerate(p))]
        np.testing.assert_allclose(multitag[b], _log_sum_exp(inside), rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- graph mode, dtypes, edge cases


def test_ops_in_tf_function_with_unknown_shapes():
    spec = [
        tf.TensorSpec([None, None, 3], tf.float32),
        tf.TensorSpec([None, None], tf.int32),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([3, 3], tf.float32),
    ]

    @tf.function(input_signature=spec)
    def everything(pots, tags, lengths, trans):
        kbest = ops.crf_kbest_decode(pots, trans, lengths, 4)
        return (
            ops.crf_log_likelihood(pots, tags, lengths, trans),
            ops.crf_marginals(pots, lengths, trans),
            crf_multitag_sequence_score(pots, tf.ones_like(pots, tf.bool), lengths, trans),
        ) + ops.crf_decode(pots, trans, lengths) + kbest

    for num_steps, batch in [(5, 3), (2, 4)]:
        pots, trans, lengths = _random_crf(3, num_steps, batch, seed=num_steps, lengths=[num_steps, 1, 0, num_steps][:batch])
        tags = np.zeros([batch, num_steps], np.int32)
        graph = everything(pots, tags, lengths, trans)
        eager = (
            ops.crf_log_likelihood(pots, tags, lengths, trans),
            ops.crf_marginals(pots, lengths, trans),
            crf_multitag_sequence_score(pots, np.ones(pots.shape, bool), lengths, trans),
        ) + ops.crf_decode(pots, trans, lengths) + ops.crf_kbest_decode(pots, trans, lengths, 4)
        for g, e in zip(graph, eager):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-6)
    # The multitag score of "everything allowed" is the log norm.
    np.testing.assert_allclose(graph[2].numpy(), ops.crf_log_norm(pots, lengths, trans).numpy(), rtol=1e-6)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_chunked_scan_is_tf_scan_to_the_bit(chunk, reverse):
    # A step whose float sums depend on their order (a max-plus step with a scaled add, and a gather
    # of pointers): the chunked loop must run exactly tf.scan's steps, in graphs of unknown length too,
    # with steps that are not a multiple of the chunk, and must not let its zero padding reach an output.
    rng = np.random.default_rng(chunk)
    transitions = tf.constant(rng.normal(size=(5, 5)), tf.float32)

    def step(state, x):
        return tf.reduce_max(state[:, :, None] + transitions[None], axis=1) * 0.999 + x

    def pointers(state, m):
        return tf.gather(m, state, batch_dims=1)

    scan = tf.function(lambda f, e, i: ops.chunked_scan(f, e, i, reverse=reverse, chunk=chunk), reduce_retracing=True)
    for steps in [1, 2, chunk, chunk + 1, 2 * chunk + 1, 17]:
        elems = tf.constant(rng.normal(size=(steps, 4, 5)) * 10, tf.float32)
        initial = tf.constant(rng.normal(size=(4, 5)), tf.float32)
        expected = tf.scan(step, elems, initializer=initial, reverse=reverse).numpy()
        assert np.array_equal(ops.chunked_scan(step, elems, initial, reverse=reverse, chunk=chunk).numpy(), expected)
        assert np.array_equal(scan(step, elems, initial).numpy(), expected)
        maps = tf.constant(rng.integers(0, 5, size=(steps, 4, 5)), tf.int32)
        start = tf.constant(rng.integers(0, 5, size=(4, 2)), tf.int32)
        expected = tf.scan(pointers, maps, initializer=start, reverse=reverse).numpy()
        assert np.array_equal(ops.chunked_scan(pointers, maps, start, reverse=reverse, chunk=chunk).numpy(), expected)


@pytest.mark.parametrize("num_steps", [0, 1])
def test_ops_in_tf_function_with_at_most_one_step(num_steps):
    # With T <= 1 the time loops have no step: in graphs with unknown batch and time
    # that must still trace and run, and T = 1 must give the brute-force values.
    num_tags, k, batch = 3, 4, 3
    spec = [
        tf.TensorSpec([None, None, num_tags], tf.float32),
        tf.TensorSpec([None, None], tf.int32),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([num_tags, num_tags], tf.float32),
        tf.TensorSpec([None, None, num_tags], tf.bool),
    ]

    @tf.function(input_signature=spec)
    def everything(pots, tags, lengths, trans, allowed):
        with tf.GradientTape() as tape:
            tape.watch([pots, trans])
            log_likelihood = ops.crf_log_likelihood(pots, tags, lengths, trans)
            total = tf.reduce_sum(log_likelihood)
        grad_pots, grad_trans = tape.gradient(total, [pots, trans])
        return (
            ops.crf_sequence_score(pots, tags, lengths, trans),
            ops.crf_log_norm(pots, lengths, trans),
            log_likelihood,
            grad_pots,
            grad_trans,
            crf_multitag_sequence_score(pots, allowed, lengths, trans),
            ops.crf_marginals(pots, lengths, trans),
        ) + ops.crf_decode(pots, trans, lengths) + ops.crf_kbest_decode(pots, trans, lengths, k)

    pots, trans, lengths = _random_crf(num_tags, num_steps, batch, seed=11, lengths=[num_steps, 0, num_steps])
    rng = np.random.default_rng(11)
    tags = rng.integers(0, num_tags, [batch, num_steps]).astype(np.int32)
    allowed = rng.random([batch, num_steps, num_tags]) < 0.5
    allowed[:, :, 1] = True
    (score, log_norm, log_likelihood, grad_pots, grad_trans, multitag, marginals, best_tags, best_score,
     kbest_tags, kbest_scores, log_probs, valid) = (x.numpy() for x in everything(pots, tags, lengths, trans, allowed))

    np.testing.assert_array_equal(grad_trans, 0.0)  # no position has a predecessor
    for b, length in enumerate(lengths):
        paths = _paths(pots[b], trans, length)  # length 0: the single empty path, score 0
        log_z = _log_sum_exp([s for s, _ in paths])
        gold = float(pots[b, np.arange(length), tags[b, :length]].sum())
        expected_marginals = np.zeros([num_steps, num_tags])
        for s, path in paths:
            expected_marginals[np.arange(length), list(path)] += np.exp(s - log_z)
        gold_onehot = np.zeros([num_steps, num_tags])
        gold_onehot[np.arange(length), tags[b, :length]] = 1.0
        inside = [s for s, p in paths if all(allowed[b, t, tag] for t, tag in enumerate(p))]
        np.testing.assert_allclose(score[b], gold, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(log_norm[b], log_z, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(log_likelihood[b], gold - log_z, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(grad_pots[b], gold_onehot - expected_marginals, rtol=RTOL, atol=1e-6)
        np.testing.assert_allclose(multitag[b], _log_sum_exp(inside), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(marginals[b], expected_marginals, rtol=RTOL, atol=1e-6)
        assert tuple(best_tags[b, :length]) == paths[0][1]
        np.testing.assert_allclose(best_score[b], paths[0][0], rtol=RTOL, atol=ATOL)
        count = min(k, len(paths))
        assert valid[b].tolist() == [True] * count + [False] * (k - count)
        for r, (s, path) in enumerate(paths[:count]):
            assert tuple(kbest_tags[b, r, :length]) == path, (b, r)
            np.testing.assert_allclose(kbest_scores[b, r], s, rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(log_probs[b, r], s - log_z, rtol=RTOL, atol=ATOL)
        assert np.isneginf(kbest_scores[b, count:]).all()
        np.testing.assert_array_equal(kbest_tags[b, :, length:], 0)
        np.testing.assert_array_equal(best_tags[b, length:], 0)
    assert best_tags.shape == (batch, num_steps) and kbest_tags.shape == (batch, k, num_steps)
    assert marginals.shape == grad_pots.shape == (batch, num_steps, num_tags)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_half_precision_potentials_compute_in_float32(dtype):
    pots, trans, lengths = _random_crf(3, 6, 3, seed=1, lengths=[6, 2, 0])
    half = tf.cast(pots, dtype)
    reference = tf.cast(half, tf.float32)  # same values, so results must agree closely
    tags = np.ones([3, 6], np.int32)
    with tf.GradientTape() as tape:
        tape.watch(half)
        log_likelihood = ops.crf_log_likelihood(half, tags, lengths, trans)
        loss = -tf.reduce_sum(log_likelihood) + tf.reduce_sum(ops.crf_marginals(half, lengths, trans)[:, :, 0])
    grad = tape.gradient(loss, half)
    assert log_likelihood.dtype == tf.float32 and grad.dtype == dtype
    assert np.isfinite(tf.cast(grad, tf.float32).numpy()).all()
    np.testing.assert_allclose(
        log_likelihood.numpy(), ops.crf_log_likelihood(reference, tags, lengths, trans).numpy(), rtol=1e-6
    )
    np.testing.assert_array_equal(
        ops.crf_kbest_decode(half, trans, lengths, 3)[0].numpy(),
        ops.crf_kbest_decode(reference, trans, lengths, 3)[0].numpy(),
    )


def test_gradients_finite_with_constraints_and_empty_sequences():
    pots, trans, lengths = _random_crf(4, 5, 4, seed=2)
    pots = tf.constant(pots)
    mask, start, end = ops.allowed_transitions(IOB2_LABELS, "IOB2")
    trans = tf.Variable(trans)
    allowed = np.random.default_rng(0).random([4, 5, 4]) < 0.5
    allowed[:, :, 0] = True
    with tf.GradientTape() as tape:
        tape.watch(pots)
        constrained = ops.apply_boundary_constraints(pots, lengths, start, end)
        hard = ops.apply_transition_constraints(trans, mask)
        zeros = np.zeros([4, 5], np.int32)
        loss = (
            ops.crf_nll_loss(constrained, zeros, lengths, hard)
            - tf.reduce_sum(crf_multitag_sequence_score(constrained, allowed, lengths, hard))
            + tf.reduce_sum(ops.crf_marginals(constrained, lengths, hard)[:, :, 1])
        )
    grad_pots, grad_trans = tape.gradient(loss, [pots, trans])
    assert np.isfinite(loss.numpy()) and np.isfinite(grad_pots.numpy()).all()
    assert np.isfinite(grad_trans.numpy()).all()
    # Forbidden entries are constants: training cannot revive them.
    np.testing.assert_array_equal(grad_trans.numpy()[~mask], 0.0)
    np.testing.assert_array_equal(grad_pots.numpy()[lengths == 0], 0.0)


def test_empty_batch_and_zero_time():
    trans = np.zeros([3, 3], np.float32)
    for batch, num_steps in [(0, 4), (2, 0)]:
        pots = np.zeros([batch, num_steps, 3], np.float32)
        lengths = np.zeros([batch], np.int32)
        tags = np.zeros([batch, num_steps], np.int32)
        assert ops.crf_log_likelihood(pots, tags, lengths, trans).shape == [batch]
        assert ops.crf_marginals(pots, lengths, trans).shape == [batch, num_steps, 3]
        assert ops.crf_decode(pots, trans, lengths)[0].shape == [batch, num_steps]
        kbest_tags, _, log_probs, valid = ops.crf_kbest_decode(pots, trans, lengths, 2)
        assert kbest_tags.shape == [batch, 2, num_steps]
        assert valid.numpy().tolist() == [[True, False]] * batch
        assert ops.crf_nll_loss(pots, tags, lengths, trans).numpy() == 0.0


def test_nll_loss_is_the_mean_nll_over_the_weighted_rows():
    """The one CRF NLL: bit for bit the batch mean it was, and the masked mean over `rows` that the
    CRF teacher and L_hard computed themselves before they called it (values and gradients)."""
    rng = np.random.default_rng(3)
    pots = tf.constant(rng.normal(size=[4, 5, 3]).astype(np.float32))
    trans = tf.constant(rng.normal(size=[3, 3]).astype(np.float32))
    tags, lengths = rng.integers(0, 3, [4, 5]).astype(np.int32), np.array([5, 3, 0, 2], np.int32)
    rows = np.array([True, False, True, True])

    def losses(pots):
        nll = -ops.crf_log_likelihood(pots, tags, lengths, trans)
        weights = tf.cast(rows, tf.float32)
        return [(ops.crf_nll_loss(pots, tags, lengths, trans),
                 tf.math.divide_no_nan(tf.reduce_sum(nll), tf.cast(tf.size(nll), tf.float32))),
                (ops.crf_nll_loss(pots, tags, lengths, trans, rows=rows),
                 tf.math.divide_no_nan(tf.reduce_sum(nll * weights), tf.reduce_sum(weights)))]

    for index in range(2):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(pots)
            ours, before = losses(pots)[index]
        assert ours.numpy() == before.numpy()
        np.testing.assert_array_equal(tape.gradient(ours, pots), tape.gradient(before, pots))
    assert ops.crf_nll_loss(pots, tags, lengths, trans, rows=np.zeros(4)).numpy() == 0.0


def test_user_errors_are_clear():
    pots = np.zeros([1, 2, 3], np.float32)
    with pytest.raises(ConfigError, match="k must be"):
        ops.crf_kbest_decode(pots, np.zeros([3, 3]), [2], 0)
    with pytest.raises(ValueError, match="transitions must be"):
        ops.crf_log_norm(pots, [2], np.zeros([4, 4]))
    with pytest.raises(ValueError, match="potentials must be"):
        ops.crf_log_norm(np.zeros([2, 3], np.float32), [2], np.zeros([3, 3]))
    with pytest.raises(ConfigError, match="unknown tag scheme"):
        ops.allowed_transitions(["O"], "BILOU")
    with pytest.raises(ConfigError, match="prefix 'E'"):
        ops.allowed_transitions(["O", "E-PER"], "IOB2")


# ---------------------------------------------------------------- tag schemes


def _lookup(labels, scheme):
    mask, start, end = ops.allowed_transitions(labels, scheme)
    index = {label: i for i, label in enumerate(labels)}
    return (lambda a, b: bool(mask[index[a], index[b]])), (lambda a: bool(start[index[a]])), (
        lambda a: bool(end[index[a]])
    )


def test_iob2_constraints():
    labels = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "X", "[CLS]"]
    move, starts, ends = _lookup(labels, "IOB2")
    assert not move("O", "I-PER") and not move("B-ORG", "I-PER") and not move("I-ORG", "I-PER")
    assert move("B-PER", "I-PER") and move("I-PER", "I-PER") and move("I-PER", "B-PER") and move("O", "B-ORG")
    assert not starts("I-PER") and starts("B-PER") and starts("O") and ends("I-PER")
    # Special labels are unconstrained both ways (word pieces: B-PER X I-PER).
    assert move("B-PER", "X") and move("X", "I-PER") and move("[CLS]", "I-ORG") and starts("X")


def test_iob1_constraints():
    move, starts, ends = _lookup(["O", "B-PER", "I-PER", "I-LOC"], "IOB1")
    assert move("O", "I-PER") and move("I-LOC", "I-PER") and move("I-PER", "B-PER")
    assert not move("O", "B-PER") and not move("I-LOC", "B-PER")
    assert starts("I-PER") and not starts("B-PER") and ends("B-PER")


@pytest.mark.parametrize("scheme,inside", [("BIOES", "I"), ("BMES", "M")])
def test_bioes_and_bmes_constraints(scheme, inside):
    labels = ["O", "B-NR", f"{inside}-NR", "E-NR", "S-NR", "B-NS", "E-NS"]
    move, starts, ends = _lookup(labels, scheme)
    assert move("B-NR", f"{inside}-NR") and move(f"{inside}-NR", "E-NR") and move("B-NR", "E-NR")
    assert move("E-NR", "B-NS") and move("S-NR", "O") and move("O", "S-NR")
    assert not move("B-NR", "O") and not move("B-NR", "E-NS") and not move("O", "E-NR")
    assert not move(f"{inside}-NR", "B-NS") and not move("E-NR", f"{inside}-NR")
    assert starts("B-NR") and starts("S-NR") and starts("O") and not starts("E-NR")
    assert ends("E-NR") and ends("S-NR") and not ends("B-NR") and not ends(f"{inside}-NR")
