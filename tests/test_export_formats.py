"""bin/export --format=onnx|tflite [--quantize=...]: the portable exports against the SavedModel's graph.

The reference is NerServing (what bin/export saves; tests/test_export.py checks the SavedModel
against it): its `ids` tags and its `serving_default` entities through export.predictor.
"""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import numpy_helper
import pytest
import tensorflow as tf

from conftest import EXPORT_TEXTS, REPO, TOY_LABELS, o_iper_student, sticky_crf_student, toy_ner_sentences
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export.bfloat16 import cpu_has_bf16
from xtremedistil_tf.export.formats import check_format, export_portable
from xtremedistil_tf.export.predictor import load_serving_fn, predict as saved_model_predict
from xtremedistil_tf.export.serving import NerServing, export_student, windows_of
from xtremedistil_tf.students.artifact import StudentMeta, write_student_dir

tf2onnx = pytest.importorskip("tf2onnx", reason="tf2onnx is not installed (requirements.txt pins it)")
onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (requirements.txt pins it)")
litert = pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert is not installed (requirements.txt pins it)")

sys.path.insert(0, str(REPO / "xtremedistil_tf" / "export"))
import portable  # noqa: E402  (the shipped predict.py, imported as a plain module as a client would)

ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
# TFLite windows at these fixed lengths (pieces with [CLS]/[SEP]); the short texts fit 32.
TFLITE_LENGTHS = (16, 32)
SHORT_TEXTS = EXPORT_TEXTS[:4] + [" ".join(s.tokens) for s in toy_ner_sentences(40, seed=11)]
LONG_TEXT = EXPORT_TEXTS[4]
# Allowed share of piece tags that differ from the float32 SavedModel's: quantized weights move the
# probabilities a little, so near-ties may flip. float16 keeps 11 mantissa bits, int8 only 8 bits in all;
# bfloat16 keeps 8 and computes in them too (the BiLSTM's states included).
ALLOWED_DISAGREEMENT = {"none": 0.0, "float16": 0.01, "dynamic_int8": 0.05, "bfloat16": 0.02}
MATMULS = ("MatMul", "BatchMatMulV2", "Einsum", "BlockLSTMV2")


@pytest.fixture(scope="module")
def student_dir(toy_student_dir):
    return toy_student_dir


@pytest.fixture(scope="module")
def serving(student_dir):
    return NerServing.from_student_dir(student_dir)


@pytest.fixture(scope="module")
def exports(student_dir, tmp_path_factory):
    """export(fmt, quantize) -> Exported, each written once per module."""
    root, done = tmp_path_factory.mktemp("exports"), {}

    def export(fmt, quantize="none"):
        if (fmt, quantize) not in done:
            lengths = TFLITE_LENGTHS if fmt == "tflite" else ()
            done[fmt, quantize] = export_portable(student_dir, root, "ner", fmt, quantize, lengths=lengths)
        return done[fmt, quantize]

    return export


def _windows_and_reference(serving, predictor, texts):
    """The shipped tokenizer's windows of `texts`, and the SavedModel graph's `ids` tags on them."""
    input_ids, attention_mask, _, _ = predictor.windows(texts)
    reference = serving.ids(tf.constant(input_ids), tf.constant(attention_mask))
    return input_ids, attention_mask, reference


def _serving_entities(serving, texts):
    return saved_model_predict(lambda text: serving.serve(text), texts)


def _spans(records):
    return [[(e["start"], e["end"], e["type"], e["text"]) for e in r["entities"]] for r in records]


