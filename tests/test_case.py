"""Word shapes (data/shapes.py) for students of lower-casing teachers: the rule, the windows' case_ids, the
student that reads them and the staged loop's data that carries them."""
import json
from dataclasses import replace
import os
import shutil
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, toy_ner_sentences, train_configs
from test_pipeline import toy_config, write_conll

from xtremedistil_tf.data.alignment import TagVocab, encode, encode_consecutive, predict_by_length
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.shapes import CAPITALIZED, DIGIT, LOWER, MIXED, OTHER, PAD, SHAPES, UPPER, word_shape
from xtremedistil_tf.data.wordsplit import split_words
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export.formats import export_portable
from xtremedistil_tf.export.predictor import predict as saved_model_predict
from xtremedistil_tf.export.serving import export_student
from xtremedistil_tf.export.words import word_shapes
from xtremedistil_tf.methods.staged import DistilConfig, head_probs_fn
from xtremedistil_tf.methods.student_run import (
    evaluate_student,
    load_student,
    predict_words,
    staged_sources,
    with_case_ids,
)
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.students import StudentArch, build_bilstm_student
from xtremedistil_tf.students.artifact import StudentMeta, load_student_dir, write_student_dir
from xtremedistil_tf.students.models import reads_case
from xtremedistil_tf.transfer.cache import read_sharded, write_sharded
from xtremedistil_tf.transfer.outputs import window_layout

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


@pytest.mark.parametrize("word, shape", [
    ("paris", LOWER), ("Paris", CAPITALIZED), ("A", CAPITALIZED), ("NATO", UPPER), ("U.S", UPPER),
    ("iPhone", MIXED), ("McDonald", MIXED), ("1968", DIGIT), ("3-2", DIGIT), ("B52", CAPITALIZED), ("x86", LOWER),
    (",", OTHER), ("東京", OTHER), ("\u01c5emal", CAPITALIZED),   # U+01C5 is title case (Lt)
    ("Élodie", CAPITALIZED), ("ÉCOLE", UPPER), ("straße", LOWER), ("١٩٦٨", DIGIT), ("", OTHER),
])
def test_word_shape_reads_the_casing_of_the_letters_then_digits(word, shape):
    assert SHAPES[word_shape(word)] == SHAPES[shape]


def test_every_piece_of_a_word_gets_its_words_shape_and_markers_get_pad(tiny_tokenizer):
    vocab = TagVocab(LABELS)
    # "Lyon" is four pieces (l ##y ##o ##n) of a lower-casing tokenizer: all four read CAPITALIZED.
    sentence = Sentence(["Paris", "Lyon", "NATO", "42", "."], ["B-LOC", "B-LOC", "O", "O", "O"])
    windows = encode([sentence], tiny_tokenizer, vocab, max_seq_length=24)
    pieces = tiny_tokenizer.convert_ids_to_tokens(windows.input_ids[0, :windows.attention_mask[0].sum()].tolist())
    assert pieces[:6] == ["[CLS]", "paris", "l", "##y", "##o", "##n"]
    n = len(pieces)
    expected = [PAD, CAPITALIZED, *[CAPITALIZED] * 4, *[UPPER] * 4, DIGIT, DIGIT, OTHER, PAD]
    assert windows.case_ids[0, :n].tolist() == expected
    assert (windows.case_ids[0, n:] == PAD).all()
    # The transformer's consecutive windows cut inside a word; each piece keeps its word's shape.
    consecutive = encode_consecutive([sentence], tiny_tokenizer, vocab, max_seq_length=5)
    real = consecutive.attention_mask.astype(bool)
    assert consecutive.case_ids[real].tolist() == [PAD, CAPITALIZED, CAPITALIZED, CAPITALIZED, PAD,
                                                   PAD, CAPITALIZED, CAPITALIZED, UPPER, PAD,
                                                   PAD, UPPER, UPPER, UPPER, PAD,
                                                   PAD, DIGIT, DIGIT, OTHER, PAD]


