"""bin/benchmark latency end to end on tiny models: parameter counts, served graph, output lines.

No timing assertions: the machine is shared.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from xtremedistil_tf.benchmarks import latency, peers
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.export.bfloat16 import cpu_has_bf16
from xtremedistil_tf.students.artifact import StudentMeta, served_model
from xtremedistil_tf.students.models import build_bilstm_student

TINY_TEACHER = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                "intermediate_size": 32}


@pytest.mark.parametrize("unroll", [True, False])
def test_inference_bilstms_match_keras_student(unroll):
    """The served graphs give the trained student's probs at real positions, padded rows of
    different lengths included (BlockBiLSTM runs the backward direction over reversed real pieces),
    on the fused kernel and unrolled."""
    student = build_bilstm_student(64, 11, embedding_dim=8, hidden=6, teacher_hidden=16)
    served = latency.fused_inference_model(student, seq_length=7, unroll=unroll)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 64, (3, 7)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 4:], mask[2, 1:] = 0, 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    expected = student(inputs, training=False)["probs"].numpy()
    got = served(inputs, training=False)["probs"].numpy()
    np.testing.assert_allclose(got * mask[..., None], expected * mask[..., None], atol=1e-5)
    # Embeddings + BiLSTM + projection + softmax: all but the training-only logits head.
    logits = student.get_layer("logits").count_params()
    assert served.count_params() == student.count_params() - logits


def test_fused_model_without_projection_when_heads_read_states():
    """heads_on="states": the fused served graph leaves the projection out and still matches."""
    student = build_bilstm_student(64, 11, embedding_dim=8, hidden=6, teacher_hidden=16, heads_on="states")
    served = latency.fused_inference_model(student, seq_length=5)
    assert "projection" not in {layer.name for layer in served.layers}
    left_out = student.get_layer("logits").count_params() + student.get_layer("projection").count_params()
    assert served.count_params() == student.count_params() - left_out
    ids = np.random.default_rng(1).integers(5, 64, (2, 5)).astype(np.int32)
    inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    np.testing.assert_allclose(served(inputs)["probs"].numpy(), student(inputs)["probs"].numpy(), atol=1e-5)


def test_parse_students_and_teacher_config(tmp_path):
    assert latency.parse_students("50x200, 100X400") == [(50, 200), (100, 400)]
    with pytest.raises(ValueError):
        latency.parse_students("50-200")
    assert latency.teacher_config("mbert-base").vocab_size == 119547
    path = tmp_path / "teacher.json"
    path.write_text(json.dumps(TINY_TEACHER))
    assert latency.teacher_config(str(path)).hidden_size == 16
    assert latency.teacher_config(str(path)).model_type == "bert"
    path.write_text(json.dumps({**TINY_TEACHER, "model_type": "mpnet"}))   # a model's own config.json
    assert type(latency.teacher_config(str(path))).__name__ == "MPNetConfig"


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_measure_end_to_end():
    spec = json.dumps(TINY_TEACHER)
    result = latency.measure(spec, [(8, 6)], queries=33, seq_length=4, repeats=1, string_signature=False,
                             heads_on="states", student_vocab_size=40)
    config = latency.teacher_config(spec)
    teacher = latency.build_teacher(config, 4)
    student = build_bilstm_student(40, 11, 8, 6, 16, heads_on="states")
    assert result["teacher"]["parameters"] == teacher.count_params()
    (entry,) = result["students"]
    # Served: the 40-piece embeddings, the BiLSTM and the softmax head (no projection, no logits head).
    assert entry["parameters"] == 40 * 8 + student.get_layer("bilstm").count_params() + 12 * 11
    assert entry["parameters"] == latency.fused_inference_model(student, 4).count_params()
    assert entry["training_parameters"] == student.count_params()
    assert entry["compression"] == pytest.approx(teacher.count_params() / entry["parameters"])
    assert set(result["teacher"]["latency_ms"]["batch32"]) == {"tf.function", "xla"}
    assert set(entry["latency_ms"]["batch1"]) == {"block", "fused+xla", "keras", "keras+xla"}
    assert entry["size_bytes"] > 4 * entry["parameters"]  # float32 variables plus the graph
    json.dumps(result)  # what --output_json writes
    text = "\n".join(latency.format_lines(result))
    assert f"{entry['parameters']:>13,}" in text and "compression" in text and "speedup" in text


def test_work_dir_students_reads_the_runs_own_configuration(tmp_path):
    """bin/benchmark latency --work_dir=W times W's student (config.json's E x H); other students are refused."""
    (tmp_path / "config.json").write_text(json.dumps({"student": {"architecture": "bilstm", "embedding_dim": 50,
                                                                  "hidden": 200}}))
    assert latency.work_dir_students(tmp_path) == "50x200"
    (tmp_path / "config.json").write_text(json.dumps({"student": {"architecture": "transformer", "embedding_dim": 64}}))
    with pytest.raises(ValueError, match="not a BiLSTM .* pass --students"):
        latency.work_dir_students(tmp_path)
    with pytest.raises(ValueError, match="no config.json"):
        latency.work_dir_students(tmp_path / "absent")


PEER_ROWS = [("teacher", "tensorflow", "tf.function", "none", "ids"), ("teacher", "onnxruntime", "onnx", "none", "ids"),
             ("teacher", "onnxruntime", "onnx", "dynamic_int8", "ids")]
STUDENT_FORMATS = ([("tensorflow", "saved_model", "none")]
                   + [("onnxruntime", "onnx", q) for q in ("none", "dynamic_int8")]
                   + [("litert", "tflite", q) for q in ("none", "dynamic_int8")])


def _benchmark(*argv):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, str(REPO / "bin" / "benchmark"), "latency", *argv], capture_output=True,
                          text=True, env=env, timeout=900)


def _profiled_macs(fn, length: int) -> int:
    """The multiply-adds of the matrix products in fn(input_ids, attention_mask) at [1, length]: of each MatMul /
    BatchMatMul of the frozen graph as TensorFlow's own profiler counts them (2 flops a multiply-add), and of each
    Einsum (which the profiler does not count) the product of its indices' sizes."""
    spec = tf.TensorSpec([1, length], tf.int32)
    graph = convert_variables_to_constants_v2(tf.function(fn).get_concrete_function(spec, spec)).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options.update(output="none", account_type_regexes=[".*MatMul.*"])
    flops = tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops
    assert flops > 0 and flops % 2 == 0
    einsums = 0
    for op in graph.get_operations():
        if op.type == "Einsum":
            sizes = {}
            for subscripts, tensor in zip(op.get_attr("equation").decode().split("->")[0].split(","), op.inputs):
                sizes.update(zip(subscripts, tensor.shape.as_list()))
            einsums += int(np.prod(list(sizes.values())))
    return flops // 2 + einsums


