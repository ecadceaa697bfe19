"""bin/export and bin/predict: the serving SavedModel against the Keras student and our Python alignment."""
import json
import os
import re
import subprocess
import sys
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    EXPORT_TEXTS,
    REPO,
    TOY_LABELS,
    o_iper_student,
    stderr_line_of,
    sticky_crf_student,
    toy_ner_sentences,
)

from xtremedistil_tf.cli.evaluate import evaluate_model, format_scores
from xtremedistil_tf.crf.decoding import WordDecoder
from xtremedistil_tf.data.alignment import TagVocab, encode, word_pieces
from xtremedistil_tf.data.schemes import spans_to_tags, tags_to_spans, validate_tags
from xtremedistil_tf.data.scoring import char_spans, entity_scores
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError, DataFormatError
from xtremedistil_tf.export import bfloat16
from xtremedistil_tf.export.bfloat16 import cpu_has_bf16, in_bfloat16
from xtremedistil_tf.export.formats import check_format
from xtremedistil_tf.export.predictor import load_serving_fn, predict
from xtremedistil_tf.export.serving import (
    NerServing,
    decode_spans,
    dense_index,
    export_student,
    padded,
    tag_tables,
    windows_of,
)
from xtremedistil_tf.export.vocabulary import corpus_texts, kept_piece_ids, piece_counts
from xtremedistil_tf.methods.student_run import evaluate_student
from xtremedistil_tf.students.artifact import StudentMeta, read_vocab, student_identity, write_student_dir
from xtremedistil_tf.students.layers import BlockBiLSTM
from xtremedistil_tf.students.models import build_bilstm_student, build_transformer_student

TAG_VOCAB = TagVocab(TOY_LABELS)
# CJK characters are words of their own, as in BERT's basic tokenizer; other words split at punctuation.
WORD = re.compile(r"[\u4e00-\u9fff]|[^\W\u4e00-\u9fff]+|[^\w\s]")
ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")


TEXTS = EXPORT_TEXTS


@pytest.fixture(scope="module")
def student(toy_student):
    return toy_student


@pytest.fixture(scope="module")
def exported(student, tmp_path_factory):
    return export_student(student[1], tmp_path_factory.mktemp("export"))[0]


# model -> {text: its Keras probs}: a test decodes each text both ways, and predict is the slow part.
_PROBS = weakref.WeakKeyDictionary()


def reference(model, tokenizer, text, decode="constrained"):
    """(word tags, [(start char, end char, type, confidence)]) from the Keras model via alignment.py and
    the word decoder bin/evaluate uses (crf/decoding.py)."""
    matches = list(WORD.finditer(text))
    if not matches:
        return [], []
    windows = encode([Sentence([m.group() for m in matches])], tokenizer, TAG_VOCAB, max_seq_length=2048)
    seen = _PROBS.setdefault(model, {})
    if text not in seen:
        seen[text] = model.predict({"input_ids": windows.input_ids, "attention_mask": windows.attention_mask},
                                   verbose=0)["probs"]
    probs = seen[text]
    labels, scores = WordDecoder(TAG_VOCAB.tags, TAG_VOCAB.labels, "IOB2", decode).decode_windows(windows, probs)
    tags, word_prob = labels[0], np.array(scores[0])
    spans = [(matches[s].start(), matches[e - 1].end(), etype, word_prob[s:e].mean())
             for etype, s, e in tags_to_spans(tags, "IOB2")]
    return tags, spans


