"""`bin/benchmark latency --latency_peers`: the teacher and the students as they would be deployed,
side by side in one process and one run (issue 33).

Rows (model, runtime, format, quantize, input), each timed at batch 1 and 32 on the run's ids
(students and teacher read the same [queries, seq_length] ids when the vocabularies agree) or on
texts of seq_length - 2 one-piece words (latency.word_texts):
- the teacher, ids in: TensorFlow (the graph bin/export --teacher converts: export.teacher.
  teacher_function), ONNX Runtime float32 and dynamic int8 (export.teacher.teacher_onnx);
- each student as bin/export writes it, ids in and text in: the SavedModel (`ids` and
  `serving_default` signatures, reloaded from disk; float32, and bfloat16 where the CPU has it),
  ONNX and TFLite float32 and dynamic int8 through the shipped predict.py (Predictor.run for ids,
  Predictor.predict for text), TFLite at the fixed length seq_length.
Each row gets per-query ms, sentences per second per core (1000 / ms / threads) and, for the
students, the speedup over the int8 ONNX teacher at the same batch (teacher ms / student ms). All
rows are built first and timed together, interleaved in rounds (`time_rows`), so that the ratios
survive a machine whose speed drifts during the run.
Every runtime runs `threads` intra-op threads and one inter-op thread (`set_tensorflow_threads`
must run before TensorFlow starts).

Beside the times, the multiply-adds of one query (`teacher_macs`, `student_macs`; their ratio is
the speedup at which the student would do its work no faster per multiply-add than the teacher:
at batch 32, where both are compute-bound, a ratio of times well above it would need the student's
small sequential matrix products to outrun the teacher's large ones).
"""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Callable, List

import numpy as np
import tensorflow as tf

from xtremedistil_tf.benchmarks.timing import BATCHES, LABELS, call_seconds, query_batches
from xtremedistil_tf.data.shapes import SHAPES
from xtremedistil_tf.export.bfloat16 import cpu_has_bf16
from xtremedistil_tf.export.formats import export_portable, quantize_onnx
from xtremedistil_tf.export.serving import export_student
from xtremedistil_tf.export.teacher import teacher_function, teacher_onnx
from xtremedistil_tf.students.artifact import StudentMeta, write_student_dir

TEACHER_PEER = ("teacher", "onnxruntime", "onnx", "dynamic_int8", "ids")
KEYS = ("model", "runtime", "format", "quantize", "input")
ROUNDS = 5  # time_rows


def set_tensorflow_threads(threads: int, inter_op: int = 1) -> int:
    """TensorFlow's intra-op threads = `threads` (0: the CPU count), inter-op `inter_op`; returns the count.
    A ValueError if TensorFlow already started with other settings."""
    threads = threads or os.cpu_count() or 1
    if threads < 1 or inter_op < 1:
        raise ValueError(f"--latency_threads must be >= 0 and inter-op threads >= 1; got {threads}, {inter_op}")
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:
        current = (tf.config.threading.get_intra_op_parallelism_threads(),
                   tf.config.threading.get_inter_op_parallelism_threads())
        if current != (threads, inter_op):
            raise ValueError(f"--latency_threads={threads}: TensorFlow started before its threads could be set "
                             f"(intra, inter = {current}); run bin/benchmark latency --latency_peers on its own") from None
    return threads


def teacher_macs(config, seq_length: int, num_tags: int) -> int:
    """Multiply-adds of a BERT-family token teacher on one query of `seq_length` pieces: per layer
    and position the query, key, value and output projections (4 H^2), the feed-forward (2 H I) and
    attention's scores and mix (2 T H); then the tag head (H x num_tags) per position. Embedding
    lookups, layer norms and softmaxes are not multiply-adds of matrices and are left out."""
    hidden, inner, length = config.hidden_size, config.intermediate_size, seq_length
    per_layer = 4 * hidden * hidden + 2 * hidden * inner + 2 * length * hidden
    return length * (config.num_hidden_layers * per_layer + hidden * num_tags)


def student_macs(served: tf.keras.Model, seq_length: int) -> int:
    """Multiply-adds of a served BiLSTM student on one query of `seq_length` pieces: per position, every
    weight matrix of its layers but the embedding (a lookup) multiplies one vector: each Dense kernel,
    and per LSTM direction the input and recurrent kernels (Keras's Bidirectional LSTM, or
    BlockBiLSTM's [2, D + H, 4H] `kernels`)."""
    per_position = sum(int(np.prod(weight.shape)) for layer in served.layers
                       if not isinstance(layer, tf.keras.layers.Embedding)
                       for weight in layer.weights if "kernel" in weight.name.split("/")[-1])
    return seq_length * per_position


