"""crf/decoding.py: softmax students' word tags decoded under the tag scheme (constrained) or by argmax,
in TensorFlow (WordDecoder) and in the shipped predict.py's NumPy (portable.decode_words), against brute force."""
import itertools
import sys

import numpy as np
import pytest

from conftest import REPO
from xtremedistil_tf.crf import ops as crf_ops
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.data.schemes import validate_tags
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.crf.decoding import WordDecoder, check_decode

sys.path.insert(0, str(REPO / "xtremedistil_tf" / "export"))
import portable  # noqa: E402  (the shipped predict.py)

LABELS = {"IOB2": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
          "IOB1": ["O", "B-PER", "I-PER"],
          "BIOES": ["O", "B-PER", "I-PER", "E-PER", "S-PER"],
          "BMES": ["O", "B-NR", "M-NR", "E-NR", "S-NR"]}


def _decoder(scheme, decode="constrained"):
    vocab = TagVocab(LABELS[scheme])
    return WordDecoder(vocab.tags, vocab.labels, scheme, decode)


def _both(decoder, probs):
    """(labels, scores) of one text's word probs [n, tags] from the TF decoder and from predict.py's NumPy."""
    ids, scores = (t.numpy()[0] for t in decoder(probs[None], np.array([len(probs)])))
    meta = decoder.export_meta()
    np_ids, np_scores = portable.decode_words(probs, meta)
    return (ids, scores), (np.asarray(np_ids), np_scores)


def _brute_force(labels, scheme, probs, num_labels):
    """The most probable valid label sequence: every sequence checked by schemes.validate_tags, each word
    scoring the best probability among the tags that read as its label (markers read as O)."""
    folded = probs[:, :num_labels].copy()
    folded[:, labels.index("O")] = np.maximum(folded[:, labels.index("O")], probs[:, num_labels:].max(1))
    best, best_score = None, -np.inf
    for path in itertools.product(range(num_labels), repeat=len(probs)):
        if validate_tags([labels[i] for i in path], scheme) is None:
            score = np.log(folded[np.arange(len(probs)), path]).sum()
            if score > best_score:
                best, best_score = list(path), score
    return best


def test_o_then_i_per_becomes_the_best_valid_sequence():
    """Argmax reads `O I-PER`; constrained decoding returns the best valid path, found by brute force."""
    decoder, argmax = _decoder("IOB2"), _decoder("IOB2", "argmax")
    #                 O     B-PER I-PER B-LOC I-LOC X     [CLS] [SEP] [PAD]
    probs = np.array([[0.50, 0.30, 0.05, 0.05, 0.02, 0.02, 0.02, 0.02, 0.02],
                      [0.05, 0.20, 0.45, 0.10, 0.10, 0.04, 0.02, 0.02, 0.02],
                      [0.90, 0.02, 0.02, 0.02, 0.01, 0.01, 0.01, 0.005, 0.005]], np.float32)
    labels = LABELS["IOB2"]
    (tf_ids, tf_scores), (np_ids, np_scores) = _both(argmax, probs)
    assert [labels[i] for i in tf_ids] == [labels[i] for i in np_ids] == ["O", "I-PER", "O"]
    (tf_ids, tf_scores), (np_ids, np_scores) = _both(decoder, probs)
    # B-PER I-PER O (0.30 * 0.45 * 0.9) beats O B-PER O (0.50 * 0.20 * 0.9) and O O O (0.5 * 0.05 * 0.9).
    assert [labels[i] for i in tf_ids] == [labels[i] for i in np_ids] == ["B-PER", "I-PER", "O"]
    assert list(tf_ids) == _brute_force(labels, "IOB2", probs, len(labels))
    np.testing.assert_allclose(tf_scores, [0.30, 0.45, 0.90], atol=1e-6)
    np.testing.assert_allclose(np_scores, tf_scores, atol=1e-6)