LOAD_AND_CALL = """
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the tokenizer ops
loaded = tf.saved_model.load(sys.argv[1])
texts = json.load(sys.stdin)
out = {k: v.numpy().tolist() for k, v in loaded.signatures["serving_default"](text=tf.constant(texts)).items()}
empty = loaded.signatures["serving_default"](text=tf.constant([""]))
ids = loaded.signatures["ids"](input_ids=tf.constant([[2, 70, 3, 0]]), attention_mask=tf.constant([[1, 1, 1, 0]]))
print(json.dumps({"out": out, "empty": {k: v.shape.as_list() for k, v in empty.items()},
                  "ids": {k: v.numpy().tolist() for k, v in ids.items()}}, default=lambda b: b.decode("utf-8")))
"""


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_serving_signature_matches_keras_in_fresh_process(student, exported, tiny_tokenizer):
    model, _ = student
    proc = subprocess.run([sys.executable, "-c", LOAD_AND_CALL, str(exported)], input=json.dumps(TEXTS),
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    out = result["out"]
    assert len(TEXTS[4]) >= 2000
    found_after_non_ascii = False
    for i, text in enumerate(TEXTS):
        tags, spans = reference(model, tiny_tokenizer, text)
        assert out["num_words"][i] == len(tags)
        assert out["word_tags"][i][:len(tags)] == tags
        n = out["num_entities"][i]
        assert n == len(spans), (text, spans)
        got = list(zip(out["entity_start"][i], out["entity_end"][i], out["entity_type"][i]))[:n]
        assert got == [s[:3] for s in spans]
        np.testing.assert_allclose(out["entity_confidence"][i][:n], [s[3] for s in spans], atol=1e-5)
        # Character offsets: Python slicing gives back the in-graph entity text.
        assert out["entity_text"][i][:n] == [text[s:e] for s, e, _ in got]
        found_after_non_ascii |= any(len(text[:s]) != len(text[:s].encode("utf-8")) for s, _, _ in got)
    assert found_after_non_ascii, "no entity after non-ASCII text: the offset check would be vacuous"
    assert out["num_words"][1] == 0 and out["num_entities"][1] == 0
    assert result["empty"]["entity_start"] == [1, 0] and result["empty"]["num_entities"] == [1]
    # ids signature: the client's own pieces -> the Keras argmax; padding gets [PAD] and 0.
    probs = model.predict({"input_ids": np.array([[2, 70, 3]]), "attention_mask": np.ones((1, 3), int)},
                          verbose=0)["probs"][0]
    assert result["ids"]["tag_ids"] == [list(probs.argmax(-1)) + [TAG_VOCAB.pad_id]]
    np.testing.assert_allclose(result["ids"]["tag_probs"][0], list(probs.max(-1)) + [0.0], atol=1e-5)


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_saved_model_cli_lists_both_signatures(exported):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    proc = subprocess.run([cli, "show", "--all", "--dir", str(exported)], capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = proc.stdout
    for name in ("signature_def['serving_default']", "signature_def['ids']", "inputs['text']",
                 "inputs['input_ids']", "inputs['attention_mask']", "outputs['tag_ids']", "outputs['probs']",
                 "outputs['word_tags']", "outputs['entity_start']", "outputs['entity_end']",
                 "outputs['entity_type']", "outputs['entity_confidence']", "outputs['num_entities']"):
        assert name in shown
    assert shown.count("Method name is: tensorflow/serving/predict") == 2


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_bin_predict_on_export_and_student_dir(student, exported, tiny_tokenizer):
    model, student_dir = student
    lines = [TEXTS[0], "", TEXTS[2]]
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "predict"), f"--model={exported.parent}"],
                          input="\n".join(lines) + "\n", capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    # The student dir goes through the same graph, built in memory.
    assert predict(load_serving_fn(student_dir), lines) == records
    assert [r["text"] for r in records] == lines
    for record in records:
        spans = reference(model, tiny_tokenizer, record["text"])[1]
        assert [(e["start"], e["end"], e["type"], e["text"]) for e in record["entities"]] == \
            [(s, e, t, record["text"][s:e]) for s, e, t, _ in spans]
    assert records[0]["entities"], "the trained toy student should find entities in the first line"


