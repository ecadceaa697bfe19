"""bin/benchmark formats: one row per export format and quantization of a tiny work dir's student."""
import shutil

import pytest
from conftest import toy_ner_sentences

from xtremedistil_tf.benchmarks.formats import VARIANTS, benchmark
from xtremedistil_tf.data.loading import write_jsonl
from xtremedistil_tf.export.bfloat16 import cpu_has_bf16
from xtremedistil_tf.export.serving import NerServing

pytest.importorskip("tf2onnx", reason="tf2onnx is not installed (requirements.txt pins it)")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (requirements.txt pins it)")
pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert is not installed (requirements.txt pins it)")


def _table(tmp_path, toy_student_dir, variants):
    """bin/benchmark formats' (lines, rows, rows by variant, the student's served parameters) on a tiny
    work dir: the toy student and 60 toy test sentences."""
    work = tmp_path / "work"
    shutil.copytree(toy_student_dir, work / "student")
    (work / "data").mkdir()
    write_jsonl(toy_ner_sentences(60, seed=5), work / "data" / "test.jsonl")
    lines, rows = benchmark(work, variants, queries=8, repeats=1, lengths=[16])
    assert [(r["format"], r["quantize"]) for r in rows] == variants
    assert len(lines) == 2 + len(variants)
    by = {(r["format"], r["quantize"]): r for r in rows}
    return lines, rows, by, NerServing.from_student_dir(work / "student").served_parameters()


@pytest.mark.slow
def test_formats_table_of_saved_model_bfloat16_and_onnx(tmp_path, toy_student_dir):
    """Three rows: a TensorFlow row, a bfloat16 row (refused where the CPU lacks bfloat16 units) and an
    onnxruntime row. In the slow tier, not in CI's subset: the full table below (which CI runs, Makefile
    CI_SLOW_TESTS) has these rows among its own and asserts every line of this test on them."""
    variants = [("saved_model", "none"), ("saved_model", "bfloat16"), ("onnx", "none")]
    lines, rows, by, parameters = _table(tmp_path, toy_student_dir, variants)
    if cpu_has_bf16():
        assert "refused" not in by["saved_model", "bfloat16"]
        assert abs(by["saved_model", "bfloat16"]["f1"] - by["saved_model", "none"]["f1"]) <= 0.05
    else:
        assert by["saved_model", "bfloat16"]["refused"].startswith("--quantize=bfloat16 needs a CPU with AVX512-BF16")
        assert "refused: --quantize=bfloat16" in lines[3]
    measured = [r for r in rows if "refused" not in r]
    assert {r["parameters"] for r in measured} == {parameters}
    assert by["saved_model", "none"]["f1"] == by["onnx", "none"]["f1"] > 0.8
    for r in measured:
        assert r["size_bytes"] > 0 and r["b1_ms"] > 0 and r["b32_ms"] > 0 and r["peak_rss_mib"] > 0
    assert by["onnx", "none"]["peak_rss_mib"] < by["saved_model", "none"]["peak_rss_mib"] / 2


@pytest.mark.slow
def test_formats_table_on_a_tiny_work_dir(tmp_path, toy_student_dir):
    # All but TFLite int8 (tests/test_export_formats.py checks it), to keep the test short.
    variants = [v for v in VARIANTS if v != ("tflite", "dynamic_int8")]
    lines, rows, by, parameters = _table(tmp_path, toy_student_dir, variants)
    # bfloat16 is measured where the CPU computes it, and refused in its row elsewhere.
    if cpu_has_bf16():
        assert "refused" not in by["saved_model", "bfloat16"]
        assert "refused" not in lines[3] and lines[3].startswith("saved_model bfloat16")
    else:
        assert by["saved_model", "bfloat16"]["refused"].startswith("--quantize=bfloat16 needs a CPU with AVX512-BF16")
        assert "refused: --quantize=bfloat16" in lines[3]
    measured = [r for r in rows if "refused" not in r]
    assert {r["parameters"] for r in measured} == {parameters}
    # The float32 formats find the same entities, so the same F1; the toy student learned the task.
    f1 = {key: by[key]["f1"] for key in by if "f1" in by[key]}
    assert f1["saved_model", "none"] == f1["onnx", "none"] == f1["tflite", "none"] > 0.8
    for key in [("onnx", "dynamic_int8"), ("tflite", "float16")] + [("saved_model", "bfloat16")] * cpu_has_bf16():
        assert abs(f1[key] - f1["saved_model", "none"]) <= 0.05
    for r in measured:
        assert r["size_bytes"] > 0 and r["b1_ms"] > 0 and r["b32_ms"] > 0 and r["peak_rss_mib"] > 0
    # float16 halves the weights; the TFLite graph (unrolled at 16 steps) is the same.
    assert by["tflite", "float16"]["size_bytes"] < by["tflite", "none"]["size_bytes"]
    # A serving process with onnxruntime and no TensorFlow is far smaller.
    assert by["onnx", "none"]["peak_rss_mib"] < by["saved_model", "none"]["peak_rss_mib"] / 2
