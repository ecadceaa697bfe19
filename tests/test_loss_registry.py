"""The loss registry: each entry's function, called (prediction, target, mask), gives its formula's value
(numpy, brute force over every label sequence for the CRF losses); docs/equations.md is what it generates."""
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, TOY_LABELS
from test_sequence_losses import _enumerate
from xtremedistil_tf.crf import ops
from xtremedistil_tf.losses import registry
from xtremedistil_tf.losses.reduce import masked_mean
from xtremedistil_tf.teachers.classifier import build_sequence_teacher
from xtremedistil_tf.teachers.crf_head import build_crf_teacher
from xtremedistil_tf.teachers.finetune import loss_count
from xtremedistil_tf.teachers.model import build_teacher

B, T, N, H = 3, 4, 3, 5
LENGTHS = np.array([4, 2, 3])
RNG = np.random.default_rng(7)
REAL = (np.arange(T)[None] < LENGTHS[:, None]).astype(np.float32)


def _normal(*shape, scale=1.0):
    return (RNG.normal(0, scale, shape)).astype(np.float32)


def _log_softmax(x):
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _mean(values, mask):
    return (values * mask).sum() / mask.sum()


def _crf_case():
    """Student CRF, brute-force path probabilities of student and teacher, teacher's top-2 paths."""
    s_pots, t_pots = _normal(B, T, N, scale=1.5), _normal(B, T, N, scale=0.7)
    s_trans, t_trans = _normal(N, N), _normal(N, N)
    student = [_enumerate(s_pots[b], s_trans, n) for b, n in enumerate(LENGTHS)]
    teacher = [_enumerate(t_pots[b], t_trans, n) for b, n in enumerate(LENGTHS)]
    k = 2
    tags, probs = np.zeros((B, k, T), np.int32), np.zeros((B, k), np.float32)
    for b, n in enumerate(LENGTHS):
        for j, (path, q) in enumerate(sorted(teacher[b].items(), key=lambda item: -item[1])[:k]):
            tags[b, j, :n], probs[b, j] = path, q
    return (s_pots, s_trans), student, teacher, (tags, probs, np.ones((B, k), bool))


def _marginals(dists):
    out = np.zeros((B, T, N))
    for b, dist in enumerate(dists):
        for path, q in dist.items():
            out[b, np.arange(len(path)), path] += q
    return out


def _ce():
    scores, labels = _normal(B, T, N), RNG.integers(0, N, (B, T))
    mask = REAL.copy()
    mask[0, 1] = 0  # an unlabeled piece
    picked = np.take_along_axis(_log_softmax(scores), labels[..., None], -1)[..., 0]
    return scores, labels, mask, _mean(-picked, mask)


def _mse(width):
    def case():
        student, teacher = _normal(B, T, width), _normal(B, T, width, scale=2.0)
        return student, teacher, REAL, _mean(((student - teacher) ** 2).mean(-1), REAL)
    return case


def _softmax_kl(width):
    def case():
        student, teacher = _normal(B, T, width), _normal(B, T, width, scale=2.0)
        log_s, log_t = _log_softmax(student), _log_softmax(teacher)
        return student, teacher, REAL, _mean((np.exp(log_t) * (log_t - log_s)).sum(-1), REAL)
    return case


def _hard():
    prediction, student, _, _ = _crf_case()
    tags = RNG.integers(0, N, (B, T)).astype(np.int32)
    mask = REAL.copy()
    mask[1] = 0  # an unlabeled row without surrogates: not counted
    nll = [-np.log(student[b][tuple(tags[b, :n])]) for b, n in enumerate(LENGTHS) if b != 1]
    return prediction, tags, mask, np.mean(nll)


def _kbest_masses():
    prediction, student, _, target = _crf_case()
    tags, probs, _ = target
    p_s = np.array([[student[b][tuple(tags[b, j, :n])] for j in range(tags.shape[1])] for b, n in enumerate(LENGTHS)])
    return prediction, target, probs.astype(np.float64), p_s


def _seq_ce():
    prediction, target, p_t, p_s = _kbest_masses()
    value = -(p_t * np.log(p_s)).sum(1) - (1 - p_t.sum(1)) * np.log(1 - p_s.sum(1))
    return prediction, target, REAL, value.mean()


def _seq_fuzzy():
    prediction, target, p_t, p_s = _kbest_masses()
    mass_t, mass_s = p_t.sum(1), p_s.sum(1)
    return prediction, target, REAL, (-mass_t * np.log(mass_s) - (1 - mass_t) * np.log(1 - mass_s)).mean()


def _token_value(p_t, log_p_s, variant):
    per_token = -(p_t * log_p_s).sum(-1)
    if variant == "kl":
        per_token += np.where(p_t > 0, p_t * np.log(np.maximum(p_t, 1e-300)), 0.0).sum(-1)
    return _mean(per_token, REAL)