def test_transformer_student_runs_in_windows(tiny_tokenizer, tiny_tokenizer_dir):
    """A transformer student sees windows of max_seq_length - 2 pieces, each with CLS/SEP."""
    tf.keras.utils.set_random_seed(1)
    model = build_transformer_student(tiny_tokenizer.vocab_size, len(TAG_VOCAB), embedding_dim=8, depth=1,
                                      heads=2, ffn=8, teacher_hidden=8, max_length=8, dropout=0.0)
    config = StudentMeta(TOY_LABELS, architecture="transformer", max_seq_length=8)
    vocab = read_vocab(tiny_tokenizer_dir / "vocab.txt")
    serving, constrained = (NerServing(model, config, vocab, decode=d) for d in ("argmax", "constrained"))
    words = "john was in paris and johnson at berlin of mary".split()
    out = serving.serve(tf.constant([" ".join(words), "mary"]))
    pieces = word_pieces(tiny_tokenizer, [Sentence(words)])[0]
    flat = [p for word in pieces for p in word]
    assert len(flat) > 12  # at least three windows of 6
    probs = []
    for start in range(0, len(flat), 6):
        ids = np.array([[tiny_tokenizer.cls_token_id] + flat[start:start + 6] + [tiny_tokenizer.sep_token_id]])
        probs.extend(model({"input_ids": ids, "attention_mask": np.ones_like(ids)})["probs"][0, 1:-1].numpy())
    first_piece = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    expected = [TAG_VOCAB.word_label(int(np.argmax(probs[i]))) for i in first_piece]
    assert [t.decode() for t in out["word_tags"].numpy()[0]] == expected
    assert out["num_words"].numpy().tolist() == [len(words), 1]
    # Constrained decoding runs over the whole text's words, across the window boundaries.
    word_probs = np.array([probs[i] for i in first_piece])[None]
    best = WordDecoder(TAG_VOCAB.tags, TOY_LABELS, "IOB2")(word_probs, [len(words)])[0].numpy()[0]
    served = [t.decode() for t in constrained.serve(tf.constant([" ".join(words)]))["word_tags"].numpy()[0]]
    assert served == [TOY_LABELS[i] for i in best]
    assert validate_tags(served, "IOB2") is None


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_served_tags_are_valid_and_equal_the_argmax_where_it_is_valid(tiny_tokenizer, tiny_tokenizer_dir, tmp_path):
    """The export decodes a softmax student under its tag scheme by default: no text gets `O I-PER`, a text
    whose argmax is valid gets exactly the argmax, and the tags are those bin/evaluate decodes."""
    model = o_iper_student(tiny_tokenizer)
    student_dir = write_student_dir(model, tmp_path / "student", StudentMeta(TOY_LABELS),
                                    tiny_tokenizer_dir / "vocab.txt")
    target, served = export_student(student_dir, tmp_path / "export")
    assert json.loads((target / "assets.extra" / "export.json").read_text()) == {
        "decode": "constrained", "student_sha256": student_identity(student_dir)}
    assert served.decode == "constrained"
    argmax = NerServing.from_student_dir(student_dir, decode="argmax")
    texts = [" ".join(s.tokens) for s in toy_ner_sentences(30, seed=3)] + TEXTS[:4]
    got, plain = served.serve(tf.constant(texts)), argmax.serve(tf.constant(texts))
    invalid = 0
    for i, text in enumerate(texts):
        n = int(got["num_words"][i])
        tags = [t.decode() for t in got["word_tags"].numpy()[i, :n]]
        argmax_tags = [t.decode() for t in plain["word_tags"].numpy()[i, :n]]
        assert validate_tags(tags, "IOB2") is None, (text, tags)
        if validate_tags(argmax_tags, "IOB2") is None:
            assert tags == argmax_tags
        else:
            invalid += 1
        assert tags == reference(model, tiny_tokenizer, text)[0]
        assert argmax_tags == reference(model, tiny_tokenizer, text, "argmax")[0]
    assert invalid >= 5, "the argmax should break IOB2 in several texts, or the test shows nothing"
    # bin/evaluate scores a student's words with the same decoder (one window per toy sentence here).
    sentences = toy_ner_sentences(30, seed=3)
    for decode in ("constrained", "argmax"):
        scores = evaluate_student(model, tiny_tokenizer, TAG_VOCAB, 64, sentences, "IOB2", decode_as=decode)
        predicted = [reference(model, tiny_tokenizer, " ".join(s.tokens), decode)[0] for s in sentences]
        assert scores["all"] == entity_scores([s.tags for s in sentences], predicted)
    with pytest.raises(ConfigError, match="CRF student decodes with its CRF's Viterbi"):
        NerServing(model, StudentMeta(TOY_LABELS, decoder="crf"), None, decode="argmax")