def test_a_student_with_case_dim_reads_word_shapes_and_only_they_tell_it_apart(tiny_tokenizer):
    """The same lower-cased pieces, different shapes: the word-shape student's outputs differ, a student without
    the input cannot tell them apart; predict_by_length hands the windows' shapes to it."""
    vocab = TagVocab(LABELS)
    student = build_bilstm_student(tiny_tokenizer.vocab_size, len(vocab), embedding_dim=8, hidden=8,
                                   teacher_hidden=16, case_dim=4)
    plain = build_bilstm_student(tiny_tokenizer.vocab_size, len(vocab), embedding_dim=8, hidden=8, teacher_hidden=16)
    assert reads_case(student) and not reads_case(plain)
    assert student.get_layer("case_embedding").input_dim == len(SHAPES)
    assert student.get_layer("bilstm").input_shape[-1] == 8 + 4
    lower, upper = (encode([Sentence([w, "in", "paris"], ["O"] * 3)], tiny_tokenizer, vocab, 8)
                    for w in ("john", "JOHN"))
    assert (lower.input_ids == upper.input_ids).all() and (lower.case_ids != upper.case_ids).any()
    probs = {name: predict_by_length(w, head_probs_fn(student), case=True) for name, w in (("l", lower), ("u", upper))}
    assert np.abs(probs["l"] - probs["u"]).max() > 1e-4
    np.testing.assert_array_equal(predict_by_length(lower, head_probs_fn(plain)),
                                  predict_by_length(upper, head_probs_fn(plain)))


def _cache(tmp_path, windows, name):
    arrays = {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask,
              "label_ids": windows.label_ids,
              "logits": np.zeros(windows.input_ids.shape + (3,), np.float32)}
    write_sharded(tmp_path / name, len(windows), lambda rows: {k: v[rows] for k, v in arrays.items()}, shard_size=4,
                  batch_size=4, fingerprint={"test": name}, progress=False, **window_layout(windows, list(arrays)))
    return tmp_path / name


def test_staged_sources_give_each_cached_window_its_own_word_shapes(tiny_tokenizer, tmp_path):
    vocab = TagVocab(LABELS)
    words = [["John", "in", "Paris"], ["the", "NATO", "of", "Berlin", "."], ["mary"], ["A", "b", "C", "d"],
             ["Lyon", "42"], ["at", "Berlin"], ["JOHN"], ["paris", "Mary", "x86"], ["iPhone"]]
    sentences = [Sentence(w, ["O"] * len(w)) for w in words]
    windows = encode(sentences, tiny_tokenizer, vocab, 16)
    transfer = _cache(tmp_path, windows, "transfer")
    dev = _cache(tmp_path, encode(sentences[:3], tiny_tokenizer, vocab, 16), "dev")
    cfg = DistilConfig(arch=StudentArch(case_dim=4), batch_size=4, strategy="D1", group_by_length=2)
    train_for, transfer_for, dev_batches = staged_sources(cfg, transfer, dev, 5, pad_id=vocab.pad_id,
                                                          case_windows=(windows, encode(sentences[:3], tiny_tokenizer,
                                                                                        vocab, 16)))
    seen = 0
    for batch in [*train_for(3), *transfer_for(3), *dev_batches]:
        for ids, mask, case in zip(batch["input_ids"].numpy(), batch["attention_mask"].numpy(),
                                   batch["case_ids"].numpy()):
            row = next(r for r in range(len(windows)) if (windows.input_ids[r, :mask.sum()] == ids[:mask.sum()]).all()
                       and windows.attention_mask[r].sum() == mask.sum())
            assert case[:mask.sum()].tolist() == windows.case_ids[row, :mask.sum()].tolist()
            assert (case[mask.sum():] == PAD).all()
            seen += 1
    assert seen == 5 + len(windows) + 3


