"""bin/benchmark deployed: a work dir's own teacher and student timed by bin/benchmark latency --latency_peers' code
(the same rows, exports and ratios), and the speed table make demo's summary prints from its JSON."""
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_bad_inputs import ENV
from test_transfer_text import small_config, write_small_corpus

from xtremedistil_tf.benchmarks import deployed, peers
from xtremedistil_tf.export.bfloat16 import cpu_has_bf16
from xtremedistil_tf.run import pipeline

KEYS = peers.KEYS


def fake_result():
    rows = [dict(zip(KEYS, key), latency_ms={"batch1": b1, "batch32": b32})
            for key, (b1, b32) in zip(deployed.DEPLOYED, [(5.0, 2.0), (0.5, 0.1), (2.5, 1.0), (0.25, 0.04)])]
    return {"rows": rows, "threads": 1, "seq_length": 32, "macs_per_query": {"teacher": 344.6e6, "student": 17.85e6},
            "machine": {"cpu_model": "AMD EPYC 7B13", "processor": "x86_64"}}


def test_speed_lines_are_each_runtimes_teacher_over_student():
    lines = deployed.speed_lines(fake_result())
    assert lines[0] == ("speed, ms per sentence of 32 pieces (AMD EPYC 7B13, 1 thread(s) each, rows interleaved; "
                        "bin/benchmark deployed):")
    assert lines[2].split() == ["TensorFlow", "(SavedModel)", "5.000", "0.500", "10.0x", "2.000", "0.100", "20.0x"]
    assert lines[3].split() == ["ONNX", "Runtime", "int8", "2.500", "0.250", "10.0x", "1.000", "0.040", "25.0x"]
    assert lines[4] == "  multiply-adds per sentence: teacher 344.6M, student 17.9M (19.3x)"


@pytest.fixture(scope="module")
def finished_work_dir(tmp_path_factory, tiny_bert_dir):
    corpus = write_small_corpus(tmp_path_factory.mktemp("corpus"))
    cfg = small_config(tmp_path_factory.mktemp("work"), corpus, tiny_bert_dir)
    cfg.teacher.finetune.epochs = 0
    pipeline.run(cfg)
    return Path(cfg.work_dir)


@pytest.mark.slow   # a pipeline run, then four exports of teacher and student (about a minute)
def test_a_work_dirs_pair_is_timed_by_the_peers_code(finished_work_dir):
    """--deployed_rows=short: the four rows of deployed.DEPLOYED, in that order; all: the teacher's three peers rows
    and the student's in every format bin/export writes (ids in), as latency --latency_peers times a student; each
    with peers.with_ratios' ratios. The console prints speed_lines of the JSON it wrote."""
    out = subprocess.run([sys.executable, str(REPO / "bin" / "benchmark"), "deployed", f"--work_dir={finished_work_dir}",
                          "--latency_threads=1", "--queries=3", "--seq_length=8"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    result = deployed.read_result(finished_work_dir)
    assert [tuple(r[k] for k in KEYS) for r in result["rows"]] == list(deployed.DEPLOYED)
    assert out.stdout.splitlines()[-6:-1] == deployed.speed_lines(result)
    peer = result["rows"][2]["latency_ms"]
    for row in result["rows"]:
        if row["model"] == "student":
            assert row["speedup_over_int8_onnx_teacher"]["batch32"] == pytest.approx(
                peer["batch32"] / row["latency_ms"]["batch32"])
    assert result["macs_per_query"]["teacher"] > result["macs_per_query"]["student"] > 0

    every = deployed.measure(finished_work_dir, queries=3, seq_length=8, repeats=1, threads=1, rows="all")
    formats = [f for f in peers.ALL_FORMATS if f[1] != "bfloat16" or cpu_has_bf16()]
    runtime = {"saved_model": "tensorflow", "onnx": "onnxruntime", "tflite": "litert"}
    expected = list(deployed.DEPLOYED) + sorted(
        {("teacher", "onnxruntime", "onnx", "none", "ids")}
        | {("student", runtime[f], f, q, "ids") for f, q in formats} - set(deployed.DEPLOYED))
    rows = [tuple(r[k] for k in KEYS) for r in every["rows"]]
    assert rows[:4] == expected[:4] and sorted(rows[4:]) == expected[4:]


# What a user's shell has: TensorFlow's C++ log level not set (the commands set it before TensorFlow loads).
SHELL_ENV = {k: v for k, v in ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


@pytest.mark.slow   # the pipeline run of finished_work_dir, an int8 ONNX export and the deployed benchmark
def test_the_console_of_export_and_the_deployed_benchmark_holds_only_our_lines(finished_work_dir, tmp_path):
    """ONNX Runtime's quantizer logs through the root logger ("Quantization parameters for tensor ... not specified",
    "Ignore MatMul due to non constant B", "Please consider to run pre-processing before quantization", a protobuf
    dump); tf2onnx, TensorFlow's C++ side and absl have their own: none of it reaches the console by default."""
    commands = {
        "export": [str(REPO / "bin" / "export"), f"--work_dir={finished_work_dir}", "--format=onnx",
                   "--quantize=dynamic_int8", f"--export_dir={tmp_path / 'export'}"],
        "deployed": [str(REPO / "bin" / "benchmark"), "deployed", f"--work_dir={finished_work_dir}",
                     "--latency_threads=1", "--queries=3", "--seq_length=8", "--no_progress"]}
    for name, args in commands.items():
        out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=SHELL_ENV, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stderr == "", f"{name}: {out.stderr[-3000:]}"   # --no_progress: the commands' lines are on stdout
        assert out.stdout.strip(), name