@pytest.mark.parametrize("scheme", ["IOB2", "BIOES", "BMES"])
def test_graph_span_decoding_matches_tags_to_spans(scheme):
    """Valid and invalid (leniently read) tag sequences decode like schemes.tags_to_spans."""
    prefixes = {"IOB2": "BI", "BIOES": "BIES", "BMES": "BMES"}[scheme]
    labels = ["O"] + [f"{p}-{t}" for t in ("PER", "LOC") for p in prefixes]
    config = StudentMeta(labels, scheme=scheme)
    _, prefix_table, type_table, types = tag_tables(config)
    rng = np.random.default_rng(0)
    texts = [list(rng.integers(0, len(labels), size=n)) for n in (0, 1, 5, 9, 12)]
    texts.append([labels.index(t) for t in spans_to_tags([("PER", 0, 3), ("LOC", 3, 4)], 6, scheme)])
    flat = np.array([t for text in texts for t in text], np.int32)
    rows = np.array([i for i, text in enumerate(texts) for _ in text], np.int64)
    position = np.array([j for text in texts for j in range(len(text))], np.int64)
    first, last, _, _ = decode_spans(tf.gather(prefix_table, flat), tf.gather(type_table, flat), position)
    got = [(int(rows[f]), types[type_table[flat[f]]], int(position[f]), int(position[l]) + 1)
           for f, l in zip(first.numpy(), last.numpy())]
    expected = [(i, etype, s, e) for i, text in enumerate(texts)
                for etype, s, e in tags_to_spans([labels[t] for t in text], scheme)]
    assert got == expected


@pytest.mark.parametrize("budget", [None, 1, 2, 3, 100])
def test_windows_wrap_each_texts_pieces_and_say_where_they_are(budget):
    """windows_of: [CLS] + up to `budget` consecutive pieces + [SEP] per window, [PAD] after, an empty text one
    window; `at` finds every piece where it went, in order."""
    texts = [[5, 6, 7, 8, 9], [], [10], [11, 12, 13, 14, 15, 16, 17]]
    input_ids, attention_mask, lengths, at = windows_of(tf.ragged.constant(texts, tf.int32), budget, 2, 3, 0)
    size = budget or 100
    expected = [[2] + text[i:i + size] + [3] for text in texts for i in range(0, max(len(text), 1), size)]
    width = max(len(w) for w in expected)
    assert input_ids.numpy().tolist() == [w + [0] * (width - len(w)) for w in expected]
    assert attention_mask.numpy().tolist() == [[1] * len(w) + [0] * (width - len(w)) for w in expected]
    assert lengths.numpy().tolist() == [len(w) - 2 for w in expected]
    assert input_ids.numpy()[tuple(at.numpy().T)].tolist() == [p for text in texts for p in text]


def test_padded_outputs_put_each_value_at_its_text_and_position():
    """dense_index/padded: flat per-text values to [texts, most per text], the default elsewhere (texts without
    values included)."""
    rows, position, counts = np.array([1, 1, 1, 3]), np.array([0, 1, 2, 0]), np.array([0, 3, 0, 1], np.int32)
    index = dense_index(rows, position, counts)
    assert padded(tf.constant(["a", "b", "c", "d"]), index, "").numpy().tolist() == [
        [b"", b"", b""], [b"a", b"b", b"c"], [b"", b"", b""], [b"d", b"", b""]]
    assert padded(tf.constant([4, 5, 6, 7]), index, -1).numpy().tolist() == [[-1] * 3, [4, 5, 6], [-1] * 3, [7, -1, -1]]
    empty = dense_index(np.zeros([0], np.int64), np.zeros([0], np.int64), np.array([0, 0], np.int32))
    assert padded(tf.zeros([0]), empty, 0.0).shape == (2, 0)


@pytest.mark.parametrize("xla_lengths", [(), (8,)])
@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_crf_student_decodes_with_viterbi(tiny_tokenizer, tiny_tokenizer_dir, xla_lengths):
    """decoder "crf": Viterbi over the `crf` layer's potentials and transitions, not the argmax
    (also with the unrolled BiLSTM under XLA)."""
    model = sticky_crf_student(tiny_tokenizer)
    crf = model.get_layer("crf")
    serving = NerServing(model, StudentMeta(TOY_LABELS, decoder="crf"), read_vocab(tiny_tokenizer_dir / "vocab.txt"),
                         xla_lengths=xla_lengths)
    ids = np.array([[2, 70, 45, 60, 3, 0], [2, 50, 3, 0, 0, 0]], np.int32)
    mask = (np.arange(6) < np.array([[5], [3]])).astype(np.int32)
    out = serving.ids(ids, mask)
    scores = model({"input_ids": ids, "attention_mask": mask})["potentials"]
    expected = crf.decode(scores, mask.sum(1))[0].numpy()
    expected[mask == 0] = TAG_VOCAB.pad_id
    assert out["tag_ids"].numpy().tolist() == expected.tolist()
    assert len(set(expected[0, :5])) == 1 and len(set(np.argmax(scores[0, :5], -1))) > 1
    np.testing.assert_allclose(out["probs"].numpy()[mask == 1].sum(-1), 1.0, atol=1e-5)
    assert serving.serve(tf.constant(["john was in paris", ""]))["num_words"].numpy().tolist() == [4, 0]


