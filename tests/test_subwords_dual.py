"""Dual segmentation: p = 0 / 1 give the teacher only its own / only student pieces; masked words are the
same for both models and labelled in the vocabulary they were segmented with."""
import numpy as np
import pytest

from subwords_helpers import corpus, tokenizer_pair
from xtremedistil_tf.methods.subwords.dual import IGNORE, Specials, build_batch, dual_corpus


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    student, teacher = tokenizer_pair(tmp_path_factory.mktemp("dual"))
    sentences = dual_corpus(student, teacher, corpus(40, seed=1))
    return sentences, Specials.of(student), Specials.of(teacher)


def _words_of_row(ids, flags, labels, sentence):
    """Split a teacher row back into words using the segmentation lengths each flag implies."""
    pos, words = 1, []
    for s_word, t_word in zip(sentence.student, sentence.teacher):
        flag = flags[pos]
        n = len(s_word) if flag else len(t_word)
        assert set(flags[pos:pos + n]) == {flag}
        words.append((flag, list(ids[pos:pos + n]), list(labels[pos:pos + n])))
        pos += n
    return words


@pytest.mark.parametrize("p", [0.0, 1.0, 0.5])
def test_teacher_inputs_follow_p_and_labels_use_the_segmenting_vocabulary(setup, p):
    sentences, s_spec, t_spec = setup
    batch = build_batch(sentences, np.random.default_rng(3), s_spec, t_spec, p=p, mask_prob=0.3, train=False)
    flags_seen = set()
    for b, sentence in enumerate(sentences):
        words = _words_of_row(batch["t_ids"][b], batch["t_is_student"][b], batch["t_labels"][b], sentence)
        for (flag, ids, labels), s_word, t_word in zip(words, sentence.student, sentence.teacher):
            flags_seen.add(flag)
            original = list(s_word if flag else t_word)
            if labels[0] == IGNORE:     # not masked: the word's pieces of the chosen vocabulary
                assert ids == original and labels == [IGNORE] * len(ids)
            else:                       # masked: that vocabulary's [MASK], labels its pieces
                assert ids == [(s_spec if flag else t_spec).mask] * len(ids) and labels == original
    assert flags_seen == {0: {0}, 1: {1}, 0.5: {0, 1}}[p]
    # [CLS]/[SEP] are the teacher's own tokens.
    assert (batch["t_ids"][:, 0] == t_spec.cls).all()


def test_both_models_predict_the_same_words_and_the_student_reads_only_its_segmentation(setup):
    sentences, s_spec, t_spec = setup
    batch = build_batch(sentences, np.random.default_rng(5), s_spec, t_spec, p=0.5, mask_prob=0.3, train=False)
    for b, sentence in enumerate(sentences):
        s_ids = [i for i in batch["s_ids"][b] if i != s_spec.pad][1:-1]
        s_labels = batch["s_labels"][b][1:len(s_ids) + 1]
        t_words = _words_of_row(batch["t_ids"][b], batch["t_is_student"][b], batch["t_labels"][b], sentence)
        pos = 0
        for (flag, _, t_labels), s_word in zip(t_words, sentence.student):
            student_masked = s_labels[pos] != IGNORE
            assert student_masked == (t_labels[0] != IGNORE)
            expected = [s_spec.mask] * len(s_word) if student_masked else list(s_word)
            assert s_ids[pos:pos + len(s_word)] == expected
            pos += len(s_word)
        assert (batch["s_word"][b][1:pos + 1] >= 0).all()


def test_the_student_batch_does_not_depend_on_building_the_teacher_batch(setup):
    sentences, s_spec, t_spec = setup
    with_teacher = build_batch(sentences, np.random.default_rng(9), s_spec, t_spec, train=True)
    alone = build_batch(sentences, np.random.default_rng(9), s_spec, t_spec, train=True, with_teacher=False)
    for key in ("s_ids", "s_labels", "s_attn", "s_word"):
        np.testing.assert_array_equal(with_teacher[key], alone[key])
    assert "t_ids" not in alone


def test_training_masks_replace_about_80_percent_with_mask_and_10_with_random(setup):
    sentences, s_spec, t_spec = setup
    rng = np.random.default_rng(0)
    masked = mask_tokens = kept = 0
    for _ in range(30):
        batch = build_batch(sentences, rng, s_spec, t_spec, mask_prob=0.5, with_teacher=False)
        at = batch["s_labels"] != IGNORE
        masked += at.sum()
        mask_tokens += (batch["s_ids"][at] == s_spec.mask).sum()
        kept += (batch["s_ids"][at] == batch["s_labels"][at]).sum()
    assert 0.75 < mask_tokens / masked < 0.85
    assert 0.08 < kept / masked < 0.16     # the 10% kept, plus random draws that hit the right piece


def test_long_sentences_are_cut_to_max_len_in_both_segmentations(setup):
    sentences, s_spec, t_spec = setup
    batch = build_batch(sentences, np.random.default_rng(1), s_spec, t_spec, max_len=8)
    assert batch["s_ids"].shape[1] <= 8 and batch["t_ids"].shape[1] <= 8
    assert ((batch["s_labels"] != IGNORE).sum(1) > 0).all()
