"""The student vocabulary learner: requested size, no [UNK] on training words, saved and reloaded."""
import pytest
from subwords_helpers import corpus

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.subwords.vocab import (
    learn_vocab,
    load_vocab_tokenizer,
    pieces_per_word,
    save_vocab,
    vocab_stats,
)


def test_learned_vocabulary_has_the_requested_size_and_no_unk_on_training_words(tmp_path):
    text = corpus()
    for size in (40, 90):
        tokenizer = learn_vocab(text, size)
        assert tokenizer.get_vocab_size() == size
        save_vocab(tokenizer, tmp_path / str(size))
        lines = (tmp_path / str(size) / "vocab.txt").read_text(encoding="utf-8").splitlines()
        assert len(lines) == size and lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        fast = load_vocab_tokenizer(tmp_path / str(size))
        words, pieces, unks = pieces_per_word(fast, text)
        # Every character of the training text is in the alphabet, so the stated [UNK] rate is 0.
        assert unks == 0 and words == sum(len(s) for s in text)
        # A smaller vocabulary never needs fewer pieces per word.
        if size == 40:
            small_pieces = pieces
    assert pieces <= small_pieces


def test_saved_tokenizer_splits_like_the_learned_one_with_the_teachers_normalisation(tmp_path):
    tokenizer = learn_vocab(corpus(), 80)
    save_vocab(tokenizer, tmp_path / "v")
    fast = load_vocab_tokenizer(tmp_path / "v")
    text = "Kalomi RUSA café, vobedu."
    assert fast.tokenize(text) == tokenizer.encode(text, add_special_tokens=False).tokens
    # Uncased and accent-stripped, as the MiniLM/BERT-uncased teacher: "Café" is "cafe".
    assert fast.tokenize("Café") == fast.tokenize("cafe")
    assert fast.tokenize("RUSA") == fast.tokenize("rusa")


def test_stats_count_overlap_and_pieces_per_word_by_brute_force(tmp_path):
    text = corpus()
    for name, size in (("s", 50), ("t", 150)):
        save_vocab(learn_vocab(text, size), tmp_path / name)
    student, teacher = load_vocab_tokenizer(tmp_path / "s"), load_vocab_tokenizer(tmp_path / "t")
    stats = vocab_stats(student, teacher, text[:50])
    assert stats.overlap == len(set(student.get_vocab()) & set(teacher.get_vocab()))
    words = [w for s in text[:50] for w in s]
    assert stats.words == len(words)
    assert stats.student_pieces_per_word == pytest.approx(sum(len(student.tokenize(w)) for w in words) / len(words))
    assert stats.teacher_pieces_per_word == pytest.approx(sum(len(teacher.tokenize(w)) for w in words) / len(words))


def test_a_vocabulary_the_text_cannot_fill_is_refused():
    with pytest.raises(ConfigError, match="fewer than --vocab_size=5000"):
        learn_vocab([["ab", "ba"]], 5000)
