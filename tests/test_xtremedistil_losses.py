"""XtremeDistil losses against numpy references, with masks."""
import numpy as np
import pytest
import tensorflow as tf

from xtremedistil_tf.losses import cross_entropy, label_mask, logit_mse, registry, representation_kld, representation_mse
from xtremedistil_tf.losses.xtremedistil import soft_target_kl

PAD = 8


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    b, t, n, h = 3, 5, 9, 7
    attention = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], np.int32)
    labels = rng.integers(0, n - 1, (b, t)).astype(np.int32)
    labels[attention == 0] = PAD
    labels[0, 2] = PAD  # a real piece without a label (as in unlabeled sentences)
    return {"attention": attention, "labels": labels,
            "scores": rng.normal(size=(b, t, n)).astype(np.float32),
            "teacher_logits": rng.normal(size=(b, t, n)).astype(np.float32) * 3,
            "student_hidden": rng.normal(size=(b, t, h)).astype(np.float32),
            "teacher_hidden": rng.normal(size=(b, t, h)).astype(np.float32) * 2}


def _spoil_padding(x, attention):
    """A copy of x with huge values wherever the attention mask is 0."""
    x = x.copy()
    x[attention == 0] = 1e4
    return x


def test_cross_entropy_matches_numpy_and_skips_pad_labels(batch):
    mask = label_mask(batch["labels"], batch["attention"], PAD).numpy()
    expected_mask = (batch["attention"] == 1) & (batch["labels"] != PAD)
    np.testing.assert_array_equal(mask, expected_mask.astype(np.float32))
    logp = _log_softmax(batch["scores"].astype(np.float64))
    picked = np.take_along_axis(logp, np.minimum(batch["labels"], 8)[..., None], -1)[..., 0]
    expected = -picked[expected_mask].mean()
    got = cross_entropy(batch["scores"], batch["labels"], mask).numpy()
    assert got == pytest.approx(expected, rel=1e-5)
    # Scores at padded or unlabeled positions do not matter.
    scores = batch["scores"].copy()
    scores[~expected_mask] = 50.0
    assert cross_entropy(scores, batch["labels"], mask).numpy() == pytest.approx(got, rel=1e-6)


def test_logit_mse_matches_numpy_and_ignores_padding(batch):
    real = batch["attention"] == 1
    student = batch["scores"]
    expected = ((student - batch["teacher_logits"]) ** 2).mean(-1)[real].mean()
    got = logit_mse(student, batch["teacher_logits"], batch["attention"]).numpy()
    assert got == pytest.approx(expected, rel=1e-5)
    spoiled = logit_mse(_spoil_padding(student, batch["attention"]),
                        -_spoil_padding(-batch["teacher_logits"], batch["attention"]), batch["attention"])
    assert spoiled.numpy() == pytest.approx(got, rel=1e-6)


def test_soft_target_kl_matches_numpy_and_is_zero_at_the_teacher(batch):
    real = batch["attention"] == 1
    log_s = _log_softmax(batch["scores"].astype(np.float64))
    log_t = _log_softmax(batch["teacher_logits"].astype(np.float64))
    expected = (np.exp(log_t) * (log_t - log_s)).sum(-1)[real].mean()
    got = soft_target_kl(batch["scores"], batch["teacher_logits"], batch["attention"]).numpy()
    assert got == pytest.approx(expected, rel=1e-5) and expected > 0.5
    # Zero where the student's distribution is the teacher's (a shift of the logits changes no probability).
    assert soft_target_kl(batch["teacher_logits"] + 2.0, batch["teacher_logits"], batch["attention"]).numpy() \
        == pytest.approx(0.0, abs=1e-5)
    # Not the reverse KL, nor a cross-entropy with the teacher's entropy left in.
    reverse = (np.exp(log_s) * (log_s - log_t)).sum(-1)[real].mean()
    assert abs(got - reverse) > 0.05 and abs(got - (-(np.exp(log_t) * log_s).sum(-1)[real].mean())) > 0.05
    # Padding does not count.
    scores = batch["scores"].copy()
    scores[~real] = 50.0
    assert soft_target_kl(scores, batch["teacher_logits"], batch["attention"]).numpy() == pytest.approx(got, rel=1e-6)
    assert registry.get("soft").fn is soft_target_kl and registry.get("soft").target == ("logits",)


def test_representation_mse_matches_numpy(batch):
    real = batch["attention"] == 1
    expected = ((batch["student_hidden"] - batch["teacher_hidden"]) ** 2).mean(-1)[real].mean()
    got = representation_mse(batch["student_hidden"], batch["teacher_hidden"], batch["attention"]).numpy()
    assert got == pytest.approx(expected, rel=1e-5)
    assert registry.get("representation", "mse").fn is representation_mse
    assert registry.get("representation", "kld").fn is representation_kld


def test_representation_kld_is_kl_teacher_to_student_over_hidden_dim(batch):
    real = batch["attention"] == 1
    log_s = _log_softmax(batch["student_hidden"].astype(np.float64))
    log_t = _log_softmax(batch["teacher_hidden"].astype(np.float64))
    forward = (np.exp(log_t) * (log_t - log_s)).sum(-1)[real].mean()
    reverse = (np.exp(log_s) * (log_s - log_t)).sum(-1)[real].mean()
    got = representation_kld(batch["student_hidden"], batch["teacher_hidden"], batch["attention"]).numpy()
    assert got == pytest.approx(forward, rel=1e-5)
    assert abs(forward - reverse) > 1e-2  # the direction is tested, not just symmetric agreement
    spoiled = representation_kld(_spoil_padding(batch["student_hidden"], batch["attention"]),
                                 batch["teacher_hidden"], batch["attention"])
    assert spoiled.numpy() == pytest.approx(got, rel=1e-6)
    # Shift-invariant per token: softmax forgets a constant added to all dims (why MSE is the default).
    shifted = representation_kld(batch["student_hidden"] + 3.0, batch["teacher_hidden"], batch["attention"])
    assert shifted.numpy() == pytest.approx(got, rel=1e-4)


def test_sentence_level_shapes_and_empty_mask():
    student, teacher = np.ones((4, 3), np.float32), np.zeros((4, 3), np.float32)
    assert representation_mse(student, teacher, np.array([1, 1, 0, 0])).numpy() == pytest.approx(1.0)
    assert logit_mse(student, teacher, np.zeros(4)).numpy() == 0.0
    with pytest.raises(ValueError, match="kld"):
        registry.get("representation", "cosine")


def test_losses_are_differentiable_through_tf_function(batch):
    scores = tf.Variable(batch["scores"])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = cross_entropy(scores, batch["labels"],
                                 label_mask(batch["labels"], batch["attention"], PAD))
        return tape.gradient(loss, scores)

    grad = step().numpy()
    assert np.all(grad[batch["attention"] == 0] == 0) and np.abs(grad).sum() > 0
