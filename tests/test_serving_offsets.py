"""Issue 16, items 7 and 8: served offsets and words against the text and the training tokenizer.

The unit (docs/serving.md, Offsets): code points of the text as Python's
bytes.decode("utf-8", errors="replace") gives it. The served word split is the training
tokenizer's (Hugging Face BertTokenizerFast: its normalizer and pre-tokenizer); the oracle below
reads it from the tokenizer's own word ids and character offsets.
"""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, TOY_LABELS
from tokenizers import Tokenizer
from transformers import BertTokenizerFast

from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.export.formats import write_tokenizer
from xtremedistil_tf.export.portable import read_lines, word_spans
from xtremedistil_tf.export.serving import NerServing, valid_utf8
from xtremedistil_tf.export.words import WordPieces, bert_char_classes, compute_char_classes
from xtremedistil_tf.students.artifact import StudentMeta, read_vocab, write_student_dir
from xtremedistil_tf.students.models import build_bilstm_student

PUNCTUATION = ["wait… Justin Bieber", "…", "‼", "⑴", "㈱", "a‼b ⑴c ㈱d…e", "Ｐaris", "naïve café",
               "x\u0301 \u0301y", "tab\tcr\rnul\x00end", "中国 , mary"]


def fuzz_bytes(n=2000, seed=16):
    """`n` random byte strings (0 to 39 bytes, every byte value), then the punctuation cases."""
    rng = random.Random(seed)
    data = [bytes(rng.randrange(256) for _ in range(rng.randrange(40))) for _ in range(n)]
    return data + [text.encode("utf-8") for text in PUNCTUATION]


def training_words(tokenizer, text):
    """[(start, end)] character offsets of the words the training tokenizer makes of `text` (its
    pieces grouped by word id)."""
    encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    spans = {}
    for word, (start, end) in zip(encoding.word_ids, encoding.offsets):
        first, last = spans.get(word, (start, end))
        spans[word] = (min(first, start), max(last, end))
    return list(spans.values()), encoding.ids


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory, tiny_tokenizer, tiny_tokenizer_dir):
    """An untrained tiny BiLSTM student: random weights tag plenty of words as entities."""
    tf.keras.utils.set_random_seed(16)
    model = build_bilstm_student(tiny_tokenizer.vocab_size, len(TagVocab(TOY_LABELS)), embedding_dim=8, hidden=8,
                                 teacher_hidden=8, dropout=0.0)
    return write_student_dir(model, tmp_path_factory.mktemp("student"), StudentMeta(TOY_LABELS),
                             tiny_tokenizer_dir / "vocab.txt")


@pytest.fixture(scope="module")
def served(student_dir):
    """The serving graph's outputs on the fuzz texts (the module is kept: its tf.function holds it weakly)."""
    module = NerServing.from_student_dir(student_dir)
    return {k: v.numpy() for k, v in module.serve(tf.constant(fuzz_bytes())).items()}


def test_stored_char_classes_are_the_installed_tokenizers():
    for lower_case in (True, False):
        assert bert_char_classes(lower_case) == compute_char_classes(lower_case), \
            "tokenizers changed: run python -m xtremedistil_tf.export.words"


def test_invalid_utf8_is_replaced_as_python_decodes_it():
    data = fuzz_bytes() + [b"\xed\xa0\x80", b"\xc0\x80", b"\xe2\x80y", b"\xf4\x90\x80\x80", b"\xf0\x9f\x98"]
    got = [t.decode("utf-8") for t in valid_utf8(tf.constant(data)).numpy()]
    assert got == [b.decode("utf-8", errors="replace") for b in data]
    assert got[-3] == "\ufffdy"   # one U+FFFD for the cut-short sequence, not one per byte