@pytest.mark.parametrize("heads_on, training_only", [("projection", ["logits"]), ("states", ["logits", "projection"])])
def test_served_graph_leaves_out_training_only_heads(tiny_tokenizer, tiny_tokenizer_dir, heads_on, training_only):
    """The SavedModel holds only the layers on the path to the tags, and they give the Keras probs."""
    tf.keras.utils.set_random_seed(4)
    model = build_bilstm_student(tiny_tokenizer.vocab_size, len(TAG_VOCAB), embedding_dim=8, hidden=8,
                                 teacher_hidden=12, dropout=0.0, heads_on=heads_on)
    serving = NerServing(model, StudentMeta(TOY_LABELS), read_vocab(tiny_tokenizer_dir / "vocab.txt"))
    left_out = sum(model.get_layer(name).count_params() for name in training_only)
    assert serving.served_parameters() == model.count_params() - left_out
    ids = np.array([[2, 70, 45, 60, 3], [2, 50, 3, 0, 0]], np.int32)
    mask = (ids > 0).astype(np.int32)
    expected = model({"input_ids": ids, "attention_mask": mask})["probs"].numpy()
    np.testing.assert_allclose(serving.ids(ids, mask)["probs"].numpy()[mask == 1], expected[mask == 1], atol=1e-6)


@pytest.mark.parametrize("student", ["bilstm", "transformer", "crf"])
def test_bfloat16_served_graph_holds_bfloat16_weights_and_keeps_float32_outputs(student):
    """NerServing(bfloat16=True) (bin/export --quantize=bfloat16): every weight of the served model in
    bfloat16 (the transformer's sublayers, made in its __init__, included; a CRF keeps its float32
    transitions), the same parameters, float32 outputs near the float32 graph's but not equal to them."""
    tf.keras.utils.set_random_seed(5)
    if student == "transformer":
        model = build_transformer_student(64, len(TAG_VOCAB), embedding_dim=8, depth=1, heads=2, ffn=8,
                                          teacher_hidden=8, max_length=8, dropout=0.0)
    elif student == "crf":
        model = sticky_crf_student(SimpleNamespace(vocab_size=64))
    else:
        model = build_bilstm_student(64, len(TAG_VOCAB), embedding_dim=8, hidden=8, teacher_hidden=12, dropout=0.0)
    config = StudentMeta(TOY_LABELS, architecture="transformer" if student == "transformer" else "bilstm",
                         decoder="crf" if student == "crf" else "softmax", max_seq_length=8)
    float32, bfloat16 = (NerServing(model, config, None, bfloat16=b) for b in (False, True))
    assert {v.dtype for v in float32.student_variables} == {tf.float32}
    assert {v.dtype for v in bfloat16._keras.model.variables} == {tf.bfloat16}
    assert {v.dtype for v in bfloat16.student_variables} == {tf.bfloat16} | ({tf.float32} if student == "crf" else set())
    assert bfloat16.served_parameters() == float32.served_parameters()
    ids = np.array([[2, 60, 45, 33, 21, 50, 3], [2, 50, 40, 3, 0, 0, 0]], np.int32)
    mask = (ids > 0).astype(np.int32)
    expected, got = float32.ids(ids, mask), bfloat16.ids(ids, mask)
    assert {k: v.dtype for k, v in got.items()} == {k: v.dtype for k, v in expected.items()}
    difference = np.abs(got["probs"].numpy() - expected["probs"].numpy())[mask == 1]
    assert 0 < difference.max() < 0.02
    if student == "crf":  # sticky transitions: Viterbi's path does not hang on the emissions' last bits
        np.testing.assert_array_equal(got["tag_ids"].numpy(), expected["tag_ids"].numpy())