def test_multiply_adds_per_query_are_what_tensorflows_profiler_counts():
    """peers.teacher_macs / student_macs against an independent count: TensorFlow's profiler over the teacher's
    exported graph and over the student's unrolled served graph (the fused kernel has no flops of its own), at two
    lengths (attention grows with the square of the length)."""
    config = latency.teacher_config(json.dumps(TINY_TEACHER))
    student = build_bilstm_student(64, 11, embedding_dim=8, hidden=6, teacher_hidden=16)
    for length in (8, 13):
        teacher = latency.build_teacher(config, length)
        num_tags = len(TagVocab(latency.LABELS))
        expected = _profiled_macs(lambda i, m: teacher.logits_and_tags({"input_ids": i, "attention_mask": m})[0],
                                  length)
        assert peers.teacher_macs(config, length, num_tags) == expected
        served = latency.fused_inference_model(student, length)
        expected = _profiled_macs(lambda i, m: served({"input_ids": i, "attention_mask": m})["probs"], length)
        assert peers.student_macs(served, length) == expected
        # The Keras served model (a Bidirectional LSTM) counts the same.
        assert peers.student_macs(served_model(student, StudentMeta(latency.LABELS)), length) == expected
    # By hand, at 8 pieces: 1 layer of H 16, I 32 (4*256 + 2*16*32 + 2*8*16 = 2304) + the head 16 x tags.
    assert peers.teacher_macs(config, 8, num_tags) == 8 * (2304 + 16 * num_tags)