@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_float32_exports_give_the_saved_models_tags_and_spans(serving, exports, fmt):
    exported = exports(fmt)
    predictor = portable.load(exported.directory)
    texts = SHORT_TEXTS + ([LONG_TEXT] if fmt == "onnx" else [])  # TFLite cuts long texts into windows
    input_ids, attention_mask, reference = _windows_and_reference(serving, predictor, texts)
    if fmt == "tflite":
        assert input_ids.shape[1] <= max(TFLITE_LENGTHS)
    tag_ids, tag_probs = predictor.ids(input_ids, attention_mask)
    np.testing.assert_array_equal(tag_ids, reference["tag_ids"].numpy())
    np.testing.assert_allclose(tag_probs, reference["tag_probs"].numpy(), atol=1e-5)
    # The shipped tokenizer.json splits like the SavedModel's in-graph tokenizer, and predict() gives its entities.
    got, expected = predictor.predict(texts, batch_size=16), _serving_entities(serving, texts)
    assert _spans(got) == _spans(expected)
    assert sum(len(r["entities"]) for r in got) > 40, "the toy student finds entities: the comparison is not vacuous"
    for mine, theirs in zip(got, expected):
        np.testing.assert_allclose([e["confidence"] for e in mine["entities"]],
                                   [e["confidence"] for e in theirs["entities"]], atol=1e-5)
    assert exported.module.served_parameters() == json.loads((exported.directory / "export.json").read_text())["parameters"]


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_tflite_has_only_builtin_ops_and_one_signature_per_length(exports):
    exported = exports("tflite")
    assert b"Flex" not in exported.model_file.read_bytes()
    interpreter = litert.Interpreter(model_path=str(exported.model_file))
    assert sorted(interpreter.get_signature_list()) == [f"ids_{n}" for n in sorted(TFLITE_LENGTHS)]


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_tflite_cuts_texts_longer_than_its_longest_length_into_windows(serving, exports):
    """A text of more pieces than the longest length holds runs in windows of 30 pieces; each window's
    tags are the SavedModel graph's on that window."""
    predictor = portable.load(exports("tflite").directory)
    input_ids, attention_mask, reference = _windows_and_reference(serving, predictor, [LONG_TEXT, "john"])
    assert input_ids.shape == (len(predictor.tokenizer.encode(LONG_TEXT, add_special_tokens=False).ids) // 30 + 2, 32)
    np.testing.assert_array_equal(predictor.ids(input_ids, attention_mask)[0], reference["tag_ids"].numpy())
    assert len(predictor.predict([LONG_TEXT])[0]["entities"]) > 50


def _quantized_tensor_types(exported):
    """Element types of the stored weights: numpy dtypes of ONNX initializers, or of TFLite tensors."""
    if exported.model_file.suffix == ".onnx":
        return {numpy_helper.to_array(t).dtype for t in onnx.load(str(exported.model_file)).graph.initializer}
    interpreter = litert.Interpreter(model_path=str(exported.model_file))
    return {np.dtype(d["dtype"]) for d in interpreter.get_tensor_details()}


@pytest.mark.parametrize("fmt, quantize, stored", [("onnx", "dynamic_int8", np.int8), ("tflite", "dynamic_int8", np.int8),
                                                   ("tflite", "float16", np.float16)])
@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_quantized_exports_agree_within_the_allowed_rate(serving, exports, fmt, quantize, stored):
    exported = exports(fmt, quantize)
    assert np.dtype(stored) in _quantized_tensor_types(exported)
    assert np.dtype(stored) not in _quantized_tensor_types(exports(fmt))
    predictor = portable.load(exported.directory)
    input_ids, attention_mask, reference = _windows_and_reference(serving, predictor, SHORT_TEXTS)
    tag_ids, _ = predictor.ids(input_ids, attention_mask)
    real = attention_mask == 1
    disagreement = np.mean(tag_ids[real] != reference["tag_ids"].numpy()[real])
    assert disagreement <= ALLOWED_DISAGREEMENT[quantize], f"{disagreement:.1%} of piece tags differ"
    assert real.sum() > 300
    spans = _spans(predictor.predict(SHORT_TEXTS))
    expected = _spans(_serving_entities(serving, SHORT_TEXTS))
    same = sum(a == b for a, b in zip(spans, expected))
    assert same >= (1 - 2 * ALLOWED_DISAGREEMENT[quantize]) * len(SHORT_TEXTS) - 1


@pytest.fixture(scope="module")
def crf_student_dir(tmp_path_factory, tiny_tokenizer, tiny_tokenizer_dir):
    """The sticky CRF student, saved once for both formats."""
    return write_student_dir(sticky_crf_student(tiny_tokenizer), tmp_path_factory.mktemp("crf"),
                             StudentMeta(TOY_LABELS, decoder="crf"), tiny_tokenizer_dir / "vocab.txt")


@pytest.fixture(scope="module")
def crf_serving(crf_student_dir):
    return NerServing.from_student_dir(crf_student_dir)


@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_crf_student_is_decoded_by_numpy_viterbi(crf_student_dir, crf_serving, tmp_path, fmt):
    """CRF students: the graph returns the potentials; predict.py's Viterbi and marginals give the
    SavedModel graph's tags (not the argmax) and probabilities."""
    exported = export_portable(crf_student_dir, tmp_path, "crf", fmt, lengths=(8,) if fmt == "tflite" else ())
    serving = crf_serving
    predictor = portable.load(exported.directory)
    ids = np.array([[2, 70, 45, 60, 3, 0], [2, 50, 3, 0, 0, 0]], np.int32)
    mask = (np.arange(6) < np.array([[5], [3]])).astype(np.int32)
    reference = serving.ids(ids, mask)
    tag_ids, tag_probs = predictor.ids(ids, mask)
    np.testing.assert_array_equal(tag_ids, reference["tag_ids"].numpy())
    np.testing.assert_allclose(tag_probs, reference["tag_probs"].numpy(), atol=1e-5)
    potentials = predictor.run(ids, mask)["potentials"]
    assert len(set(tag_ids[0, :5])) == 1 and len(set(np.argmax(potentials[0, :5], -1))) > 1
    texts = ["john was in paris", "", "mary at berlin"]
    assert _spans(predictor.predict(texts)) == _spans(_serving_entities(serving, texts))


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_predict_py_decodes_words_under_the_scheme_like_the_saved_model(tiny_tokenizer, tiny_tokenizer_dir, tmp_path):
    """A softmax student whose argmax breaks IOB2: predict.py's NumPy word decoding (export.json "decode":
    constrained) gives the SavedModel graph's entities, which differ from the argmax's."""
    student_dir = write_student_dir(o_iper_student(tiny_tokenizer), tmp_path / "student", StudentMeta(TOY_LABELS),
                                    tiny_tokenizer_dir / "vocab.txt")
    exported = export_portable(student_dir, tmp_path, "ner", "onnx")
    meta = json.loads((exported.directory / "export.json").read_text())
    assert meta["decode"] == "constrained" and len(meta["word_transitions"]) == len(TOY_LABELS)
    predictor = portable.load(exported.directory)
    texts = SHORT_TEXTS[:24]
    got = _spans(predictor.predict(texts))
    assert got == _spans(_serving_entities(exported.module, texts))
    argmax = NerServing.from_student_dir(student_dir, decode="argmax")
    assert got != _spans(_serving_entities(argmax, texts)), "argmax and constrained agree: the test shows nothing"
    meta["decode"] = "argmax"  # the same export as bin/export --decode=argmax writes it
    (exported.directory / "export.json").write_text(json.dumps(meta))
    assert _spans(portable.load(exported.directory).predict(texts)) == _spans(_serving_entities(argmax, texts))


CLIENT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import predict
records = [predict.load(d).predict(json.load(open(sys.argv[3]))) for d in sys.argv[1:3]]
heavy = sorted(m for m in ("tensorflow", "tf_keras", "xtremedistil_tf") if m in sys.modules)
print(json.dumps({"records": records, "heavy": heavy}))
"""


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_shipped_predict_runs_without_tensorflow(serving, exports, tmp_path):
    """predict.py beside each model needs only numpy, tokenizers and the runtime: a fresh process
    that imports it (and no TensorFlow) gets the SavedModel's entities, also from its command line."""
    onnx_dir, tflite_dir = exports("onnx").directory, exports("tflite").directory
    texts = SHORT_TEXTS[:6]
    (tmp_path / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", CLIENT, str(onnx_dir), str(tflite_dir), str(tmp_path / "texts.json")],
                          capture_output=True, text=True, env=ENV, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["heavy"] == []
    expected = _spans(_serving_entities(serving, texts))
    assert [_spans(r) for r in result["records"]] == [expected, expected]
    proc = subprocess.run([sys.executable, str(onnx_dir / "predict.py"), str(onnx_dir)], input="\n".join(texts) + "\n",
                          capture_output=True, text=True, env=ENV, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _spans([json.loads(line) for line in proc.stdout.splitlines()]) == expected


def test_bad_format_and_quantization_pairs_fail_in_one_line(tmp_path, student_dir):
    for fmt, quantize, message in [("onnx", "float16", "--format=onnx does not support --quantize=float16"),
                                   ("tflite", "bfloat16", "--format=tflite does not support --quantize=bfloat16"),
                                   ("saved_model", "dynamic_int8", "--format=saved_model does not support"),
                                   ("onnx", "int4", "--quantize=int4: expected one of"),
                                   ("coreml", "none", "--format=coreml: expected one of")]:
        with pytest.raises(ConfigError, match=message):
            check_format(fmt, quantize)
    with pytest.raises(ConfigError, match="ONNX exports keep the window length dynamic"):
        export_portable(student_dir, tmp_path, fmt="onnx", lengths=[16])
    # bin/export refuses before loading anything: one line on stderr, exit 2.
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "export"), f"--student_dir={tmp_path / 'absent'}",
                           f"--export_dir={tmp_path}", "--format=onnx", "--quantize=float16"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("error: --format=onnx does not support --quantize=float16 "
                                                     "(it supports none, dynamic_int8)")


def _matmul_dtypes(function) -> set:
    """The dtypes of the matmuls (and fused LSTM kernels) in a concrete function's graph and its library."""
    graph = function.graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return {tf.dtypes.as_dtype(n.attr["T"].type).name for n in nodes if n.op in MATMULS}


@pytest.mark.skipif(not cpu_has_bf16(), reason="this CPU has neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo: "
                                                "bin/export refuses --quantize=bfloat16 here")
@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_bfloat16_saved_model_computes_in_bfloat16_and_agrees_within_the_allowed_rate(student_dir, serving, tmp_path):
    """The bfloat16 SavedModel holds its weights in bfloat16 (half the float32 bytes) and runs its matmuls
    and BiLSTM in bfloat16; its signatures keep the float32 one's names and dtypes, and its tags and
    entities (through bin/predict's loader) agree with the float32 graph's within the allowed rate."""
    target, _ = export_student(student_dir, tmp_path, "ner", bfloat16=True)
    loaded = tf.saved_model.load(str(target))
    assert {v.dtype for v in loaded.student_variables} == {tf.bfloat16}
    assert _matmul_dtypes(loaded.signatures["ids"]) == {"bfloat16"}
    assert _matmul_dtypes(serving.ids.get_concrete_function()) == {"float32"}
    weights = sum(p.stat().st_size for p in (target / "variables").glob("variables.data-*"))
    assert 2 * serving.served_parameters() <= weights < 2.5 * serving.served_parameters()
    for name in ("serving_default", "ids"):
        float32_outputs = getattr(serving, "serve" if name == "serving_default" else "ids").get_concrete_function()
        assert ({k: t.dtype for k, t in loaded.signatures[name].structured_outputs.items()}
                == {k: t.dtype for k, t in float32_outputs.structured_outputs.items()})
    pieces = serving.tokenizer.tokenize(tf.constant(SHORT_TEXTS))[0].merge_dims(1, 2)   # [B, (W), (P)] -> [B, (P)]
    input_ids, attention_mask, _, _ = windows_of(pieces, None, *(serving.vocab.index(p) for p in ("[CLS]", "[SEP]", "[PAD]")))
    reference = serving.ids(input_ids, attention_mask)
    got = loaded.signatures["ids"](input_ids=input_ids, attention_mask=attention_mask)
    real = attention_mask.numpy() == 1
    assert real.sum() > 300
    disagreement = np.mean(got["tag_ids"].numpy()[real] != reference["tag_ids"].numpy()[real])
    assert disagreement <= ALLOWED_DISAGREEMENT["bfloat16"], f"{disagreement:.1%} of piece tags differ"
    # bfloat16 rounds the probabilities too (8 significant bits), but they are not float32's.
    difference = np.abs(got["tag_probs"].numpy() - reference["tag_probs"].numpy())[real]
    assert 0 < difference.max() < 0.02
    spans = _spans(saved_model_predict(load_serving_fn(target), SHORT_TEXTS))
    expected = _spans(_serving_entities(serving, SHORT_TEXTS))
    assert sum(len(r) for r in expected) > 40
    assert sum(a == b for a, b in zip(spans, expected)) >= (1 - 2 * ALLOWED_DISAGREEMENT["bfloat16"]) * len(SHORT_TEXTS) - 1