def test_bfloat16_bilstm_scans_each_rows_real_pieces_as_the_fused_kernel():
    """BlockLSTMV2 has no bfloat16 kernel: a bfloat16 BlockBiLSTM runs tf.scan, which gives the fused
    kernel's states to bfloat16 precision on rows of different lengths (the backward direction starts at
    each row's last real piece; weights large enough that a wrong start would show)."""
    inputs, mask = tf.keras.Input((None, 6)), tf.keras.Input((None,), dtype=tf.bool)
    model = tf.keras.Model([inputs, mask], BlockBiLSTM(5, name="bilstm")(inputs, mask=mask))
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(0, 0.7, w.shape).astype(np.float32) for w in model.get_weights()])
    x = rng.normal(0, 1, (3, 7, 6)).astype(np.float32)
    real = np.arange(7) < np.array([[7], [4], [1]])
    expected = model([x, real]).numpy()
    got = in_bfloat16(model)([x, real])
    assert got.dtype == tf.bfloat16
    error = np.abs(got.numpy().astype(np.float32) - expected)[real]
    assert error.max() < 0.02 < np.abs(expected).mean()
    # Run from the padded end instead, the backward states differ by far more than bfloat16's rounding.
    shifted = model([x, np.ones_like(real)]).numpy()
    assert np.abs(shifted - expected)[real].max() > 0.2


def test_bfloat16_is_refused_in_one_line_on_cpus_without_bfloat16_units(tmp_path, monkeypatch):
    """cpu_has_bf16 reads the CPU flags (a file injected here); without avx512_bf16 or amx_bf16 the
    bfloat16 SavedModel is refused before the student is read. Runs on every CPU."""
    no_bf16, avx512_bf16, amx = tmp_path / "cpuinfo_avx2", tmp_path / "cpuinfo_avx512_bf16", tmp_path / "cpuinfo_amx"
    no_bf16.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n")
    avx512_bf16.write_text("flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    amx.write_text("flags\t\t: fpu sse2 avx2 amx_bf16 amx_tile\n")
    assert [cpu_has_bf16(str(p)) for p in (no_bf16, avx512_bf16, amx, tmp_path / "absent")] == [False, True, True, False]
    check_format("saved_model", "bfloat16", cpuinfo=str(amx))
    with pytest.raises(ConfigError) as refused:
        check_format("saved_model", "bfloat16", cpuinfo=str(no_bf16))
    assert str(refused.value) == (f"--quantize=bfloat16 needs a CPU with AVX512-BF16 or AMX-BF16 (none of avx512_bf16, "
                                  f"amx_bf16 in {no_bf16}; emulated bfloat16 is slower than float32): export with "
                                  "--quantize=none, or --format=onnx|tflite --quantize=dynamic_int8 for smaller weights")
    monkeypatch.setattr(bfloat16, "cpu_has_bf16", lambda cpuinfo="/proc/cpuinfo": False)
    for refuse in (lambda: check_format("saved_model", "bfloat16"),
                   lambda: export_student(tmp_path / "absent_student", tmp_path, bfloat16=True)):  # not FileNotFoundError
        with pytest.raises(ConfigError, match="^--quantize=bfloat16 needs a CPU with AVX512-BF16"):
            refuse()


def test_states_heads_bypass_the_projection(tiny_tokenizer):
    """heads_on="states": the tags do not depend on the projection's weights (the paper's W^s h^s)."""
    model = build_bilstm_student(tiny_tokenizer.vocab_size, len(TAG_VOCAB), embedding_dim=8, hidden=8,
                                 teacher_hidden=12, dropout=0.0, heads_on="states")
    inputs = {"input_ids": np.array([[2, 70, 3]], np.int32), "attention_mask": np.ones((1, 3), np.int32)}
    before = model(inputs)
    projection = model.get_layer("projection")
    projection.set_weights([w + 1.0 for w in projection.get_weights()])
    after = model(inputs)
    np.testing.assert_array_equal(before["probs"].numpy(), after["probs"].numpy())
    assert not np.allclose(before["projection"].numpy(), after["projection"].numpy())


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_pruned_vocabulary_serves_its_corpus_unchanged(student, tmp_path):
    """--prune_vocab: the corpus's texts give the same tags and spans with fewer embedding rows;
    a word whose pieces were dropped splits into kept characters, not [UNK]."""
    model, student_dir = student
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"tokens": "john was in paris .".split()}) + "\n"
                      + json.dumps({"tokens": ["johnson", "at", "paris"]}) + "\n", encoding="utf-8")
    full = NerServing.from_student_dir(student_dir)
    pruned = NerServing.from_student_dir(student_dir, prune_corpus=[corpus])
    dropped = set(full.vocab) - set(pruned.vocab)
    assert dropped == {"the", "of", "to", "and", "on", "is", "berlin", "mary"}
    width = model.get_layer("word_embedding").output_dim
    assert pruned.served_parameters() == full.served_parameters() - len(dropped) * width
    texts = tf.constant(["john was in paris .", "johnson at paris", "paris"])
    for key, value in full.serve(texts).items():
        np.testing.assert_array_equal(pruned.serve(texts)[key].numpy(), value.numpy(), err_msg=key)
    pieces = pruned.tokenizer.tokenize(tf.constant(["mary"]))[0].flat_values.numpy()
    assert [pruned.vocab[i] for i in pieces] == ["m", "##a", "##r", "##y"]
    # Without the character rule, only seen pieces and the special ones survive.
    vocab = full.vocab
    counts = piece_counts(["john was"], vocab, lower_case=True)
    kept = {vocab[i] for i in kept_piece_ids(counts, vocab, keep_characters=False)}
    assert kept == {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "john", "was"}


