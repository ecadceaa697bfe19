"""bin/export --teacher: a fine-tuned tiny teacher in ONNX Runtime, float32 and dynamic int8, against
the TF teacher's own tags (its `predict_tags_fn`) on a toy set.

Slow (about 40 s on a quiet 2-core machine, most of it the teacher's fine-tuning and the bin/export
processes' start).
"""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import tensorflow as tf

from conftest import REPO, TOY_LABELS, toy_ner_sentences
from xtremedistil_tf.data.alignment import encode
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export.teacher import export_teacher
from xtremedistil_tf.teachers.finetune import FinetuneConfig, finetune
from xtremedistil_tf.teachers.model import build_teacher
from xtremedistil_tf.teachers.saved import load_teacher

onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (requirements.txt pins it)")
pytest.importorskip("tf2onnx", reason="tf2onnx is not installed (requirements.txt pins it)")

ENV = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
# Allowed share of real pieces whose int8 tag differs from the float32 TF teacher's: int8 weights
# (8 bits) and int8 activations quantized at run time move the logits a little, so near-ties may flip.
INT8_ALLOWED_DISAGREEMENT = 0.05


@pytest.fixture(scope="module")
def work_dir(tiny_bert_dir, tmp_path_factory):
    """A run's work dir holding a tiny teacher (2 layers, hidden 32) fine-tuned briefly on the toy task
    in teacher/model, as bin/train leaves it."""
    tf.keras.utils.set_random_seed(0)
    teacher, tokenizer = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=16, dropout=0.0,
                                       random_init=True)
    finetune(teacher, tokenizer, toy_ner_sentences(200, seed=1), toy_ner_sentences(40, seed=2), "IOB2",
             FinetuneConfig(epochs=2, batch_size=16, learning_rate=3e-3, warmup_fraction=0.1, patience=2,
                            progress=False))
    work = tmp_path_factory.mktemp("teacher_run")
    teacher.save(work / "teacher" / "model", tokenizer)
    return work


@pytest.fixture(scope="module")
def teacher(work_dir):
    return load_teacher(work_dir / "teacher" / "model")


@pytest.fixture(scope="module")
def exports(work_dir):
    """{quantize: export dir}: float32 through the Python API, int8 through bin/export --teacher."""
    float32 = export_teacher(work_dir / "teacher" / "model", work_dir / "export")
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "export"), f"--work_dir={work_dir}", "--teacher",
                           "--quantize=dynamic_int8"], capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    int8 = work_dir / "export" / "ner-teacher-onnx-dynamic_int8"
    assert proc.stdout.strip().splitlines()[-1] == str(int8)
    return {"none": float32, "dynamic_int8": int8}


def _windows(teacher):
    """The toy set's windows (real lengths 3 to 16 pieces, padded) as the TF teacher reads them."""
    model, tokenizer = teacher
    windows = encode(toy_ner_sentences(80, seed=7), tokenizer, model.tag_vocab, model.max_seq_length)
    return windows.input_ids.astype(np.int32), windows.attention_mask.astype(np.int32), windows


def _onnx(directory, input_ids, attention_mask):
    session = onnxruntime.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})))


