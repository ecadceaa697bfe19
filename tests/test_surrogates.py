"""k-best surrogates of a CRF teacher against brute-force enumeration, and through the cache."""
import itertools

import numpy as np

from xtremedistil_tf.crf import ops
from xtremedistil_tf.transfer.cache import read_sharded, write_sharded
from xtremedistil_tf.teachers.surrogates import make_surrogate_fn

N, T = 3, 4
LENGTHS = np.array([4, 2, 3, 1], np.int32)
# What kbest_surrogates returns per row (and the cache stores).
SURROGATE_KEYS = ("kbest_tags", "kbest_probs", "kbest_valid", "residual", "marginals")


def _teacher(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 0.8, (len(LENGTHS), T, N)).astype(np.float32)
    logits *= (np.arange(T)[None, :, None] < LENGTHS[:, None, None])  # zeros past the length, as cached
    trans = rng.normal(0, 0.8, (N, N)).astype(np.float32)
    trans[1, 2] = ops.FORBIDDEN
    return logits, trans


def _enumerate(logits, trans, length, start=None):
    """[(prob, path)] of every allowed path, most probable first, float64."""
    scored = []
    for path in itertools.product(range(N), repeat=length):
        if any(trans[a, b] <= ops.FORBIDDEN_THRESHOLD for a, b in zip(path, path[1:])):
            continue
        if start is not None and length and not start[path[0]]:
            continue
        scored.append((sum(logits[t, y] for t, y in enumerate(path)) + sum(trans[a, b] for a, b in zip(path, path[1:])),
                       path))
    scores = np.array([s for s, _ in scored])
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    return sorted(zip(probs, [p for _, p in scored]), key=lambda item: -item[0])


def test_topk_probabilities_and_residual_sum_to_one():
    logits, trans = _teacher()
    out = make_surrogate_fn(3)(logits, trans, LENGTHS)
    assert out["kbest_tags"].shape == (4, 3, T) and out["kbest_tags"].dtype == np.int32
    assert out["kbest_probs"].dtype == np.float32 and out["residual"].shape == (4,)
    np.testing.assert_allclose(out["kbest_probs"].sum(1) + out["residual"], 1.0, atol=1e-6)
    # The length-4 window has 3 of 60 allowed paths: real mass is left outside them.
    assert out["residual"][0] > 0.1
    # Length 1 has exactly 3 paths: all three fit, nothing is left.
    assert out["kbest_valid"][3].all() and out["residual"][3] < 1e-6
    for b, length in enumerate(LENGTHS):
        expected = _enumerate(logits[b], trans, length)[:3]
        np.testing.assert_allclose(out["kbest_probs"][b], [p for p, _ in expected], rtol=1e-4)
        assert [tuple(t[:length]) for t in out["kbest_tags"][b]] == [p for _, p in expected]
        np.testing.assert_array_equal(out["kbest_tags"][b][:, length:], 0)


def test_k_at_least_the_number_of_paths_gives_exact_distribution_and_zero_residual():
    logits, trans = _teacher(seed=1)
    k = N ** T
    out = make_surrogate_fn(k)(logits, trans, LENGTHS)
    np.testing.assert_allclose(out["residual"], 0.0, atol=1e-6)
    for b, length in enumerate(LENGTHS):
        expected = _enumerate(logits[b], trans, length)
        count = len(expected)  # 60, 8, 21, 3 allowed paths
        assert out["kbest_valid"][b].sum() == count
        assert not out["kbest_valid"][b, count:].any() and (out["kbest_probs"][b, count:] == 0).all()
        np.testing.assert_allclose(out["kbest_probs"][b, :count], [p for p, _ in expected], rtol=1e-4, atol=1e-7)
        assert {tuple(t[:length]) for t in out["kbest_tags"][b, :count]} == {p for _, p in expected}


def test_marginals_match_enumeration():
    logits, trans = _teacher(seed=2)
    out = make_surrogate_fn(2)(logits, trans, LENGTHS)
    for b, length in enumerate(LENGTHS):
        expected = np.zeros((T, N))
        for p, path in _enumerate(logits[b], trans, length):
            expected[np.arange(length), path] += p
        np.testing.assert_allclose(out["marginals"][b], expected, atol=1e-5)


def test_start_constraint_is_applied_to_cached_logits():
    logits, trans = _teacher(seed=3)
    start = np.array([False, True, False])
    out = make_surrogate_fn(4, start_allowed=start, end_allowed=np.ones(N, bool))(logits, trans, LENGTHS)
    for b, length in enumerate(LENGTHS):
        expected = _enumerate(logits[b], trans, length, start=start)[:4]
        np.testing.assert_allclose(out["kbest_probs"][b][:len(expected)], [p for p, _ in expected], rtol=1e-4)
        np.testing.assert_array_equal(out["kbest_tags"][b][out["kbest_valid"][b], 0], 1)
        np.testing.assert_allclose(out["marginals"][b, 0], [0, 1, 0], atol=1e-6)


def test_surrogates_round_trip_through_the_cache(tmp_path):
    logits, trans = _teacher(seed=4)
    surrogates = make_surrogate_fn(2)

    def compute_batch(rows):
        return surrogates(logits[rows], trans, LENGTHS[rows])

    write_sharded(tmp_path / "cache", len(LENGTHS), compute_batch, shard_size=3, batch_size=2,
                  fingerprint={"test": 1}, dtypes={"kbest_tags": "uint8"}, progress=False)
    expected = surrogates(logits, trans, LENGTHS)
    rows = list(read_sharded(tmp_path / "cache").as_numpy_iterator())
    assert sorted(rows[0]) == sorted(SURROGATE_KEYS)
    for key in SURROGATE_KEYS:
        # allclose: the CRF ops pick their exact/fast forward pass per batch, so float values
        # may differ in the last bit between batchings; tags and validity are exact.
        np.testing.assert_allclose(np.stack([r[key] for r in rows]).astype(expected[key].dtype), expected[key],
                                   rtol=1e-6, atol=0)