def _xla_compiled_functions(concrete) -> int:
    return sum(f.attr["_XlaMustCompile"].b for f in concrete.graph.as_graph_def().library.function)


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_xla_lengths_serve_what_the_fused_kernel_serves(student):
    """--xla_lengths: batches of windows up to 8 or 16 pieces run the unrolled BiLSTM under XLA
    (padded to the bucket), longer ones and single windows the fused kernel; every text gets the
    default export's tags and spans."""
    model, student_dir = student
    vocab = read_vocab(student_dir / "vocab.txt")
    xla, plain = (NerServing(model, StudentMeta(TOY_LABELS), vocab, xla_lengths=n) for n in ([16, 8], []))
    # The XLA graphs are in what bin/export saves (tf.saved_model keeps the attribute).
    assert _xla_compiled_functions(xla.serve.get_concrete_function()) == 2
    assert _xla_compiled_functions(plain.serve.get_concrete_function()) == 0
    # Windows of 7 and 2, of 12 (Cyrillic splits into characters) and 8, and > 16 pieces: both buckets
    # and the fallback; a single text takes the fallback.
    for texts in (TEXTS[:2], TEXTS[2:4], TEXTS, TEXTS[:1]):
        got, expected = xla.serve(tf.constant(texts)), plain.serve(tf.constant(texts))
        for key, value in expected.items():
            if value.dtype == tf.float32:
                np.testing.assert_allclose(got[key].numpy(), value.numpy(), atol=1e-5, err_msg=key)
            else:
                np.testing.assert_array_equal(got[key].numpy(), value.numpy(), err_msg=key)
    ids, mask = tf.constant([[2, 70, 45, 3], [2, 50, 3, 0]]), tf.constant([[1, 1, 1, 1], [1, 1, 1, 0]])
    np.testing.assert_allclose(xla.ids(ids, mask)["probs"].numpy(), plain.ids(ids, mask)["probs"].numpy(), atol=1e-5)


def test_xla_lengths_errors(student, tiny_tokenizer, tiny_tokenizer_dir):
    vocab = read_vocab(tiny_tokenizer_dir / "vocab.txt")
    model = build_transformer_student(tiny_tokenizer.vocab_size, len(TAG_VOCAB), embedding_dim=8, depth=1,
                                      heads=2, ffn=8, teacher_hidden=8, max_length=8, dropout=0.0)
    config = StudentMeta(TOY_LABELS, architecture="transformer", max_seq_length=8)
    with pytest.raises(ConfigError, match="BiLSTM students unrolled; this student is a transformer"):
        NerServing(model, config, vocab, xla_lengths=[8])
    with pytest.raises(ConfigError, match=r"window lengths >= 2.*\[1, 8\]"):
        NerServing(student[0], StudentMeta(TOY_LABELS), vocab, xla_lengths=[1, 8])


