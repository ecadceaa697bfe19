import numpy as np
import pytest

from xtremedistil_tf.data.alignment import TagVocab, decode, encode, plan_windows
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError

LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]


def test_paper_tag_count_is_eleven_for_seven_labels():
    vocab = TagVocab(LABELS)
    assert len(vocab) == 11
    assert vocab.tags[7:] == ["X", "[CLS]", "[SEP]", "[PAD]"]


def test_first_piece_carries_label_and_continuations_get_x(tiny_tokenizer):
    vocab = TagVocab(LABELS)
    # "paris" is one piece; "lyon" splits into l ##y ##o ##n.
    windows = encode([Sentence(["paris", "lyon", "."], ["B-LOC", "B-LOC", "O"])],
                     tiny_tokenizer, vocab, max_seq_length=12)
    tags = [vocab.tags[i] for i in windows.label_ids[0]]
    assert tags == ["[CLS]", "B-LOC", "B-LOC", "X", "X", "X", "O", "[SEP]"] + ["[PAD]"] * 4
    assert windows.attention_mask[0].tolist() == [1] * 8 + [0] * 4
    assert windows.word_index[0, :8].tolist() == [-1, 0, 1, -1, -1, -1, 2, -1]
    pieces = tiny_tokenizer.convert_ids_to_tokens(windows.input_ids[0, :8].tolist())
    assert pieces == ["[CLS]", "paris", "l", "##y", "##o", "##n", ".", "[SEP]"]


def test_dropped_word_becomes_unk_and_keeps_its_label(tiny_tokenizer):
    vocab = TagVocab(LABELS)
    windows = encode([Sentence(["john", "\u200b", "mary"], ["B-PER", "I-PER", "I-PER"])],
                     tiny_tokenizer, vocab, max_seq_length=8)
    assert windows.input_ids[0, 2] == tiny_tokenizer.unk_token_id
    assert decode(windows, windows.label_ids, vocab) == [["B-PER", "I-PER", "I-PER"]]


def _random_sentences(rng, n, max_words):
    words = ["the", "paris", "lyon", "berlin", "a", "xyzzy", "john", "of", "42", "qwertyuiop", "."]
    sentences = []
    for _ in range(n):
        length = int(rng.integers(0, max_words + 1))
        tokens = [words[i] for i in rng.integers(0, len(words), length)]
        tags = [LABELS[i] for i in rng.integers(0, len(LABELS), length)]
        sentences.append(Sentence(tokens, tags))
    return sentences


@pytest.mark.parametrize("max_seq_length", [4, 7, 16, 64])
def test_word_labels_to_pieces_and_back_is_identity(tiny_tokenizer, max_seq_length):
    # Property: whatever the windowing, every word is owned by exactly one window and
    # decoding the encoded gold tags returns the word labels unchanged.
    rng = np.random.default_rng(max_seq_length)
    vocab = TagVocab(LABELS)
    sentences = _random_sentences(rng, 60, 40)
    windows = encode(sentences, tiny_tokenizer, vocab, max_seq_length=max_seq_length)
    assert windows.input_ids.shape[1] == max_seq_length
    assert decode(windows, windows.label_ids, vocab) == [list(s.tags) for s in sentences]
    owned = np.zeros(len(sentences), dtype=int)
    np.add.at(owned, windows.sentence_index[np.nonzero(windows.owner)[0]], 1)
    assert owned.tolist() == [len(s) for s in sentences]


def test_long_sentence_is_split_into_overlapping_windows(tiny_tokenizer):
    vocab = TagVocab(LABELS)
    sentence = Sentence(["paris"] * 1475, ["B-LOC"] * 1475)
    windows = encode([sentence], tiny_tokenizer, vocab, max_seq_length=128)
    assert len(windows) > 1475 // 126
    assert (windows.attention_mask.sum(1) <= 128).all()
    # Each word is scored where it has context on both sides: not at a window edge
    # unless it is at the sentence's own edge.
    first_owned = windows.word_index[1][windows.owner[1]]
    assert first_owned.min() > windows.word_index[1][1]
    assert decode(windows, windows.label_ids, vocab)[0] == ["B-LOC"] * 1475


def test_plan_windows_cuts_at_word_boundaries_with_overlap():
    # Five words of 3 pieces with a 6-piece budget: windows of 2 words, advancing 1 word.
    assert plan_windows([3, 3, 3, 3, 3], budget=6, stride=3) == [(0, 2), (1, 3), (2, 4), (3, 5)]
    # A word longer than the budget stands alone.
    assert plan_windows([1, 9, 1], budget=4, stride=2) == [(0, 1), (1, 2), (2, 3)]


def test_prediction_of_a_marker_at_a_word_start_reads_as_o(tiny_tokenizer):
    vocab = TagVocab(LABELS)
    windows = encode([Sentence(["john", "mary"], ["B-PER", "I-PER"])], tiny_tokenizer, vocab, max_seq_length=6)
    predicted = np.full_like(windows.label_ids, vocab.x_id)
    assert decode(windows, predicted, vocab) == [["O", "O"]]


def test_unlabeled_sentences_encode_with_pad_tags(tiny_tokenizer):
    vocab = TagVocab(LABELS)
    windows = encode([Sentence(["john", "was", "in", "paris"])], tiny_tokenizer, vocab, max_seq_length=8)
    assert (windows.label_ids == vocab.pad_id).all()
    assert windows.attention_mask[0].sum() == 6


def test_reserved_labels_are_rejected():
    with pytest.raises(ConfigError, match="reserved"):
        TagVocab(["O", "X"])
    with pytest.raises(ConfigError, match="at least 3"):
        encode([], None, TagVocab(LABELS), max_seq_length=2)
