"""Issue 43: students of XLM-R (SentencePiece Unigram) teachers exported with the tokenizer in the SavedModel, and of
RoBERTa (byte-level BPE) teachers through ONNX/TFLite, whose predict.py tokenizes with the `tokenizers` library.

The tiny XLM-R teacher's tokenizer is made here: a SentencePiece Unigram model trained with the `sentencepiece`
package on multilingual toy text, read by transformers' XLMRobertaTokenizerFast (fairseq ids, the converter's
normalizer). The oracle for every served entity is the student directory (bin/predict and bin/evaluate on it:
export.predictor.TextTagger, the teacher's tokenizer in Python on the served word split).
"""
import io
import json
import random
import shutil
import subprocess
import sys
import unicodedata
from dataclasses import asdict

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf
from conftest import TOY_LABELS, toy_ner_sentences
from test_bert_family import roberta_dir  # noqa: F401  (the tiny RoBERTa tokenizer fixture)
from test_export import ENV, LOAD_AND_CALL
from test_serving_offsets import fuzz_bytes
from transformers import AlbertTokenizerFast, CamembertTokenizerFast, XLMRobertaTokenizerFast

from xtremedistil_tf.data.alignment import TagVocab, encode
from xtremedistil_tf.data.wordsplit import split_words
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export import portable
from xtremedistil_tf.export.formats import export_portable, teacher_tokenizer
from xtremedistil_tf.export.predictor import entities, load_serving_fn, predict
from xtremedistil_tf.export.serving import export_student, valid_utf8
from xtremedistil_tf.export.words import PROBE_TEXTS, SentencePieces, grapheme_rules, training_pieces
from xtremedistil_tf.methods.student_run import save_student
from xtremedistil_tf.io import atomic_write_json
from xtremedistil_tf.students.artifact import StudentMeta, check_servable, read_config, sentencepiece_model
from xtremedistil_tf.students.models import build_bilstm_student
from xtremedistil_tf.teachers.families import BYTE_LEVEL_BPE, UNIGRAM, tokenizer_family
from xtremedistil_tf.teachers.model import load_tokenizer

MULTILINGUAL = ["Москва — столица России, Иван живёт там.", "東京は日本の首都です。北京也是首都。",
                "مرحبا بالعالم، محمد في القاهرة", "नमस्ते दुनिया, राम दिल्ली में", "Việt Nam, Hà Nội và Sài Gòn",
                "Ελλάδα και Αθήνα", "서울은 한국의 수도", "naïve café in Zürich", "😀 john 👍🏽 paris 🇫🇷"]


def unigram_model(path, seed=1, **options):
    """A SentencePiece Unigram model trained here on multilingual toy text, written to `path`; `options` go to the
    trainer (e.g. normalization_rule_name, ids)."""
    corpus = [" ".join(s.tokens) for s in toy_ner_sentences(200, seed=seed)] + MULTILINGUAL * 3
    model = io.BytesIO()
    settings = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1, vocab_size=300)
    settings.update(options)
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model, model_type="unigram",
                                             character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, **settings)
    path.write_bytes(model.getvalue())
    return path


@pytest.fixture(scope="module")
def xlmr_dir(tmp_path_factory):
    """A tiny XLM-R tokenizer: a SentencePiece Unigram model (nmt_nfkc, the default XLM-R has too) trained here."""
    directory = tmp_path_factory.mktemp("xlmr")
    unigram_model(directory / "sentencepiece.bpe.model")
    XLMRobertaTokenizerFast(vocab_file=str(directory / "sentencepiece.bpe.model")).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module", params=[True, False], ids=["albert", "xlnet_like"])
def albert_dir(request, tmp_path_factory):
    """A tiny ALBERT tokenizer over a SentencePiece model trained here: its fast tokenizer normalizes with NFKD,
    accents stripped and (do_lower_case, ALBERT's default) lower case before the model's map; without lower case
    its normalizer is XLNet's (NFKD, accents stripped)."""
    directory = tmp_path_factory.mktemp("albert")
    unigram_model(directory / "spiece.model", pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                  control_symbols=["[CLS]", "[SEP]", "[MASK]"])
    AlbertTokenizerFast(vocab_file=str(directory / "spiece.model"),
                        do_lower_case=request.param).save_pretrained(str(directory))
    return directory