def test_peer_rows_are_timed_interleaved_in_rounds(monkeypatch):
    """time_rows runs each row's calls in `rounds` shares, every row in turn within a round (after three warm-up
    calls each), and reports the median call time / batch size; a "time" here is what the fake call returns."""
    log = []

    def fake(name, seconds):
        def call(batch):
            log.append(name)
            return seconds * len(batch)
        return call

    monkeypatch.setattr(peers, "call_seconds", lambda fn: fn())
    queries = np.zeros((4, 3), np.int32)
    rows = [peers._row(("a",) * 5, fake("a", 0.002), queries, 3, peers.query_batches),
            peers._row(("b",) * 5, fake("b", 0.010), queries, 3, peers.query_batches)]
    peers.time_rows(rows, rounds=3)
    # Warm-up: 3 calls per row and batch size; then per round: a at batch 1 (4 of its 12 calls), a at batch 32
    # (1 of 3), b alike.
    assert log[:12] == ["a"] * 6 + ["b"] * 6
    timed = log[12:]
    assert timed == (["a"] * 5 + ["b"] * 5) * 3
    assert [r["latency_ms"] for r in rows] == [{"batch1": pytest.approx(2.0), "batch32": pytest.approx(2.0)},
                                               {"batch1": pytest.approx(10.0), "batch32": pytest.approx(10.0)}]
    assert "_timers" not in rows[0]


@pytest.mark.slow
def test_peer_rows_time_the_teacher_and_students_as_deployed(tmp_path):
    """bin/benchmark latency --latency_peers: the teacher in TF and ONNX Runtime float32/int8, the
    student in every exported format, ids and text, each row and ratio printed and in the JSON."""
    output = tmp_path / "latency.json"
    proc = _benchmark("--latency_peers", "--latency_threads=1", f"--teacher_config={json.dumps(TINY_TEACHER)}",
                      "--students=8x6", "--queries=3", "--seq_length=8", f"--output_json={output}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    formats = STUDENT_FORMATS + ([("tensorflow", "saved_model", "bfloat16")] if cpu_has_bf16() else [])
    expected = PEER_ROWS + [("8x6",) + f + (i,) for f in formats for i in ("ids", "text")]
    peers = json.loads(output.read_text(encoding="utf-8"))["peers"]
    assert peers["threads"] == 1
    rows = {tuple(r[k] for k in ("model", "runtime", "format", "quantize", "input")): r for r in peers["rows"]}
    assert sorted(rows) == sorted(expected)
    teacher_int8 = rows["teacher", "onnxruntime", "onnx", "dynamic_int8", "ids"]["latency_ms"]
    lines = proc.stdout.splitlines()
    assert peers["rounds"] == 5
    assert any(line.startswith("peers: threads 1 intra-op, 1 inter-op in TensorFlow, ONNX Runtime and LiteRT alike; "
                               "all rows interleaved in 5 rounds; ") for line in lines)
    macs = peers["macs_per_query"]
    assert sorted(macs) == ["8x6", "teacher"] and min(macs.values()) > 0
    assert (f"multiply-adds per query of 8 pieces: teacher {macs['teacher'] / 1e6:.1f}M; 8x6 {macs['8x6'] / 1e6:.1f}M "
            f"(teacher / student {macs['teacher'] / macs['8x6']:.1f}x)") in lines
    for key, row in rows.items():
        for batch in ("batch1", "batch32"):
            ms = row["latency_ms"][batch]
            assert ms > 0
            assert row["sentences_per_second_per_core"][batch] == pytest.approx(1000.0 / ms)
            if key[0] != "teacher":
                assert row["speedup_over_int8_onnx_teacher"][batch] == pytest.approx(teacher_int8[batch] / ms)
        printed = [line.split() for line in lines if line.split()[:5] == list(key)]
        assert len(printed) == 1, key
        cells = printed[0][5:]
        assert float(cells[0]) == pytest.approx(row["latency_ms"]["batch1"], abs=6e-4)
        if key[0] == "teacher":
            assert len(cells) == 4
        else:
            assert len(cells) == 6 and cells[4].endswith("x") and cells[5].endswith("x")
            assert float(cells[5][:-1]) == pytest.approx(row["speedup_over_int8_onnx_teacher"]["batch32"], abs=6e-3)


def test_latency_threads_needs_peers_and_fails_in_one_line():
    proc = _benchmark("--latency_threads=2", "--students=8x6")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("bin/benchmark latency: --latency_threads sets the threads of the "
                                                    "--latency_peers rows; pass --latency_peers")
