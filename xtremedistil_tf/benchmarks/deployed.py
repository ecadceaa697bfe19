"""`bin/benchmark deployed --work_dir=W`: W's own fine-tuned teacher and distilled student, timed as deployed.

The rows of `bin/benchmark latency --latency_peers` (benchmarks/peers.py: the same exports, the same reloading,
the same interleaved timer, the same ratios) for one work dir's pair: each model in TensorFlow (the teacher's
graph as `bin/export --teacher` converts it, the student's SavedModel as `bin/export` writes it) and in ONNX
Runtime with dynamic int8 weights, ids in (the same random queries of `--seq_length` pieces as `latency`), at
batch 1 and 32, every runtime on `--latency_threads` threads (1: per core). With `--deployed_rows=all` the
student's other formats (ONNX float32, TFLite, bfloat16) and the teacher's ONNX float32 join. The results go to
W/deployed.json, which `bin/report --summary` prints as the run's speed table (`speed_lines`).

    bin/benchmark deployed --work_dir=runs/demo [--latency_threads=1 --queries=256 --seq_length=32]
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import List

from absl import flags

from xtremedistil_tf.benchmarks import peers
from xtremedistil_tf.benchmarks.latency import DEFAULT_REPEATS, machine, make_queries
from xtremedistil_tf.benchmarks.latency import define_flags as define_latency_flags
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_json, check_output_file, read_json
from xtremedistil_tf.methods.student_run import load_student
from xtremedistil_tf.students.artifact import served_model
from xtremedistil_tf.teachers.saved import load_teacher

FLAGS = flags.FLAGS
RESULT = "deployed.json"

# The short table: each model in TensorFlow and in ONNX Runtime int8, ids in (keys as peers.KEYS).
DEPLOYED = (("teacher", "tensorflow", "tf.function", "none", "ids"),
            ("student", "tensorflow", "saved_model", "none", "ids"),
            ("teacher", "onnxruntime", "onnx", "dynamic_int8", "ids"),
            ("student", "onnxruntime", "onnx", "dynamic_int8", "ids"))


def define_flags() -> None:
    define_latency_flags()
    if "deployed_rows" not in FLAGS:
        flags.DEFINE_enum("deployed_rows", "short", ["short", "all"], "deployed: short: each model in TensorFlow "
                          "and ONNX Runtime int8; all: every format bin/export writes.")


def measure(work_dir, queries: int, seq_length: int, repeats: int, threads: int, rows: str = "short") -> dict:
    """The peers rows of `work_dir`'s teacher (teacher/model) and student (student/), timed together; a dict as
    latency's "peers" plus the machine and the work dir."""
    work = Path(work_dir)
    for step in ("teacher", "student"):
        if not (work / step / "step.json").exists():
            raise ConfigError(f"--work_dir={work_dir}: its {step} step is not done (bin/train makes it)")
    teacher, _ = load_teacher(work / "teacher" / "model")
    student, meta, _ = load_student(work / "student")
    if meta.architecture != "bilstm":
        raise ConfigError(f"--work_dir={work_dir}: bin/benchmark deployed times BiLSTM students; its student is a "
                          f"{meta.architecture}")
    served = served_model(student, meta)
    config = teacher.encoder.config
    formats = peers.ALL_FORMATS if rows == "all" else (("saved_model", "none"), ("onnx", "dynamic_int8"))
    with tempfile.TemporaryDirectory(prefix="deployed_") as tmp:
        built = peers.teacher_rows(teacher, make_queries(config.vocab_size, queries, seq_length), repeats, threads,
                                   Path(tmp))
        student_ids = make_queries(served.get_layer("word_embedding").input_dim, queries, seq_length)
        built += peers.student_dir_rows(work / "student", "student", student_ids, None, repeats, threads,
                                        Path(tmp) / "student", formats)
        if rows == "short":
            built = [row for row in built if tuple(row[k] for k in peers.KEYS) in DEPLOYED]
        timed = peers.with_ratios(peers.time_rows(built), threads)
    order = {key: i for i, key in enumerate(DEPLOYED)}
    timed.sort(key=lambda row: order.get(tuple(row[k] for k in peers.KEYS), len(order)))
    macs = {"teacher": peers.teacher_macs(config, seq_length, len(teacher.tag_vocab)),
            "student": peers.student_macs(served, seq_length)}
    return {"threads": threads, "rounds": peers.ROUNDS, "macs_per_query": macs, "rows": timed,
            "queries": queries, "seq_length": seq_length, "repeats": repeats, "machine": machine(),
            "work_dir": str(work_dir), "parameters": {"teacher": int(teacher.count_params()),
                                                      "student": int(served.count_params())}}