@pytest.mark.parametrize("lower_case", [True, False])
def test_served_words_and_pieces_are_the_training_tokenizers(tiny_tokenizer_dir, lower_case):
    tokenizer = BertTokenizerFast(vocab_file=str(tiny_tokenizer_dir / "vocab.txt"), do_lower_case=lower_case)
    served = WordPieces(read_vocab(tiny_tokenizer_dir / "vocab.txt"), lower_case)
    data = fuzz_bytes()
    pieces, start, end = (r.to_list() for r in served.tokenize(valid_utf8(tf.constant(data))))
    words = 0
    for i, raw in enumerate(data):
        text = raw.decode("utf-8", errors="replace")
        expected, ids = training_words(tokenizer, text)
        # Byte offsets of the replaced text, read back in characters.
        valid = text.encode("utf-8")
        got = [(len(valid[:s].decode()), len(valid[:e].decode())) for s, e in zip(start[i], end[i])]
        assert got == expected, text
        assert sum(pieces[i], []) == ids, text
        words += len(got)
    assert words > 5000
    ellipsis = data.index("wait… Justin Bieber".encode())
    # "…" is one word of one [UNK] (Justin, Bieber: [UNK] too in the lower-case vocabulary when cased)
    assert [len(p) for p in pieces[ellipsis]] == ([4, 1, 6, 6] if lower_case else [4, 1, 1, 1])


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_every_served_offset_indexes_the_text(served, tiny_tokenizer):
    data, out = fuzz_bytes(), served
    entities = 0
    for i, raw in enumerate(data):
        text = raw.decode("utf-8", errors="replace")
        n, m = out["num_words"][i], out["num_entities"][i]
        words = list(zip(out["word_start"][i][:n].tolist(), out["word_end"][i][:n].tolist()))
        assert words == training_words(tiny_tokenizer, text)[0], text
        assert all(end > start for start, end in words)
        spans = list(zip(out["entity_start"][i][:m].tolist(), out["entity_end"][i][:m].tolist()))
        assert [t.decode("utf-8") for t in out["entity_text"][i][:m]] == [text[s:e] for s, e in spans]
        starts, ends = {s for s, _ in words}, {e for _, e in words}
        assert all(s in starts and e in ends for s, e in spans)
        entities += m
    assert entities > 1000   # random weights tag many words: the span check is not vacuous


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_portable_predict_splits_words_as_the_saved_model(student_dir, served, tmp_path):
    """predict.py of ONNX/TFLite exports: the same words (tokenizer.json's encoding, no model needed)."""
    vocab = read_vocab(student_dir / "vocab.txt")
    write_tokenizer(vocab, True, tmp_path / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    continuation = np.array([p.startswith("##") for p in vocab])
    data = fuzz_bytes()
    for i, raw in enumerate(data):
        encoding = tokenizer.encode(raw.decode("utf-8", errors="replace"), add_special_tokens=False)
        n = served["num_words"][i]
        expected = list(zip(served["word_start"][i][:n].tolist(), served["word_end"][i][:n].tolist()))
        assert [(s, e) for _, s, e in word_spans(encoding.ids, encoding.offsets, continuation)] == expected


def test_read_lines_splits_at_newline_only_and_replaces_invalid_utf8(capsys):
    data = b"john in paris\r\n\xff\xfejohn\nmary\rjohn berlin\n\n\xe2\x80 last"
    assert read_lines(data, "in.txt") == ["john in paris", "\ufffd\ufffdjohn", "mary\rjohn berlin", "",
                                          "\ufffd last"]
    assert capsys.readouterr().err.splitlines() == [
        "note: in.txt:2 (and 1 more lines): invalid UTF-8, replaced by U+FFFD; offsets count each replacement "
        "character as one character"]
    assert read_lines(b"a\n\n", "x") == ["a", ""] and read_lines(b"", "x") == []


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_bin_predict_gives_one_record_per_line(student_dir, tmp_path):
    lines = [b"john in paris", b"\xff\xfejohn mary", b"mary\rjohn berlin", b"", b"paris"]
    (tmp_path / "in.txt").write_bytes(b"\n".join(lines))
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "predict"), f"--model={student_dir}",
                           f"--input={tmp_path / 'in.txt'}"], capture_output=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.decode("utf-8").splitlines()]
    assert [r["text"] for r in records] == [line.decode("utf-8", errors="replace") for line in lines]
    for record in records:
        assert all(record["text"][e["start"]:e["end"]] == e["text"] for e in record["entities"])
    assert f"note: {tmp_path / 'in.txt'}:2: invalid UTF-8" in proc.stderr.decode()