def decoded_bytes(n, seed):
    """`n` random byte strings (test_serving_offsets.fuzz_bytes) read as text, invalid UTF-8 replaced by U+FFFD."""
    return [b.decode("utf-8", errors="replace") for b in fuzz_bytes(n, seed)]


def fuzz_texts(n=1500, seed=43):
    """Random bytes (test_serving_offsets), then `n` texts of words from several scripts with combining marks
    (composed and decomposed: Vietnamese in NFD), emoji with skin tones and flags, and U+FFFD before marks."""
    rng = random.Random(seed)
    pools = ["john mary paris berlin", "Москва Иван столица", "東京北京日本首都", "محمد القاهرة بالعالم",
             "नमस्ते दिल्ली राम", "ΑθήναΕλλάδα", "서울한국", "😀👍🏽🇫🇷❤️", ".,;:!?'\"()-—…"]
    marks = ["\u0301", "\u0300", "\u0302", "\u0323", "\u0308", "\u064e", "\u093c", "\ufe0f"]
    texts = decoded_bytes(800, seed)
    for _ in range(n):
        words = []
        for _ in range(rng.randrange(12)):
            word = "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randrange(1, 7)))
            if rng.random() < 0.3:
                word += rng.choice(marks)
            if rng.random() < 0.1:
                word = "\ufffd" + rng.choice(marks) + word
            words.append(unicodedata.normalize(rng.choice(["NFC", "NFD", "NFKD"]), word))
        texts.append(rng.choice([" ", "  ", "\t"]).join(words))
    # Dense: letters and marks in any order (U+0341 is a key of its own, ZWNJ maps to a space, jamo and kana
    # decomposed), and any code point.
    dense = "aeiouyAEOcnh" + "\u0301\u0300\u0302\u0323\u0308\u0330\u0341\u0340\u0344\u200c\u200d\u0345\u0313"
    dense += "\u03b1\u03b7\u0438\u0627\u064e\u0915\u093c\u093e\u1100\u1161\u11a8\u304b\u3099\ufffd\U0001f3fd "
    for _ in range(n // 2):
        texts.append("".join(rng.choice(dense) if rng.random() < 0.8 else chr(rng.choice(
            [rng.randrange(0x80, 0x3000), rng.randrange(0x3000, 0xd800), rng.randrange(0xe000, 0x10ffff)]))
            for _ in range(rng.randrange(30))))
    return texts + MULTILINGUAL + ["Vie\u0323\u0302t Nam", "\ufffd\u0301 a\u00a8\u0301b"]


def test_in_graph_sentencepiece_pieces_equal_the_tokenizers_pieces(xlmr_dir):
    tokenizer = load_tokenizer(str(xlmr_dir))
    assert tokenizer_family(tokenizer) == UNIGRAM and tokenizer.cls_token_id == 0 and tokenizer.unk_token_id == 3
    served = SentencePieces.of_tokenizer(tokenizer, xlmr_dir / "sentencepiece.bpe.model")
    texts = fuzz_texts()
    pieces = tf.function(lambda t: served.tokenize(valid_utf8(t))[0])(tf.constant(texts)).to_list()
    expected = training_pieces(tokenizer, texts)
    assert pieces == expected
    assert sum(map(len, expected)) > 10000
    assert served.differences(tokenizer) == []   # bin/export's probe (SentencePieces.check) lets XLM-R through
    # Not vacuous: unknown pieces, several pieces to a word, and the ids are the tokenizer's (fairseq's, shifted).
    flat = [p for text in expected for word in text for p in word]
    assert flat.count(tokenizer.unk_token_id) > 100 and max(len(w) for text in expected for w in text) > 4
    # `tokenizers` reads a short grapheme that begins with a key whole ("e" + U+0323 is "ẹ", the U+0302 after it is
    # dropped); SentencePiece alone keeps the mark. The served graph gives `tokenizers`' pieces.
    sp = sentencepiece.SentencePieceProcessor(model_file=str(xlmr_dir / "sentencepiece.bpe.model"))
    word = "Vie\u0323\u0302t"
    assert sp.normalize(word) != tokenizer.backend_tokenizer.normalizer.normalize_str("\u2581" + word)
    assert pieces[texts.index("Vie\u0323\u0302t Nam")][0] == tokenizer(word, add_special_tokens=False)["input_ids"]


def student_files(directory, tokenizer_dir, family):
    """A student dir as far as bin/export reads it before any work: student.json and tokenizer/ (no model)."""
    shutil.copytree(tokenizer_dir, directory / "tokenizer")
    atomic_write_json(directory / "student.json", asdict(StudentMeta(TOY_LABELS, tokenizer_family=family)))
    return directory


def test_camembert_pieces_and_special_ids_are_its_own(xlmr_dir):
    """CamemBERT's tokenizer over the same SentencePiece model: its own ids (<s>NOTUSED first, <s>=5, </s>=6)."""
    tokenizer = CamembertTokenizerFast(vocab_file=str(xlmr_dir / "sentencepiece.bpe.model"))
    assert tokenizer_family(tokenizer) == UNIGRAM
    served = SentencePieces.of_tokenizer(tokenizer, xlmr_dir / "sentencepiece.bpe.model")
    assert (served.cls_id, served.sep_id, served.pad_id) == (5, 6, 1)
    texts = fuzz_texts(400, seed=44)
    pieces = tf.function(lambda t: served.tokenize(valid_utf8(t))[0])(tf.constant(texts)).to_list()
    assert pieces == training_pieces(tokenizer, texts)
    assert served.differences(tokenizer) == []


def test_saved_model_refuses_a_tokenizer_without_a_sentencepiece_model(xlmr_dir, tmp_path):
    """A fast XLM-R tokenizer saved without its .model file (tokenizer.json only) cannot be served in the graph;
    its ONNX/TFLite exports can (their predict.py reads tokenizer.json)."""
    student = student_files(tmp_path / "student", xlmr_dir, UNIGRAM)
    (student / "tokenizer" / "sentencepiece.bpe.model").unlink()
    with pytest.raises(ConfigError, match=r"no SentencePiece \.model file .* --format=onnx or --format=tflite"):
        export_student(student, tmp_path / "export")
    assert not (tmp_path / "export").exists()
    check_servable(read_config(student), student, "onnx")


def test_saved_model_refuses_a_sentencepiece_family_whose_normalizer_the_graph_does_not_give(albert_dir, tmp_path):
    """ALBERT's fast tokenizer normalizes (NFKD, accents stripped, lower case; XLNet's without lower case) before the
    model's map, which the in-graph SentencepieceTokenizer does not: the SavedModel export is refused in one line
    naming the tokenizer, its normalizer and the ONNX/TFLite path; predict.py of those gives the training pieces."""
    tokenizer = load_tokenizer(str(albert_dir))
    assert tokenizer_family(tokenizer) == UNIGRAM
    # Not vacuous: the graph's pieces differ from the tokenizer's on the probe texts.
    served = SentencePieces.of_tokenizer(tokenizer, albert_dir / "spiece.model")
    assert len(served.differences(tokenizer)) > 3
    student = student_files(tmp_path / "student", albert_dir, UNIGRAM)
    with pytest.raises(ConfigError) as refused:
        export_student(student, tmp_path / "export")
    message = str(refused.value)
    steps = "NFKD+StripAccents+Lowercase" if tokenizer.do_lower_case else "NFKD+StripAccents+Precompiled"
    assert "\n" not in message and f"reads the pieces of AlbertTokenizerFast (normalizer Replace+{steps}" in message
    assert message.endswith("export it with --format=onnx or --format=tflite, whose predict.py runs the tokenizer's "
                            "own normalizer (docs/serving.md)")
    assert not (tmp_path / "export").exists()
    check_servable(read_config(student), student, "onnx")
    check_servable(read_config(student), student, "tflite")
    assert_predict_py_pieces_are_the_training_pieces(student, tmp_path / "onnx", PROBE_TEXTS + tuple(fuzz_texts(50)))


def test_grapheme_rules_of_a_model_without_a_character_map(tmp_path):
    """A SentencePiece model without precompiled_charsmap (normalization_rule_name=identity), and a tokenizer without a
    normalizer: no grapheme rules (no StopIteration, no AttributeError), and the graph gives the tokenizer's pieces."""
    assert grapheme_rules(None) == {} and grapheme_rules(lambda text: text) == {}
    model = unigram_model(tmp_path / "sentencepiece.bpe.model", normalization_rule_name="identity")
    tokenizer = XLMRobertaTokenizerFast(vocab_file=str(model))
    texts = fuzz_texts(100, seed=45)
    for normalizer in (tokenizer.backend_tokenizer.normalizer, None):
        tokenizer.backend_tokenizer.normalizer = normalizer
        served = SentencePieces.of_tokenizer(tokenizer, model)
        pieces = tf.function(lambda t: served.tokenize(valid_utf8(t))[0])(tf.constant(texts)).to_list()
        assert pieces == training_pieces(tokenizer, texts)
        assert served.differences(tokenizer) == []


def test_the_sentencepiece_model_is_the_one_the_tokenizer_names(xlmr_dir, tmp_path):
    """Several .model files: the tokenizer's own (vocab_files_names) is served; if it is missing, one line names it and
    the files there. A model whose pieces are not in the tokenizer's vocabulary is refused, not mapped to <unk>."""
    student = student_files(tmp_path / "student", xlmr_dir, UNIGRAM)
    other = unigram_model(student / "tokenizer" / "other.model", user_defined_symbols=["Zürich", "東京"])
    tokenizer = load_tokenizer(str(student / "tokenizer"))
    assert sentencepiece_model(student, tokenizer) == student / "tokenizer" / "sentencepiece.bpe.model"
    (student / "tokenizer" / "sentencepiece.bpe.model").unlink()
    with pytest.raises(ConfigError, match=r"has no sentencepiece\.bpe\.model, the SentencePiece model its "
                                          r"XLMRobertaTokenizerFast reads \(it has other\.model\)"):
        export_student(student, tmp_path / "export")
    assert not (tmp_path / "export").exists()
    with pytest.raises(ConfigError, match=r"other\.model: 2 of its pieces are not in the tokenizer's vocabulary "
                                          r"\(e\.g\. \['Zürich', '東京'\]\)"):
        SentencePieces.of_tokenizer(tokenizer, other)


def assert_predict_py_pieces_are_the_training_pieces(student_dir, directory, texts):
    """predict.py's tokenization (portable.Tokenization, which portable.load's Predictor runs) over the files an
    ONNX/TFLite export of `student_dir` ships (formats.teacher_tokenizer): each word's pieces are the training pieces,
    each word's first piece is where its pieces begin, and the words are data/wordsplit.split_words'."""
    directory.mkdir()
    tokenization = portable.Tokenization(directory, teacher_tokenizer(student_dir, directory))
    tokenizer = load_tokenizer(str(student_dir / "tokenizer"))
    texts = list(texts)
    got = tokenization.pieces(texts)
    for (ids, words), expected, offsets in zip(got, training_pieces(tokenizer, texts), split_words(texts)):
        assert ids == [p for word in expected for p in word]
        firsts = np.cumsum([0] + [len(word) for word in expected])[:-1].tolist()
        assert words == [(first, start, end) for first, (start, end) in zip(firsts, offsets)]
    assert sum(len(words) for _, words in got) > 1000


@pytest.mark.parametrize("family", [UNIGRAM, BYTE_LEVEL_BPE])
def test_predict_py_pieces_are_the_training_pieces(xlmr_dir, roberta_dir, tmp_path, family):  # noqa: F811
    """XLM-R and RoBERTa students' predict.py on the in-graph test's fuzz texts."""
    student = student_files(tmp_path / "student", xlmr_dir if family == UNIGRAM else roberta_dir, family)
    assert_predict_py_pieces_are_the_training_pieces(student, tmp_path / "export", fuzz_texts())


def trained_student(tokenizer, directory, seed=0):
    """A tiny BiLSTM student trained a few epochs on the toy task (names PER, cities LOC) with `tokenizer`'s pieces,
    saved as the pipeline saves one (tokenizer/, student.json with the tokenizer family)."""
    tf.keras.utils.set_random_seed(seed)
    windows = encode(toy_ner_sentences(300, seed=1), tokenizer, TagVocab(TOY_LABELS), max_seq_length=24)
    model = build_bilstm_student(len(tokenizer), len(TagVocab(TOY_LABELS)), embedding_dim=16, hidden=16,
                                 teacher_hidden=8, dropout=0.0)
    model.compile(tf.keras.optimizers.Adam(0.02), loss={"probs": tf.keras.losses.SparseCategoricalCrossentropy()})
    model.fit({"input_ids": windows.input_ids, "attention_mask": windows.attention_mask}, {"probs": windows.label_ids},
              sample_weight={"probs": windows.attention_mask}, epochs=4, batch_size=32, verbose=0)
    save_student(directory, model, "bilstm", tokenizer, TagVocab(TOY_LABELS), "IOB2", 24)
    return directory


def served_texts():
    """A few hundred texts: toy sentences (entities), several scripts, emoji, random bytes (invalid UTF-8 replaced),
    one of 5,000 characters."""
    rng = random.Random(7)
    toy = [" ".join(s.tokens) for s in toy_ner_sentences(200, seed=9)]
    mixed = [f"{a} {rng.choice(MULTILINGUAL)} {b}" for a, b in zip(toy[:100], toy[100:])]
    long = " ".join(rng.choice(toy + MULTILINGUAL) for _ in range(400))[:5000]
    return toy + mixed + MULTILINGUAL + fuzz_texts(40, seed=5)[-50:] + decoded_bytes(40, seed=5) + [long]


def test_served_texts_hold_random_bytes():
    texts = served_texts()
    assert sum("\ufffd" in text for text in texts) >= 20
    assert sum(any(ord(c) < 0x20 and c not in "\t\n" for c in text) for text in texts) >= 20


def portable_export(student_dir, directory, fmt, texts):
    """(the ONNX or TFLite export, the texts it serves as the student dir does): TFLite runs fixed window lengths
    (here 32 and 128), and a text longer than the longest is cut into windows (docs/serving.md), which a BiLSTM
    student dir runs whole: those are left out."""
    exported = export_portable(student_dir, directory, fmt=fmt, lengths=(32, 128) if fmt == "tflite" else ())
    if fmt == "tflite":
        pieces = portable.load(exported.directory).pieces(texts)
        texts = [text for text, (ids, _) in zip(texts, pieces) if len(ids) + 2 <= 128]
    assert len(texts) > 300
    return exported, texts


def _spans(records):
    return [[(e["start"], e["end"], e["type"], e["text"]) for e in r["entities"]] for r in records]


def _assert_same_entities(got, expected):
    assert _spans(got) == _spans(expected)
    for mine, theirs in zip(got, expected):
        np.testing.assert_allclose([e["confidence"] for e in mine["entities"]],
                                   [e["confidence"] for e in theirs["entities"]], atol=1e-5)


@pytest.fixture(scope="module")
def xlmr_student(xlmr_dir, tmp_path_factory):
    """(student dir, its entities on served_texts() from the student dir: bin/predict's and bin/evaluate's)."""
    student_dir = trained_student(load_tokenizer(str(xlmr_dir)), tmp_path_factory.mktemp("xlmr_student") / "student")
    assert read_config(student_dir).tokenizer_family == UNIGRAM
    texts = served_texts()
    expected = predict(load_serving_fn(student_dir), texts)
    assert len(texts) > 300 and len(texts[-1]) == 5000
    assert sum(len(r["entities"]) for r in expected) > 150, "the toy student finds entities: the test is not vacuous"
    assert any(e["start"] != len(r["text"][:e["start"]].encode()) for r in expected for e in r["entities"]), \
        "no entity after non-ASCII text: the offset check would be vacuous"
    return student_dir, texts, expected


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_xlmr_student_saved_model_serves_the_student_dirs_entities_in_a_fresh_process(xlmr_student, tmp_path):
    student_dir, texts, expected = xlmr_student
    exported = export_student(student_dir, tmp_path / "export")[0]
    assert (exported / "assets.extra" / "tokenizer" / "sentencepiece.bpe.model").exists()
    # Loaded where nothing of ours is imported: tensorflow and tensorflow_text only (TF Serving's ops).
    proc = subprocess.run([sys.executable, "-c", LOAD_AND_CALL, str(exported)], input=json.dumps(texts),
                          capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {k: tf.constant(v) for k, v in json.loads(proc.stdout.splitlines()[-1])["out"].items()}
    _assert_same_entities(entities(out, texts), expected)
    # The served words are the training split's.
    for i, offsets in enumerate(split_words(texts)):
        n = int(out["num_words"][i])
        assert list(zip(out["word_start"][i][:n].numpy().tolist(), out["word_end"][i][:n].numpy().tolist())) == \
            [tuple(o) for o in offsets]


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
def test_xlmr_student_portable_predict_gives_the_student_dirs_entities(xlmr_student, tmp_path, fmt):
    student_dir, texts, expected = xlmr_student
    exported, served = portable_export(student_dir, tmp_path, fmt, texts)
    expected = [record for record in expected if record["text"] in served]
    _assert_same_entities(portable.load(exported.directory).predict(served), expected)
    assert fmt == "tflite" or texts[-1] in served


@pytest.fixture(scope="module")
def roberta_student(roberta_dir, tmp_path_factory):  # noqa: F811
    tokenizer = load_tokenizer(str(roberta_dir))
    student_dir = trained_student(tokenizer, tmp_path_factory.mktemp("roberta_student") / "student")
    assert read_config(student_dir).tokenizer_family == BYTE_LEVEL_BPE
    return student_dir


def test_saved_model_refuses_a_byte_level_bpe_student_in_one_line(roberta_dir, tmp_path):  # noqa: F811
    student_files(tmp_path / "student", roberta_dir, BYTE_LEVEL_BPE)
    with pytest.raises(ConfigError) as refused:
        export_student(tmp_path / "student", tmp_path / "export")
    assert str(refused.value) == (
        f"{tmp_path / 'student'} reads the pieces of a byte-level BPE tokenizer (RoBERTa), and no in-graph tokenizer "
        "of a tf-keras SavedModel makes them (tensorflow-text has no byte-level BPE; KerasHub's BytePairTokenizer is "
        f"a Keras 3 layer): to tag text in Python, run bin/predict --model={tmp_path / 'student'}, or export it with "
        "--format=onnx or --format=tflite, whose predict.py tokenizes with the tokenizers library (docs/serving.md)")
    assert not (tmp_path / "export").exists()


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
def test_roberta_student_portable_predict_gives_the_student_dirs_entities(roberta_student, tmp_path, fmt):
    exported, texts = portable_export(roberta_student, tmp_path, fmt, served_texts())
    expected = predict(load_serving_fn(roberta_student), texts)
    assert sum(len(r["entities"]) for r in expected) > 150, "the toy student finds entities: the test is not vacuous"
    assert json.loads((exported.directory / "export.json").read_text())["special_ids"] == \
        {"cls": 0, "sep": 2, "pad": 1, "unk": 3}
    _assert_same_entities(portable.load(exported.directory).predict(texts), expected)


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_albert_student_onnx_predict_gives_the_student_dirs_entities(albert_dir, tmp_path):
    """The SavedModel of an ALBERT-style student is refused (above); its ONNX export serves it, entities equal to the
    student directory's."""
    student_dir = trained_student(load_tokenizer(str(albert_dir)), tmp_path / "student")
    with pytest.raises(ConfigError, match="export it with --format=onnx or --format=tflite"):
        export_student(student_dir, tmp_path / "saved_model")
    exported, texts = portable_export(student_dir, tmp_path, "onnx", served_texts())
    expected = predict(load_serving_fn(student_dir), texts)
    assert sum(len(r["entities"]) for r in expected) > 150, "the toy student finds entities: the test is not vacuous"
    _assert_same_entities(portable.load(exported.directory).predict(texts), expected)