def _token_em(variant):
    def case():
        student, teacher = _normal(B, T, N, scale=2.0), _normal(B, T, N, scale=2.0)
        return student, teacher, REAL, _token_value(np.exp(_log_softmax(teacher)), _log_softmax(student), variant)
    return case


def _token_pos(variant):
    def case():
        prediction, student, teacher, _ = _crf_case()
        q_s, q_t = _marginals(student), _marginals(teacher)
        log_q_s = np.log(np.maximum(q_s, 1e-30))
        return prediction, q_t.astype(np.float32), REAL, _token_value(q_t, log_q_s, variant)
    return case


def _hidden_states():
    pairs = [(1, 1), (2, 1), (2, 3)]
    teacher = [_normal(B, T, H) for _ in range(4)]
    projected = {pair: _normal(B, T, H, scale=1.5) for pair in pairs}
    expected = sum(_mean(((projected[(i, j)] - teacher[j]) ** 2).mean(-1), REAL) for i, j in pairs)
    return projected, teacher, REAL, expected


def _relations(x, heads):
    d = x.shape[-1] // heads
    split = x.reshape(B, T, heads, d).transpose(0, 2, 1, 3).astype(np.float64)
    return split @ split.transpose(0, 1, 3, 2) / np.sqrt(d) + (REAL[:, None, None, :] - 1) * 1e9


def _minilm_v2():
    heads = 48  # the paper's relation heads, the function's default
    student = {r: _normal(B, T, heads) for r in ("query", "key", "value")}
    teacher = {r: _normal(B, T, 2 * heads, scale=2.0) for r in ("query", "key", "value")}
    expected = 0.0
    for r in student:
        log_s, log_t = _log_softmax(_relations(student[r], heads)), _log_softmax(_relations(teacher[r], heads))
        kl = (np.exp(log_t) * (log_t - log_s) * REAL[:, None, None, :]).sum(-1)  # [B, heads, T]
        expected += _mean(kl, np.broadcast_to(REAL[:, None, :], kl.shape))
    return student, teacher, REAL, expected


def _class_ce():
    scores, labels = _normal(B, N), RNG.integers(0, N, B)
    mask = np.array([1.0, 0.0, 1.0], np.float32)  # a text without a label
    picked = np.take_along_axis(_log_softmax(scores), labels[:, None], -1)[:, 0]
    return scores, labels, mask, _mean(-picked, mask)


def _variable_mse():
    projected, target = _normal(4, 6), _normal(4, 6, scale=2.0)
    return projected, target, None, ((projected - target) ** 2).mean()


def _mlm():
    logits, labels = _normal(7, 11), RNG.integers(0, 11, 7)
    return logits, labels, None, -np.take_along_axis(_log_softmax(logits), labels[:, None], -1).mean()


CASES = {"ce": _ce, "logits": _mse(N), "representation/mse": _mse(H), "representation/kld": _softmax_kl(H), "soft": _softmax_kl(N),
         "hard": _hard, "seq_ce": _seq_ce, "seq_fuzzy": _seq_fuzzy,
         "token_em/ce": _token_em("ce"), "token_em/kl": _token_em("kl"),
         "token_pos/ce": _token_pos("ce"), "token_pos/kl": _token_pos("kl"),
         "hidden_states": _hidden_states, "minilm_v2": _minilm_v2,
         "shared_projection/down": _variable_mse, "shared_projection/up": _variable_mse, "mlm": _mlm,
         "teacher_token_ce": _ce, "teacher_crf_nll": _hard, "teacher_class_ce": _class_ce}


def test_every_entry_has_a_case():
    assert sorted(CASES) == sorted(registry.LOSSES)


@pytest.mark.parametrize("key", list(CASES))
def test_entry_gives_its_formula(key):
    loss = registry.LOSSES[key]
    prediction, target, mask, expected = CASES[key]()
    got = float(loss.fn(prediction, target, mask))
    assert got == pytest.approx(expected, rel=1e-4)
    if loss.mean_over is None:
        # The loops' path: outputs and batch dicts read by the entry's keys give the same value.
        pick = lambda keys, value: dict(zip(keys, value if len(keys) > 1 else (value,)))
        assert float(loss(pick(loss.prediction, prediction), pick(loss.target, target), mask)) == pytest.approx(got)


def test_counts_are_the_positions_or_rows_the_losses_average_over():
    batch = {"attention_mask": REAL.astype(np.int32), "label_ids": np.where(REAL > 0, 1, 0)}
    batch["label_ids"][1, 0] = 0  # row 1 has a [PAD] tag inside its length: unlabeled
    labeled = registry.get("ce").mask(batch, pad_id=0)
    assert float(registry.get("ce").count(labeled)) == REAL.sum() - 1
    hard = registry.get("hard")
    assert float(hard.count(hard.mask(batch, pad_id=0))) == 2  # labeled rows
    with_surrogates = {**batch, "kbest_tags": np.zeros((B, 2, T), np.int32)}
    assert float(hard.count(hard.mask(with_surrogates, pad_id=0))) == B  # every row learns a target
    assert float(registry.get("token_pos").count(registry.get("token_pos").mask(batch, 0))) == REAL.sum()