def _row(key, call: Callable, queries, repeats: int, batch_of: Callable) -> dict:
    """One row, to be timed by `time_rows`: `call(batch)` at each of BATCHES over batch_of(queries, batch),
    `repeats` passes."""
    return {**dict(zip(KEYS, key)), "_timers": {b: (call, batch_of(queries, b), repeats) for b in BATCHES}}


def time_rows(rows: List[dict], rounds: int = ROUNDS) -> List[dict]:
    """Times every row, interleaved: three warm-up calls per row and batch size, then `rounds` rounds, each
    running every row's next share of its calls in turn, so that a machine whose speed drifts over the
    minutes of a run (this project's VM: 2x between runs 45 minutes apart) slows every row alike and the
    ratios hold. Per-query ms ("latency_ms"): the median of a row's call times over all rounds / the batch."""
    timers = [(row, b, call, batches, repeats * len(batches))
              for row in rows for b, (call, batches, repeats) in row.pop("_timers").items()]
    for _, _, call, batches, _ in timers:
        for i in range(3):
            call_seconds(lambda c=call, x=batches[i % len(batches)]: c(x))
    samples: List[List[float]] = [[] for _ in timers]
    for r in range(rounds):
        for (_, _, call, batches, total), times in zip(timers, samples):
            while len(times) < total * (r + 1) // rounds:
                times.append(call_seconds(lambda c=call, x=batches[len(times) % len(batches)]: c(x)))
    for (row, b, _, batches, _), times in zip(timers, samples):
        row.setdefault("latency_ms", {})[f"batch{b}"] = 1e3 * statistics.median(times) / len(batches[0])
    return rows


def _ids_call(fn: Callable, numpy_inputs: bool, case: bool = False) -> Callable:
    """fn(input_ids, attention_mask) over a batch of ids, all pieces real; with `case` (a student that reads word
    shapes) also the pieces' shapes, made up from the ids (the time does not depend on them)."""
    def shapes(ids):
        return (1 + ids % (len(SHAPES) - 1)).astype(np.int32)

    if numpy_inputs:
        return lambda ids: fn(ids, np.ones_like(ids), *([shapes(ids)] if case else []))
    return lambda ids: fn(tf.constant(ids), tf.ones(ids.shape, tf.int32), *([tf.constant(shapes(ids))] if case else []))


def teacher_rows(teacher, ids: np.ndarray, repeats: int, threads: int, workdir: Path) -> List[dict]:
    """The teacher in TensorFlow and in ONNX Runtime float32 / dynamic int8, ids in."""
    import onnxruntime

    function = teacher_function(teacher)
    rows = [_row(("teacher", "tensorflow", "tf.function", "none", "ids"),
                 _ids_call(lambda i, m: function(input_ids=i, attention_mask=m), False), ids, repeats, query_batches)]
    paths = {"none": workdir / "teacher.onnx", "dynamic_int8": workdir / "teacher.int8.onnx"}
    teacher_onnx(teacher, paths["none"])
    quantize_onnx(paths["none"], paths["dynamic_int8"])
    for quantize, path in paths.items():
        session = onnxruntime.InferenceSession(str(path), _ort_options(threads), providers=["CPUExecutionProvider"])
        run = _ids_call(lambda i, m, s=session: s.run(None, {"input_ids": i, "attention_mask": m}), True)
        rows.append(_row(("teacher", "onnxruntime", "onnx", quantize, "ids"), run, ids, repeats, query_batches))
    return rows


