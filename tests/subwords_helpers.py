"""Shared by tests/test_subwords_*.py: a synthetic corpus, two vocabularies learned on it, tiny BERTs."""
from __future__ import annotations

import numpy as np

from xtremedistil_tf.methods.subwords.models import build_student, student_config
from xtremedistil_tf.methods.subwords.vocab import learn_vocab, load_vocab_tokenizer, save_vocab

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "du"]


def corpus(n_sentences: int = 300, seed: int = 0):
    """Sentences of 4-9 words made of 1-3 syllables, with capitals and an accent the normaliser removes."""
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(n_sentences):
        words = ["".join(rng.choice(SYLLABLES, rng.integers(1, 4))) for _ in range(rng.integers(4, 10))]
        words[0] = words[0].capitalize()
        if rng.random() < 0.2:
            words.append("Café")
        sentences.append(words)
    return sentences


def tokenizer_pair(tmp_path, student_size: int = 60, teacher_size: int = 200):
    """(student, teacher) BertTokenizerFast learned on `corpus()`, the teacher's vocabulary larger."""
    text = corpus()
    out = []
    for name, size in (("student", student_size), ("teacher", teacher_size)):
        save_vocab(learn_vocab(text, size), tmp_path / name)
        out.append(load_vocab_tokenizer(tmp_path / name))
    return tuple(out)


def tiny_mlm(vocab_size: int, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0):
    """A built TFBertForMaskedLM with random weights, no dropout (deterministic outputs)."""
    return build_student(student_config(vocab_size, hidden, layers, heads, max_position=64, dropout=0.0), seed=seed)