def test_lookups_and_variants():
    assert registry.names(registry.XTREMEDISTIL) == ("ce", "logits", "representation")
    assert registry.names(registry.MULTI_GRAINED) == ("hard", "seq_ce", "seq_fuzzy", "token_em", "token_pos")
    assert registry.names(registry.TEACHERS) == ("teacher_token_ce", "teacher_crf_nll", "teacher_class_ce")
    assert registry.variants("token_em") == ("ce", "kl") and registry.variants("representation") == ("mse", "kld")
    assert registry.get("representation").key == "representation/mse"
    assert registry.get("token_pos", "kl").key == "token_pos/kl" and registry.get("hard", "kl").key == "hard"
    with pytest.raises(ValueError, match="unknown loss 'nope'; known losses ce, logits"):
        registry.get("nope")


def test_each_teacher_trains_on_its_entry(tiny_bert_dir):
    """Each teacher head's fine-tuning loss (`teacher.loss`, what teachers/finetune.py minimises) is
    the registry entry its `LOSS` names, over that entry's positions, and `loss_count` (what a replica's
    share weights under tf.distribute) counts them: labeled pieces, labeled windows, labeled texts."""
    tf.keras.utils.set_random_seed(0)
    directory = str(tiny_bert_dir)
    lengths = np.array([6, 4, 5])
    real = (np.arange(6)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(real > 0, RNG.integers(8, 30, real.shape), 0).astype(np.int32)
    token, _ = build_teacher(directory, TOY_LABELS, max_seq_length=16, random_init=True)
    crf, _ = build_crf_teacher(directory, TOY_LABELS, "IOB2", max_seq_length=16, random_init=True)
    classifier, _ = build_sequence_teacher(directory, ["pos", "neg"], max_seq_length=16, random_init=True)
    assert (token.LOSS, crf.LOSS, classifier.LOSS) == ("teacher_token_ce", "teacher_crf_nll", "teacher_class_ce")

    tags = np.where(real > 0, RNG.integers(0, len(TOY_LABELS), real.shape), token.tag_vocab.pad_id).astype(np.int32)
    tags[1, 2] = token.tag_vocab.pad_id  # an unlabeled piece: row 1 is an unlabeled window
    batch = {"input_ids": ids, "attention_mask": real, "label_ids": tags}
    counted = real * (tags != token.tag_vocab.pad_id)
    picked = np.take_along_axis(_log_softmax(token(batch).numpy()), tags[..., None], -1)[..., 0]
    assert float(token.loss(batch)) == pytest.approx(_mean(-picked, counted), rel=1e-5)
    assert float(loss_count(token, batch)) == counted.sum()

    potentials = crf.potentials(batch)
    nll = -ops.crf_log_likelihood(potentials, tags, lengths, crf.transitions).numpy()
    assert float(crf.loss(batch)) == pytest.approx(nll[[0, 2]].mean(), rel=1e-5)
    assert float(loss_count(crf, batch)) == 2

    labels = np.array([0, classifier.tag_vocab.pad_id, 1], np.int32)  # the second text has no label
    texts = {**batch, "label_ids": labels}
    picked = np.take_along_axis(_log_softmax(classifier(texts).numpy()), np.maximum(labels, 0)[:, None], -1)[:, 0]
    assert float(classifier.loss(texts)) == pytest.approx(-picked[[0, 2]].mean(), rel=1e-5)
    assert float(loss_count(classifier, texts)) == 2


def test_every_entry_names_a_test_that_exists():
    for loss in registry.ENTRIES:
        path, name = loss.test.split("::")
        assert f"def {name}(" in (REPO / path).read_text(encoding="utf-8"), loss.test


def test_docs_equations_md_is_generated_from_the_registry():
    """Regenerate with `python -m xtremedistil_tf.losses.registry > docs/equations.md`."""
    assert (REPO / "docs" / "equations.md").read_text(encoding="utf-8") == registry.markdown()
    out = subprocess.run([sys.executable, "-m", "xtremedistil_tf.losses.registry"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    assert out == registry.markdown()


def test_one_masked_mean():
    values = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert float(masked_mean(values, [[1, 0, 1], [0, 0, 0]])) == 2.0
    assert float(masked_mean(values, tf.zeros([2, 3]))) == 0.0
    assert float(masked_mean(values)) == 3.5
    assert float(masked_mean(values, [[1.0], [0.0]])) == 2.0  # broadcast over the last axis