@pytest.mark.parametrize("scheme", sorted(LABELS))
def test_constrained_is_the_brute_force_best_valid_sequence(scheme):
    """Random probabilities (markers included): TF and NumPy both give the brute-force best valid sequence;
    the argmax is invalid in some of the cases, so the constraint is exercised."""
    labels = LABELS[scheme]
    decoder, argmax = _decoder(scheme), _decoder(scheme, "argmax")
    num_tags = len(TagVocab(labels))
    rng = np.random.default_rng(0)
    invalid_argmax = 0
    for n in (1, 2, 3, 4):
        for _ in range(6):
            probs = rng.dirichlet(np.full(num_tags, 0.5), size=n).astype(np.float32)
            expected = _brute_force(labels, scheme, probs, len(labels))
            (tf_ids, _), (np_ids, _) = _both(decoder, probs)
            assert list(tf_ids) == list(np_ids) == expected, (scheme, probs)
            (plain, _), _ = _both(argmax, probs)
            if validate_tags([labels[i] for i in plain], scheme) is None:
                assert list(plain) == expected  # constrained changes nothing where the argmax is valid
            else:
                invalid_argmax += 1
    assert invalid_argmax >= 3


def test_a_valid_argmax_is_kept_where_the_viterbi_sum_cannot_tell_two_labels_apart():
    """40 improbable words (log -86.8 each) then a word where B-PER (0.40001) beats O (0.4): the argmax path
    O ... O B-PER is valid, so it is the answer in TF and NumPy. Plain Viterbi gives O there: at a running sum of
    -3386 a float32 step is 2.4e-4, the two labels differ by 2.5e-5, and the tie goes to the lower label id."""
    decoder = _decoder("IOB2")
    n = 40
    probs = np.full((n, len(TagVocab(LABELS["IOB2"]))), 1e-38, np.float32)
    probs[:, 0] = 2e-38
    probs[-1] = 0.0
    probs[-1, :2] = [0.4, 0.40001]
    (tf_ids, tf_scores), (np_ids, _) = _both(decoder, probs)
    assert list(tf_ids) == list(np_ids) == [0] * (n - 1) + [1]
    assert tf_scores[-1] == np.float32(0.40001)
    potentials = np.log(np.maximum(decoder.label_scores(probs[None]).numpy()[0], np.finfo(np.float32).tiny))
    assert portable.viterbi(potentials, decoder.transitions)[-1] == 0          # what decoding did before
    assert crf_ops.crf_decode(potentials[None], decoder.transitions, np.array([n]))[0].numpy()[0, -1] == 0


def test_each_text_of_a_batch_is_decoded_alone():
    """A batch with a valid argmax (text 0), an invalid one (text 1: O I-PER) and a short text (2): each row's
    labels are those of the text decoded on its own; the Viterbi runs for the batch, the valid row keeps its argmax."""
    decoder = _decoder("IOB2")
    num_tags = len(TagVocab(LABELS["IOB2"]))
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.full(num_tags, 0.5), size=(3, 4)).astype(np.float32)
    probs[0, :, 0] += 2.0                                  # all O
    probs[1, 0, 0] += 2.0
    probs[1, 1, 2] += 2.0                                  # O I-PER: invalid
    lengths = np.array([4, 4, 2])
    ids = decoder(probs, lengths)[0].numpy()
    assert ids[0].tolist() == [0, 0, 0, 0] and ids[1, :2].tolist() != [0, 2] and ids[2, 2:].tolist() == [0, 0]
    for row, n in enumerate(lengths):
        alone = decoder(probs[row:row + 1, :n], lengths[row:row + 1])[0].numpy()[0]
        assert ids[row, :n].tolist() == alone.tolist() == _brute_force(LABELS["IOB2"], "IOB2", probs[row, :n], 5)


def test_marker_at_a_first_piece_reads_as_o_and_lengths_cut_the_batch():
    decoder = _decoder("BIOES")
    x = TagVocab(LABELS["BIOES"]).x_id
    probs = np.full((2, 3, len(TagVocab(LABELS["BIOES"]))), 0.01, np.float32)
    probs[:, :, x] = 0.9  # X wins everywhere: every word reads as O with X's probability
    probs[1, 0, 4] = 0.95  # S-PER at the second text's first word
    ids, scores = (t.numpy() for t in decoder(probs, np.array([3, 1])))
    assert ids[0].tolist() == [0, 0, 0] and ids[1, 0] == 4
    np.testing.assert_allclose(scores[0], [0.9] * 3, atol=1e-6)


def test_bad_decode_is_one_line():
    with pytest.raises(ConfigError, match="^--decode=viterbi: expected one of constrained, argmax$"):
        check_decode("viterbi")
