"""bin/export --teacher: a run's fine-tuned teacher (<work_dir>/teacher/model) in ONNX, float32 or
dynamic int8: the peer a practitioner who does not distil would serve, and `bin/benchmark latency
--latency_peers` times against the student (docs/serving.md, docs/benchmarks.md).

The graph is ids in, tags out: int32 input_ids, attention_mask [B, T] (B and T dynamic) -> logits
[B, T, tags] (the piece tag logits) and tag_ids [B, T] int32, the teacher's `predict_tags_fn` (the
argmax over the word labels; a pretrained checkpoint's own column, as its decode_words reads it).
Tokenization stays outside (the teacher's tokenizer is written beside the model). Conversion and
quantization are the student's (export.formats.onnx_from_function, quantize_onnx), with the weights
kept out of tf2onnx (`low_memory`; docs/serving.md gives the peak RAM).
CRF teachers (Viterbi) and sentence teachers are refused.
"""
from __future__ import annotations

import json
from pathlib import Path

import tensorflow as tf

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export.formats import _versions, check_format, onnx_from_function, portable_dir, quantize_onnx
from xtremedistil_tf.io import atomic_dir, atomic_write_json
from xtremedistil_tf.teachers.saved import load_teacher

MODEL_FILE = "model.onnx"


def teacher_function(teacher):
    """The exported graph as a concrete function: (input_ids, attention_mask) -> {"logits", "tag_ids"}."""
    spec = tf.TensorSpec([None, None], tf.int32)

    def outputs(input_ids, attention_mask):
        logits, tag_ids = teacher.logits_and_tags({"input_ids": input_ids, "attention_mask": attention_mask})
        return {"logits": logits, "tag_ids": tag_ids}

    return tf.function(outputs).get_concrete_function(tf.TensorSpec.from_spec(spec, name="input_ids"),
                                                      tf.TensorSpec.from_spec(spec, name="attention_mask"))


def teacher_onnx(teacher, path: Path, quantize: str = "none") -> None:
    """`teacher` as an ONNX model at `path` (module doc); quantize: none or dynamic_int8."""
    check_format("onnx", quantize)
    path = Path(path)
    target = path if quantize == "none" else path.with_suffix(".float32.onnx")
    onnx_from_function(teacher_function(teacher), target, low_memory=True)
    if quantize == "dynamic_int8":
        quantize_onnx(target, path)
        target.unlink()


def check_teacher_dir(teacher_dir) -> dict:
    """teacher.json of an exportable teacher (a token teacher without a CRF); one-line errors otherwise."""
    meta_path = Path(teacher_dir) / "teacher.json"
    if not meta_path.exists():
        raise ConfigError(f"{teacher_dir} is not a saved teacher (no teacher.json); pass a run's <work_dir>/teacher/model")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("head") == "crf":
        raise ConfigError(f"{teacher_dir} is a CRF teacher: its Viterbi is not exported to ONNX (argmax heads only)")
    if meta.get("task", "token") != "token":
        raise ConfigError(f"{teacher_dir} is a {meta['task']} teacher; --teacher exports token teachers")
    return meta


def export_teacher(teacher_dir, export_dir, name: str = "ner", quantize: str = "none",
                   overwrite: bool = False) -> Path:
    """<export_dir>/<name>-teacher-onnx[-<quantize>]/: model.onnx, export.json (tags, word labels,
    inputs and outputs, versions) and tokenizer/ (the teacher's own). Returns the directory."""
    check_format("onnx", quantize)
    check_teacher_dir(teacher_dir)
    target = portable_dir(export_dir, f"{name}-teacher", "onnx", quantize)
    if target.exists() and not overwrite:
        raise ConfigError(f"{target} exists; pass --overwrite")

    teacher, tokenizer = load_teacher(teacher_dir)
    meta = {"model": MODEL_FILE, "format": "onnx", "quantize": quantize, "teacher_dir": str(teacher_dir),
            "tags": teacher.tag_vocab.tags, "word_labels": list(teacher.tag_vocab.labels),
            "max_seq_length": teacher.max_seq_length, "parameters": int(teacher.count_params()),
            "inputs": ["input_ids", "attention_mask"],
            "outputs": {"logits": "piece tag logits [B, T, tags]", "tag_ids": "predicted tag ids [B, T]"},
            "versions": _versions("onnx")}
    with atomic_dir(target) as tmp:
        teacher_onnx(teacher, tmp / MODEL_FILE, quantize)
        tokenizer.save_pretrained(str(tmp / "tokenizer"))
        atomic_write_json(tmp / "export.json", meta)
    return target