def _ort_options(threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return options


def student_rows(trained: tf.keras.Model, name: str, ids: np.ndarray, vocab: List[str], texts: np.ndarray,
                 repeats: int, threads: int, workdir: Path) -> List[dict]:
    """One student (a trained Keras BiLSTM student) in every format bin/export writes, ids in and text in."""
    root = workdir / name
    root.mkdir()
    (root / "vocab.txt").write_text("".join(p + "\n" for p in vocab), encoding="utf-8")
    student_dir = write_student_dir(trained, root / "student", StudentMeta(LABELS, max_seq_length=ids.shape[1]),
                                    str(root / "vocab.txt"))
    return student_dir_rows(student_dir, name, ids, texts, repeats, threads, root)


ALL_FORMATS = (("saved_model", "none"), ("saved_model", "bfloat16"), ("onnx", "none"), ("onnx", "dynamic_int8"),
               ("tflite", "none"), ("tflite", "dynamic_int8"))


def student_dir_rows(student_dir, name: str, ids: np.ndarray, texts, repeats: int, threads: int, root: Path,
                     formats=ALL_FORMATS) -> List[dict]:
    """The student of `student_dir` exported by bin/export's code into `root` in each of `formats` ((format,
    quantize); bfloat16 only where the CPU has it), reloaded as a client would, ids in, and text in unless
    `texts` is None."""
    rows = []
    for fmt, quantize in formats:
        if fmt != "saved_model" or (quantize == "bfloat16" and not cpu_has_bf16()):
            continue
        target, module = export_student(student_dir, root / f"saved_model_{quantize}",
                                        bfloat16=quantize == "bfloat16")
        signatures = tf.saved_model.load(str(target)).signatures
        ids_fn, text_fn = signatures["ids"], signatures["serving_default"]
        key = (name, "tensorflow", "saved_model", quantize)
        names = ("input_ids", "attention_mask", "case_ids")
        rows.append(_row(key + ("ids",), _ids_call(lambda *inputs, f=ids_fn: f(**dict(zip(names, inputs))), False,
                                                   module.case), ids, repeats, query_batches))
        if texts is not None:
            rows.append(_row(key + ("text",), lambda b, f=text_fn: f(text=tf.constant(b)), texts, repeats,
                             query_batches))
    shipped = str(Path(__file__).resolve().parent.parent / "export")
    if shipped not in sys.path:
        sys.path.insert(0, shipped)
    import portable  # noqa: PLC0415  (the shipped predict.py, found on the export folder's path as a client finds it)

    for fmt, quantize in formats:
        if fmt == "saved_model":
            continue
        lengths = (ids.shape[1],) if fmt == "tflite" else ()
        exported = export_portable(student_dir, root, "ner", fmt, quantize, lengths=lengths)
        predictor = portable.Predictor(exported.directory, threads=threads)
        key = (name, "onnxruntime" if fmt == "onnx" else "litert", fmt, quantize)
        rows.append(_row(key + ("ids",), _ids_call(predictor.run, True, predictor.case), ids, repeats, query_batches))
        if texts is not None:
            rows.append(_row(key + ("text",), lambda b, p=predictor: p.predict(list(b), batch_size=len(b)), texts,
                             repeats, query_batches))
    return rows


def with_ratios(rows: List[dict], threads: int) -> List[dict]:
    """Adds sentences per second per core to every row, and to each student row its speedup over
    the int8 ONNX teacher (TEACHER_PEER) at the same batch."""
    peer = next(r for r in rows if tuple(r[k] for k in KEYS) == TEACHER_PEER)
    for row in rows:
        row["sentences_per_second_per_core"] = {b: 1000.0 / ms / threads for b, ms in row["latency_ms"].items()}
        if row["model"] != "teacher":
            row["speedup_over_int8_onnx_teacher"] = {b: peer["latency_ms"][b] / ms
                                                     for b, ms in row["latency_ms"].items()}
    return rows


def format_lines(peers: dict, seq_length: int) -> List[str]:
    """The peers table: one line per row."""
    threads = peers["threads"]
    lines = [f"peers: threads {threads} intra-op, 1 inter-op in TensorFlow, ONNX Runtime and LiteRT alike; all rows "
             f"interleaved in {peers['rounds']} rounds; ids: "
             f"the run's queries of {seq_length} pieces; text: {seq_length - 2} one-piece words a query; "
             "sent/s/core = 1000 / ms / threads; x int8 teacher = the int8 ONNX teacher's ms / the row's",
             f"{'model':<10}{'runtime':<13}{'format':<13}{'quantize':<14}{'input':<7}{'b1 ms':>10}{'b32 ms':>10}"
             f"{'b1 sent/s/core':>16}{'b32 sent/s/core':>17}{'b1 x int8 teacher':>19}{'b32 x int8 teacher':>20}"]
    macs = peers["macs_per_query"]
    teacher = macs["teacher"]
    lines.insert(1, f"multiply-adds per query of {seq_length} pieces: teacher {teacher / 1e6:.1f}M; " + "; ".join(
        f"{name} {value / 1e6:.1f}M (teacher / student {teacher / value:.1f}x)"
        for name, value in macs.items() if name != "teacher"))
    for row in peers["rows"]:
        ms, rate = row["latency_ms"], row["sentences_per_second_per_core"]
        ratio = row.get("speedup_over_int8_onnx_teacher")
        line = (f"{row['model']:<10}{row['runtime']:<13}{row['format']:<13}{row['quantize']:<14}{row['input']:<7}"
                f"{ms['batch1']:>10.3f}{ms['batch32']:>10.3f}{rate['batch1']:>16.1f}{rate['batch32']:>17.1f}")
        if ratio:
            line += f"{ratio['batch1']:>18.2f}x{ratio['batch32']:>19.2f}x"
        lines.append(line)
    return lines