@pytest.mark.slow
def test_float32_onnx_teacher_gives_the_tf_teachers_tags_exactly(teacher, exports):
    model, _ = teacher
    input_ids, attention_mask, windows = _windows(teacher)
    batch = {"input_ids": tf.constant(input_ids), "attention_mask": tf.constant(attention_mask)}
    expected = model.predict_tags_fn()(batch).numpy()
    real = attention_mask.astype(bool)
    # A toy set the briefly trained teacher tags with O, B-PER and B-LOC, so equal tags are not one constant.
    assert {model.tag_vocab.tags[t] for t in expected[real]} >= {"O", "B-PER", "B-LOC"}
    got = _onnx(exports["none"], input_ids, attention_mask)
    np.testing.assert_array_equal(got["tag_ids"][real], expected[real])
    np.testing.assert_allclose(got["logits"], model(batch).numpy(), atol=1e-4)
    # The weights kept out of tf2onnx (onnx_from_function(low_memory=True)) are initializers, not inputs.
    onnx_model = onnx.load(str(exports["none"] / "model.onnx"))
    assert [i.name for i in onnx_model.graph.input] == ["input_ids", "attention_mask"]
    embeddings = model.word_embeddings()
    assert any(np.array_equal(onnx.numpy_helper.to_array(tensor), embeddings)
               for tensor in onnx_model.graph.initializer if tuple(tensor.dims) == embeddings.shape)
    assert model.decode_words(windows, got["tag_ids"]) == model.decode_words(windows, expected)
    # B and T are dynamic: one window alone, cut to its own length, gives the same tags.
    n = int(attention_mask[5].sum())
    alone = _onnx(exports["none"], input_ids[5:6, :n], attention_mask[5:6, :n])["tag_ids"]
    np.testing.assert_array_equal(alone[0], expected[5, :n])
    meta = json.loads((exports["none"] / "export.json").read_text(encoding="utf-8"))
    assert meta["tags"] == model.tag_vocab.tags and meta["quantize"] == "none"
    assert meta["parameters"] == model.count_params()
    assert (exports["none"] / "tokenizer" / "vocab.txt").exists()


@pytest.mark.slow
def test_int8_onnx_teacher_is_quantized_and_agrees_within_the_allowed_rate(teacher, exports):
    model, _ = teacher
    input_ids, attention_mask, _ = _windows(teacher)
    expected = model.predict_tags_fn()({"input_ids": tf.constant(input_ids),
                                        "attention_mask": tf.constant(attention_mask)}).numpy()
    real = attention_mask.astype(bool)
    got = _onnx(exports["dynamic_int8"], input_ids, attention_mask)["tag_ids"]
    assert np.mean(got[real] != expected[real]) <= INT8_ALLOWED_DISAGREEMENT
    ops = {node.op_type for node in onnx.load(str(exports["dynamic_int8"] / "model.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    float_ops = {node.op_type for node in onnx.load(str(exports["none"] / "model.onnx")).graph.node}
    assert "MatMulInteger" not in float_ops and "MatMul" in float_ops
    meta = json.loads((exports["dynamic_int8"] / "export.json").read_text(encoding="utf-8"))
    assert meta["quantize"] == "dynamic_int8"


@pytest.mark.slow
def test_bad_teacher_exports_fail_in_one_line_before_loading(tmp_path):
    crf = tmp_path / "crf_teacher"
    crf.mkdir()
    (crf / "teacher.json").write_text(json.dumps({"format_version": 1, "head": "crf"}), encoding="utf-8")
    with pytest.raises(ConfigError, match="is a CRF teacher: its Viterbi is not exported"):
        export_teacher(crf, tmp_path / "export")
    with pytest.raises(ConfigError, match="no teacher.json"):
        export_teacher(tmp_path / "absent", tmp_path / "export")
    with pytest.raises(ConfigError, match="does not support --quantize=float16"):
        export_teacher(tmp_path / "absent", tmp_path / "export", quantize="float16")
    for argv, message in [(["--teacher", "--prune_vocab", "--xla_lengths=32"],
                           "--teacher exports the teacher; drop --prune_vocab, --xla_lengths (student flags)"),
                          (["--teacher", "--format=tflite"], "--teacher writes ONNX; drop --format=tflite"),
                          (["--teacher", "--quantize=float16"],
                           "--teacher: --quantize must be none or dynamic_int8; got float16"),
                          ([f"--teacher_dir={crf}"], "--teacher_dir is read only with --teacher"),
                          (["--teacher", f"--teacher_dir={crf}"],
                           f"{crf} is a CRF teacher: its Viterbi is not exported to ONNX (argmax heads only)")]:
        proc = subprocess.run([sys.executable, str(REPO / "bin" / "export"), f"--export_dir={tmp_path / 'out'}",
                               *argv], capture_output=True, text=True, env=ENV, timeout=300)
        assert proc.returncode == 2, (argv, proc.stderr[-1000:])
        assert proc.stderr.strip().splitlines()[-1] == f"error: {message}"
    assert not (tmp_path / "out").exists()