def test_word_shapes_of_other_text_than_the_caches_are_refused(tiny_tokenizer, tmp_path):
    vocab = TagVocab(LABELS)
    sentences = [Sentence(["John", "in", "Paris"], ["O"] * 3), Sentence(["mary"], ["O"])]
    cache = _cache(tmp_path, encode(sentences, tiny_tokenizer, vocab, 16), "transfer")
    with pytest.raises(ConfigError, match="holds 2 examples where its text gives 1 windows"):
        with_case_ids(read_sharded(cache), encode(sentences[:1], tiny_tokenizer, vocab, 16), cache)
    other = encode([Sentence(["John", "in", "Berlin"], ["O"] * 3), sentences[1]], tiny_tokenizer, vocab, 16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not of the text its word shapes were read from"):
        list(with_case_ids(read_sharded(cache), other, cache))


# --- the served side: every export reads the shapes of the raw text's words, as training did -----------------------

NAMES = {"john": "PER", "mary": "PER", "paris": "LOC", "berlin": "LOC"}
FILLERS = ["the", "in", "of", "to", "and", "at", "on", "is", "was", "x", "7", "42", ".", ","]
CASE_TEXTS = ["John was in Paris .", "john was in paris .", "JOHN and Mary at berlin", "mary , Berlin 42 and PARIS",
              "", "Москва : John", "the Mary of berlin was in Paris and john at BERLIN ."]


def cased_sentences(n, seed):
    """A toy task only case tells: a name is an entity when Capitalized ("Paris"), a word like any other when lower
    case ("paris"); UPPER names are entities too."""
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(int(rng.integers(3, 9))):
            if rng.random() < 0.4:
                name = str(rng.choice(sorted(NAMES)))
                form = rng.choice(["lower", "cap", "upper"], p=[0.4, 0.45, 0.15])
                words.append(name if form == "lower" else name.capitalize() if form == "cap" else name.upper())
                tags.append("O" if form == "lower" else f"B-{NAMES[name]}")
            else:
                words.append(str(rng.choice(FILLERS)))
                tags.append("O")
        sentences.append(Sentence(words, tags))
    return sentences


@pytest.fixture(scope="module")
def case_student_dir(tiny_tokenizer, tiny_tokenizer_dir, tmp_path_factory):
    """A tiny word-shape student (E = H = 16, case_dim 4) trained on `cased_sentences`, saved as a student dir."""

    tf.keras.utils.set_random_seed(0)
    vocab = TagVocab(LABELS)
    windows = encode(cased_sentences(400, seed=1), tiny_tokenizer, vocab, max_seq_length=16)
    model = build_bilstm_student(tiny_tokenizer.vocab_size, len(vocab), embedding_dim=16, hidden=16, teacher_hidden=8,
                                 dropout=0.0, case_dim=4)
    model.compile(tf.keras.optimizers.Adam(0.02), loss={"probs": tf.keras.losses.SparseCategoricalCrossentropy()})
    model.fit({"input_ids": windows.input_ids, "attention_mask": windows.attention_mask, "case_ids": windows.case_ids},
              {"probs": windows.label_ids}, sample_weight={"probs": windows.attention_mask}, epochs=6, batch_size=32,
              verbose=0)
    path = tmp_path_factory.mktemp("case_student") / "student"
    write_student_dir(model, path, StudentMeta(LABELS), tiny_tokenizer_dir / "vocab.txt")
    return path


def _spans(records):
    return [[(e["start"], e["end"], e["type"], e["text"]) for e in r["entities"]] for r in records]


@pytest.mark.slow   # an export in each format (in CI's slow subset, Makefile CI_SLOW_TESTS)
def test_every_export_serves_the_student_dirs_tags_from_the_raw_texts_case(case_student_dir, tiny_tokenizer,
                                                                           tmp_path):
    """The student dir's word tags (bin/evaluate's path: predict_words on the served word split) are the SavedModel's
    on raw text, and its entities those of the ONNX (the graph built from the weights, and int8) and TFLite exports
    through their shipped predict.py, which reads shapes.py beside it without xtremedistil_tf."""


    model, meta, _ = load_student_dir(case_student_dir)
    tokenizer = tiny_tokenizer
    words = [[t[a:b] for a, b in offsets] for t, offsets in zip(CASE_TEXTS, split_words(CASE_TEXTS))]
    evaluated = predict_words(model, tokenizer, TagVocab(meta.labels), meta.max_seq_length,
                              [Sentence(w) for w in words], meta.scheme)
    # The student learned the task: case alone tells the entities of the same pieces apart.
    assert evaluated[0] == ["B-PER", "O", "O", "B-LOC", "O"] and evaluated[1] == ["O"] * 5

    saved, module = export_student(case_student_dir, tmp_path / "export")
    serve = tf.saved_model.load(str(saved)).signatures["serving_default"]
    out = serve(text=tf.constant(CASE_TEXTS))
    served = [[t.decode() for t in row[:n]] for row, n in zip(out["word_tags"].numpy(), out["num_words"].numpy())]
    assert served == evaluated
    expected = _spans(saved_model_predict(serve, CASE_TEXTS))
    assert sum(map(len, expected)) >= 10
    ids = tf.saved_model.load(str(saved)).signatures["ids"]
    assert sorted(ids.structured_input_signature[1]) == ["attention_mask", "case_ids", "input_ids"]

    for fmt, quantize in (("onnx", "none"), ("onnx", "dynamic_int8"), ("tflite", "none")):
        exported = export_portable(case_student_dir, tmp_path / "portable", "ner", fmt, quantize,
                                   lengths=(16, 32) if fmt == "tflite" else ())
        meta_json = json.loads((exported.directory / "export.json").read_text())
        assert meta_json["case"] is True and (exported.directory / "shapes.py").exists()
        if fmt == "onnx":
            assert meta_json["onnx_graph"] == "bilstm"
        # predict.py as `python <copy>/predict.py <copy>` runs it (its folder first on sys.path), xtremedistil_tf
        # not importable.
        copy = tmp_path / f"client-{fmt}-{quantize}"
        shutil.copytree(exported.directory, copy)
        script = (f"import runpy, sys; sys.modules['xtremedistil_tf'] = None; sys.path.insert(0, {str(copy)!r}); "
                  f"sys.argv = ['predict.py', {str(copy)!r}]; runpy.run_path({str(copy / 'predict.py')!r}, "
                  "run_name='__main__')")
        result = subprocess.run([sys.executable, "-c", script], input="\n".join(CASE_TEXTS).encode(),
                                capture_output=True, timeout=300)
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        records = [json.loads(line) for line in result.stdout.decode().splitlines()]
        assert _spans(records) == expected, (fmt, quantize)


def test_the_served_graph_gives_every_assigned_character_and_mixed_words_the_training_shape():
    """export.words.word_shapes (RE2's Unicode classes) against data.shapes.word_shape (Python's unicodedata) on
    every assigned code point alone and on random words of cased letters, digits and punctuation. Unassigned code
    points are left out: Python's tables and RE2's are of different Unicode versions, and the served word split
    removes such characters before any word is read."""


    chars = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    rng = np.random.default_rng(0)
    alphabet = [c for c in chars[:0x3000] if unicodedata.category(c) in ("Lu", "Ll", "Lt", "Nd")] + ["-", ".", "'"]
    words = chars + ["".join(rng.choice(alphabet, size=int(rng.integers(1, 7)))) for _ in range(20000)]
    served = word_shapes(tf.constant(words)).numpy()
    expected = np.array([word_shape(w) for w in words])
    assert set(expected) == set(range(1, len(SHAPES)))   # every shape but PAD occurs
    np.testing.assert_array_equal(served, expected)


@pytest.mark.parametrize("command, flags, expected", [
    ("train", ["--student_architecture=transformer"], "--student_case_dim=8: word shapes are read by XtremeDistil "
                                                      "BiLSTM taggers"),
    ("train", ["--method=multigrained", "--teacher_head=crf"], "--student_case_dim=8: word shapes are read by "
                                                               "XtremeDistil BiLSTM taggers"),
    ("ablate", ["--strategies=D0,D4.2"], "--student_case_dim=8: D0's per-language students are trained without word "
                                         "shapes"),
])
def test_student_case_dim_is_refused_in_one_line_where_no_student_reads_it(tmp_path, command, flags, expected):
    """--student_case_dim on a student that has no word-shape input: one line before any work."""
    result = subprocess.run([sys.executable, str(REPO / "bin" / command), f"--work_dir={tmp_path / 'w'}",
                             "--data_format=conll", f"--data_dir={tmp_path}", "--student_case_dim=8", *flags],
                            capture_output=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode != 0 and lines[-1].startswith(f"error: {expected}"), lines[-3:]
    assert not (tmp_path / "w").exists()


@pytest.mark.slow   # a tiny teacher and a D4.2 student through the pipeline (about a minute; CI's slow subset)
def test_the_pipeline_trains_and_scores_a_word_shape_student_on_the_cased_words(tmp_path, tiny_bert_dir):
    """bin/train's pipeline with --student_case_dim: the transfer and dev caches' windows get the shapes of their own
    cased words (a cache example whose pieces are not its text's stops the run), the word-shape embedding unfreezes
    with the word embeddings, and the recorded test F1 is the saved student's on the cased test words."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    def capitalized(sentences):   # the toy task's names as news writes them
        return [replace(s, tokens=[w if t == "O" else w.capitalize() for w, t in zip(s.tokens, s.tags)])
                for s in sentences]

    write_conll(corpus / "train.txt", capitalized(toy_ner_sentences(200, seed=3)))
    write_conll(corpus / "test.txt", capitalized(toy_ner_sentences(40, seed=4)))
    (corpus / "unlabeled.txt").write_text("John was in Paris\nmary at berlin .\nMARY , Berlin\n", encoding="utf-8")
    cfg = toy_config(tmp_path / "work", corpus, tiny_bert_dir)
    cfg = replace(cfg, student=replace(cfg.student, arch=replace(cfg.student.arch, case_dim=4)))
    metrics = pipeline.run(cfg)
    steps = pipeline.WorkDir(cfg.work_dir).step_info("student")["history"]["steps"]
    assert [s["unfrozen"] for s in steps if "word_embedding" in s["unfrozen"]] == \
        [["projection", "bilstm", "word_embedding", "case_embedding"]] + [["word_embedding", "case_embedding"]] * 2
    model, meta, tokenizer = load_student(tmp_path / "work" / "student")
    assert model.get_layer("case_embedding").trainable
    test = pipeline.load_data(pipeline.WorkDir(cfg.work_dir))["test"]
    scores = evaluate_student(model, tokenizer, TagVocab(meta.labels), meta.max_seq_length, test, meta.scheme)
    assert scores["all"]["f1"] == pytest.approx(metrics["student"]["scores"]["test"]["all"]["f1"])
    assert scores["all"]["f1"] > 0.7   # the toy task learned, as a student without shapes learns it (test_pipeline)


def test_the_mpnet_recipe_flagfile_is_section_1_9s_command_with_word_shapes(tmp_path, tiny_bert_dir):
    """configs/wikiann_en_mpnet.flags gives bin/train docs/benchmarks.md 1.9's recipe, word shapes on (a local
    teacher and data stand in for mpnet-base and WikiAnn; later flags override a flagfile's)."""
    (tmp_path / "en").mkdir()
    for split in ("train", "dev", "test"):
        (tmp_path / "en" / split).write_text("en:John\tB-PER\nen:lives\tO\n\n", encoding="utf-8")
    argv = ["--flagfile=configs/wikiann_en_mpnet.flags", f"--data_dir={tmp_path}", f"--teacher={tiny_bert_dir}",
            "--teacher_random_init", "--teacher_layer=1", f"--work_dir={tmp_path / 'w'}"]
    cfg, = train_configs([argv], "[pipeline.student_fingerprint(cfg.student), cfg.teacher.finetune.epochs, cfg.data.max_train_sentences, "
                                 "cfg.data.max_eval_sentences, cfg.data.transfer_from_train_rest, cfg.data.langs]")
    assert "error" not in cfg, cfg
    student, epochs, *data = cfg
    assert (student["arch"]["embedding_dim"], student["arch"]["hidden"], student["arch"]["case_dim"]) == (50, 200, 8)
    assert (student["strategy"], student["epochs_per_layer"], student["patience"], student["batch_size"],
            student["learning_rate"], student["group_by_length"]) == ("D4.2", 2, 2, 32, 3e-3, 10)
    assert [epochs, *data] == [3, 2000, 1000, 8000, ["en"]]


@pytest.mark.slow   # a student trained and exported (in CI's slow subset)
def test_predict_py_without_shapes_py_beside_it_says_so_in_one_line(case_student_dir, tmp_path):
    """A word-shape student's ONNX folder copied without shapes.py: predict.py names the file in one line."""
    exported = export_portable(case_student_dir, tmp_path, "ner", "onnx")
    copy = tmp_path / "copy"
    shutil.copytree(exported.directory, copy)
    (copy / "shapes.py").unlink()
    script = (f"import runpy, sys; sys.modules['xtremedistil_tf'] = None; sys.path.insert(0, {str(copy)!r}); "
              f"sys.argv = ['predict.py', {str(copy)!r}]; runpy.run_path({str(copy / 'predict.py')!r}, "
              "run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", script], input=b"John\n", capture_output=True, timeout=300)
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 2 and lines == [f"error: {copy / 'shapes.py'}: missing (the student reads word shapes "
                                                "by it); copy the whole export folder; export it again: bin/export "
                                                "with --overwrite"], lines[-3:]