def test_prune_corpus_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"tokens": ["a"]}\n{"tags": ["O"]}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"train\.jsonl:2: expected a JSON object"):
        list(corpus_texts([bad]))
    with pytest.raises(DataFormatError, match="missing.txt: vocabulary corpus not found"):
        list(corpus_texts([tmp_path / "missing.txt"]))


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_evaluate_scores_an_export_like_its_student(student, exported, tiny_tokenizer):
    """bin/evaluate on an exported model: exact character spans of the served entities give the
    Keras student's word-level seqeval scores when every token is one word."""
    assert char_spans(Sentence(["John", "Smith", "in", "Paris"]), ["B-PER", "I-PER", "O", "B-LOC"]) == \
        {(0, 10, "PER"), (14, 19, "LOC")}
    # Words re-split from "O'Brien in St. Louis": spans index the raw text, not the words joined by spaces.
    split = Sentence(["O", "'", "Brien", "in", "St", ".", "Louis"], text="O'Brien in St. Louis")
    assert char_spans(split, ["B-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-LOC"]) == \
        {(0, 7, "PER"), (11, 20, "LOC")}
    sentences = toy_ner_sentences(40, seed=7)
    served = evaluate_model(exported.parent, sentences, "IOB2")
    predicted = [reference(student[0], tiny_tokenizer, " ".join(s.tokens))[0] for s in sentences]
    keras = entity_scores([s.tags for s in sentences], predicted)
    assert served["kind"] == "export" and served["decode"] == "constrained"
    with pytest.raises(ConfigError, match="was exported with constrained decoding; .* bin/export --decode=argmax"):
        evaluate_model(exported.parent, sentences, "IOB2", decode="argmax")
    for key in ("precision", "recall", "f1"):
        assert served["all"][key] == pytest.approx(keras[key])
    assert served["all"]["f1"] > 0.5  # the toy student learned the task, so the comparison is not vacuous
    assert "(saved_model: exact entity character spans), constrained decoding" in format_scores(served)


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_evaluate_refuses_tags_outside_the_label_set_for_an_export_as_for_its_student(student, exported):
    """Issue 16, item 9: an export scored on data of other labels is refused before it loads, in the
    same words as its student dir (it used to score F1 0 and exit 0)."""
    sentences = [Sentence(["john", "says", "hallo"], ["B-PER", "O", "B-MISC"])]
    for model_dir in (exported.parent, student[1]):
        with pytest.raises(ConfigError) as info:
            evaluate_model(model_dir, sentences, "IOB2")
        assert str(info.value) == (f"--model={model_dir} was trained on the labels O, B-PER, I-PER, B-LOC, I-LOC; "
                                   "the data has B-MISC, which it cannot predict: score it on data of its label set")
        with pytest.raises(ConfigError, match=r"tags in IOB2, but --scheme=BIOES$"):
            evaluate_model(model_dir, [Sentence(["john"], ["S-PER"])], "BIOES")


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_evaluate_says_which_fifo_it_waits_for(exported, tmp_path):
    """Issue 16, item 9: a FIFO as --test_file blocks until written, after "reading <file> (waiting for
    a writer)" on stderr."""
    fifo = tmp_path / "test.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, str(REPO / "bin" / "evaluate"), f"--model={exported.parent}",
                             "--data_format=conll", f"--test_file={fifo}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    with stderr_line_of(proc, b"reading") as line:
        assert line == f"reading {fifo} (waiting for a writer)"
        fifo.write_text("john B-PER\nsays O\nhallo B-MISC\n\n", encoding="utf-8")   # unblocks the reader
        _, err = proc.communicate(timeout=300)
    # Then the same one-line refusal as above, exit 2.
    assert proc.returncode == 2, err.decode()[-3000:]
    assert err.decode().strip().splitlines()[-1] == (
        f"error: --model={exported.parent} was trained on the labels O, B-PER, I-PER, B-LOC, I-LOC; the data has "
        "B-MISC, which it cannot predict: score it on data of its label set")