def _ms(result: dict, key: tuple) -> dict:
    return next(row["latency_ms"] for row in result["rows"] if tuple(row[k] for k in peers.KEYS) == key)


def speed_lines(result: dict) -> List[str]:
    """The run's speed table: ms per sentence of teacher and student at batch 1 and 32, in TensorFlow and in ONNX
    Runtime int8, and the student's speed-up (teacher ms / student ms); the CPU and threads named."""
    cpu = result["machine"].get("cpu_model") or result["machine"]["processor"]
    lines = [f"speed, ms per sentence of {result['seq_length']} pieces ({cpu}, {result['threads']} thread(s) each, "
             f"rows interleaved; bin/benchmark deployed):",
             f"  {'runtime':<26}{'teacher b1':>11}{'student b1':>11}{'speed-up':>9}"
             f"{'teacher b32':>13}{'student b32':>12}{'speed-up':>9}"]
    for (teacher, student), label in ((DEPLOYED[:2], "TensorFlow (SavedModel)"), (DEPLOYED[2:], "ONNX Runtime int8")):
        t, s = _ms(result, teacher), _ms(result, student)
        lines.append(f"  {label:<26}{t['batch1']:>11.3f}{s['batch1']:>11.3f}{t['batch1'] / s['batch1']:>8.1f}x"
                     f"{t['batch32']:>13.3f}{s['batch32']:>12.3f}{t['batch32'] / s['batch32']:>8.1f}x")
    macs = result["macs_per_query"]
    lines.append(f"  multiply-adds per sentence: teacher {macs['teacher'] / 1e6:.1f}M, student "
                 f"{macs['student'] / 1e6:.1f}M ({macs['teacher'] / macs['student']:.1f}x)")
    return lines


def read_result(work_dir):
    """W/deployed.json's result, or None when the benchmark has not run on W."""
    path = Path(work_dir) / RESULT
    return read_json(path) if path.exists() else None


def run(repeats: int) -> List[str]:
    define_flags()
    if not FLAGS.work_dir:
        raise ConfigError("--work_dir is required: a bin/train work dir with a teacher and a BiLSTM student")
    if FLAGS.latency_threads < 0 or FLAGS.queries < 1 or FLAGS.seq_length < 3:
        raise ConfigError(f"--latency_threads={FLAGS.latency_threads} --queries={FLAGS.queries} "
                          f"--seq_length={FLAGS.seq_length}: expected threads >= 0, queries >= 1, seq_length >= 3")
    output = FLAGS.output_json or str(Path(FLAGS.work_dir) / RESULT)
    check_output_file(output, f"--output_json={FLAGS.output_json}" if FLAGS.output_json else output)
    threads = peers.set_tensorflow_threads(FLAGS.latency_threads)
    passes = repeats if FLAGS["repeats"].present else DEFAULT_REPEATS
    result = measure(FLAGS.work_dir, FLAGS.queries, FLAGS.seq_length, passes, threads, FLAGS.deployed_rows)
    atomic_write_json(output, result)
    return (peers.format_lines(result, result["seq_length"]) + speed_lines(result)
            + [f"results written to {output}"])
