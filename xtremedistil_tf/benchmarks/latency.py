"""`bin/benchmark latency`: teacher vs BiLSTM students, side by side (XtremeDistil section 6.2, Table 16).

One process, one run: parameters, size on disk of an exported inference SavedModel, and per-query
latency at batch 1 (online) and batch 32 over `--queries` queries of `--seq_length` pieces, with
compression and speedup. Both models are served the same way: `tf.function` concrete functions
over int32 `input_ids`/`attention_mask` [B, T] returning tag probabilities, with and without XLA.

Models are randomly initialised (latency and size do not depend on the weights): the teacher from
`--teacher_config` (a name in TEACHER_CONFIGS, a JSON object or a JSON file of config fields: BERT unless `model_type` names another, e.g. a model's own config.json),
the students from `--students` as ExH pairs, with `--student_heads_on` (projection: the task heads
read the GELU projection, the default of training; states: they read the BiLSTM states and the
projection is training-only) and `--student_vocab_size` word pieces (0: the teacher's; fewer models
a student exported with `bin/export --prune_vocab`).

Each student is timed in three served graphs, all without the training-only heads: `keras`, the
Keras sub-model to `probs` that bin/export serves (students.artifact.served_model); `fused`
(`fused_inference_model`, under XLA), whose BiLSTM is unrolled over the fixed query length, with
the input matmul hoisted out of the recurrence and no mask in it (BlockBiLSTM(unroll=True), what
bin/export --xla_lengths serves); and `block`, whose BiLSTM is TensorFlow's fused LSTM kernel
(BlockBiLSTM, what bin/export serves by default).

With `--work_dir=W` (and no `--students`) the student is W's own configuration (config.json's E and
H), and the results go to W/latency.json (unless `--output_json`), where bin/report reads them to
plot W's F1 against speedup (run/report.py, figure1.png).

With `--latency_peers` the same run also times what a practitioner would deploy (benchmarks/peers.py):
the teacher in ONNX Runtime float32 and dynamic int8 beside TensorFlow, each student as bin/export
writes it (SavedModel, ONNX, TFLite; ids in and text in), with every runtime on `--latency_threads`
threads and each student row's speedup over the int8 ONNX teacher ("peers" in the JSON).
"""
from __future__ import annotations

import itertools
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import flags
from transformers import AutoConfig, TFAutoModel

from xtremedistil_tf.benchmarks import peers
from xtremedistil_tf.benchmarks.peers import set_tensorflow_threads
from xtremedistil_tf.benchmarks.timing import BATCHES, LABELS, median_ms, query_batches
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.export.serving import NerServing
from xtremedistil_tf.io import atomic_write_json, check_output_file, dir_size
from xtremedistil_tf.students.artifact import StudentMeta, served_model
from xtremedistil_tf.students.layers import BlockBiLSTM, SequenceMask
from xtremedistil_tf.students.models import HEADS_ON, build_bilstm_student
from xtremedistil_tf.teachers.model import TokenTeacher

FLAGS = flags.FLAGS


def define_flags() -> None:
    """This benchmark's flags; call before flags are parsed (bin/benchmark does).

    Idempotent, and a flag another command already defines with the same meaning (e.g.
    bin/evaluate's --output_json) is shared rather than defined twice in one process.
    """
    definitions = [
        ("teacher_config", "mbert-base", "latency: teacher config: a name (mbert-base), a JSON object or a JSON file (a model's config.json: its model_type, else BERT)."),
        ("students", "50x200,100x400,300x600", "latency: student (E, H) pairs as ExH, comma-separated (paper Table 16)."),
        ("output_json", "", "Also write the results here (JSON, written atomically; bin/report reads latency results)."),
        ("student_heads_on", "projection", f"latency: what the students' task heads read, one of {HEADS_ON} "
                                           "(students.models; states leaves the projection out of the served graph)."),
    ]
    for name, default, help_text in definitions:
        if name not in FLAGS:
            flags.DEFINE_string(name, default, help_text)
    for name, default, help_text in [("queries", 1000, "latency: queries per pass (paper: 1,000)."),
                                     ("seq_length", 32, "latency: pieces per query, CLS and SEP included (paper: 32)."),
                                     ("student_vocab_size", 0, "latency: the students' word pieces (0: the teacher's; "
                                                               "fewer: a vocabulary pruned by bin/export --prune_vocab).")]:
        if name not in FLAGS:
            flags.DEFINE_integer(name, default, help_text)
    if "latency_peers" not in FLAGS:
        flags.DEFINE_bool("latency_peers", False, "latency: also time what a practitioner would deploy, in the same "
                          "run on the same ids and texts: the teacher in TensorFlow and in ONNX Runtime float32 and "
                          "dynamic int8 (bin/export --teacher), each student as bin/export writes it (SavedModel, "
                          "ONNX, TFLite; float32, dynamic int8, bfloat16 where the CPU has it; ids in and text in), "
                          "with each student row's speedup over the int8 ONNX teacher.")
        flags.DEFINE_integer("latency_threads", 0, "latency --latency_peers: intra-op threads of every runtime "
                                                   "(TensorFlow, ONNX Runtime, TFLite; inter-op 1); 0: the CPU count.")

TEACHER_CONFIGS = {
    # mBERT-base: 177.9M parameters with its 119,547-piece vocabulary (the paper's "179MM").
    "mbert-base": dict(vocab_size=119547, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=3072),
}
DEFAULT_REPEATS = 1  # passes when --repeats is not given: one teacher pass at batch 1 is 70+ s


def teacher_config(spec: str):
    """The teacher's config from a name in TEACHER_CONFIGS, a JSON object, or the path of a JSON file (a model's
    config.json): of its `model_type` (e.g. mpnet: the architecture itself, relative position bias and all), BERT
    when it names none."""
    if spec in TEACHER_CONFIGS:
        fields = dict(TEACHER_CONFIGS[spec])
    elif spec.lstrip().startswith("{"):
        fields = json.loads(spec)
    else:
        fields = json.loads(Path(spec).read_text(encoding="utf-8"))
    return AutoConfig.for_model(fields.pop("model_type", "bert"), **fields)


def build_teacher(config, seq_length: int):
    """A randomly initialised TokenTeacher over `config`, built for `seq_length`."""
    encoder = TFAutoModel.from_config(config)
    encoder.build_in_name_scope()
    teacher = TokenTeacher(encoder, TagVocab(LABELS), max_seq_length=seq_length)
    teacher.build_for_length(seq_length)
    return teacher


def parse_students(spec: str) -> List[Tuple[int, int]]:
    pairs = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        e, _, h = item.lower().partition("x")
        if not (e.isdigit() and h.isdigit()):
            raise ValueError(f"--students: {item!r} is not ExH (e.g. 50x200)")
        pairs.append((int(e), int(h)))
    return pairs


def fused_inference_model(student: tf.keras.Model, seq_length: int, unroll: bool = True) -> tf.keras.Model:
    """The served graph of a trained BiLSTM student on a BlockBiLSTM, unrolled over the fixed
    `seq_length` (for XLA) or not (the fused kernel): {"input_ids", "attention_mask"} [B, seq_length]
    -> {"probs"}, with the student's weights (embeddings, BiLSTM, the projection when the softmax
    head reads it, softmax)."""
    ids = tf.keras.Input((seq_length,), dtype=tf.int32, name="input_ids")
    attention_mask = tf.keras.Input((seq_length,), dtype=tf.int32, name="attention_mask")
    trained = {name: student.get_layer(name) for name in ("word_embedding", "bilstm", "projection", "softmax")}
    x = tf.keras.layers.Embedding(trained["word_embedding"].input_dim, trained["word_embedding"].output_dim,
                                  name="word_embedding")(ids)
    bilstm = BlockBiLSTM(trained["bilstm"].forward_layer.units, unroll=unroll, name="bilstm")
    x = bilstm(x, mask=SequenceMask(name="sequence_mask")(attention_mask))
    copies = [(bilstm, None)]
    if _softmax_reads_projection(student):
        projection = tf.keras.layers.Dense(trained["projection"].units, activation="gelu", name="projection")
        x = projection(x)
        copies.append((projection, trained["projection"]))
    softmax = tf.keras.layers.Dense(trained["softmax"].units, use_bias=False, name="softmax")
    probs = tf.keras.layers.Activation("softmax", name="probs")(softmax(x))
    copies.append((softmax, trained["softmax"]))
    model = tf.keras.Model({"input_ids": ids, "attention_mask": attention_mask}, {"probs": probs},
                           name=f"{student.name}_inference")
    model.get_layer("word_embedding").set_weights(trained["word_embedding"].get_weights())
    bilstm.set_from_bidirectional(trained["bilstm"])
    for layer, source in copies[1:]:
        layer.set_weights(source.get_weights())
    return model


def _softmax_reads_projection(student: tf.keras.Model) -> bool:
    """Whether the student was built with heads_on="projection" (its softmax head reads the projection)."""
    return any(node.layer.name == "projection_dropout"
               for node in student.get_layer("softmax").inbound_nodes[0].parent_nodes)


def probs_fn(model, jit: bool, seq_length: int) -> Callable:
    """(input_ids, attention_mask) -> tag probabilities [B, T, N], compiled for any batch size.

    Teachers return logits (a softmax is added); students return a dict with "probs".
    """
    spec = tf.TensorSpec([None, seq_length], tf.int32)

    def probs(input_ids, attention_mask):
        out = model({"input_ids": input_ids, "attention_mask": attention_mask}, training=False)
        return out["probs"] if isinstance(out, dict) else tf.nn.softmax(out)

    return tf.function(probs, input_signature=[spec, spec], jit_compile=jit)


def make_queries(vocab_size: int, count: int, seq_length: int, seed: int = 0) -> np.ndarray:
    """[count, seq_length] int32 ids: [CLS] (101), random pieces, [SEP] (102) as in BERT vocabularies."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000 % vocab_size, vocab_size, (count, seq_length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101 % vocab_size, 102 % vocab_size
    return ids


def per_query_ms(fn: Callable, queries: np.ndarray, batch: int, repeats: int) -> float:
    """Median over every batch of `repeats` passes over `queries` of the batch's wall time / batch.

    The median of per-call times resists the load spikes of a shared machine better than a
    pass total; the last batch wraps around to the first queries so all calls have one shape.
    """
    batches = [tf.constant(b) for b in query_batches(queries, batch)]
    mask = tf.ones_like(batches[0])
    return _median_call_ms(lambda ids_batch: fn(ids_batch, mask), batches, repeats) / batch


def saved_model_bytes(model, seq_length: int) -> int:
    """Bytes of an inference SavedModel (one `probs` signature over ids) written to a temp dir."""
    module = tf.Module()
    # Only the variables are tracked: tracking the Keras model would make tf.saved_model.save
    # serialise every layer the Keras way (slow, and not what is served).
    module.model_variables = list(model.variables)
    module.probs = probs_fn(model, False, seq_length)
    with tempfile.TemporaryDirectory() as tmp:
        tf.saved_model.save(module, tmp, signatures={"serving_default": module.probs.get_concrete_function()})
        return dir_size(tmp)


def latencies(model, queries: np.ndarray, repeats: int, modes: Dict[str, bool]) -> Dict[str, Dict[str, float]]:
    """{"batch1": {mode: ms per query}, "batch32": {...}} for each mode name -> jit_compile."""
    seq_length = queries.shape[1]
    fns = {mode: probs_fn(model, jit, seq_length) for mode, jit in modes.items()}
    return {f"batch{b}": {mode: per_query_ms(fn, queries, b, repeats) for mode, fn in fns.items()}
            for b in BATCHES}


def string_signature_ms(student: tf.keras.Model, vocab_size: int, queries: int, repeats: int,
                        seq_length: int, xla_lengths: Sequence[int] = ()) -> Dict[str, float]:
    """Per-query ms of the `serving_default` (raw text) signature of a SavedModel exported the way
    bin/export does it (export.serving.NerServing: the fused LSTM kernel, or with `xla_lengths` the
    unrolled BiLSTM under XLA), reloaded from disk."""
    vocab, texts = word_texts(vocab_size, queries, seq_length)
    module = NerServing(student, StudentMeta(labels=LABELS), vocab, xla_lengths=xla_lengths)
    with tempfile.TemporaryDirectory() as tmp:
        tf.saved_model.save(module, tmp, signatures={"serving_default": module.serve.get_concrete_function()})
        serve = tf.saved_model.load(tmp).signatures["serving_default"]
        return {f"batch{batch}": _median_call_ms(lambda b: serve(text=b)["num_words"],
                                                 [tf.constant(b) for b in query_batches(texts, batch)], repeats) / batch
                for batch in BATCHES}


def word_texts(vocab_size: int, queries: int, seq_length: int) -> Tuple[List[str], np.ndarray]:
    """(a vocabulary of `vocab_size` pieces: the specials, then w0..wN, whole words of one piece each;
    `queries` texts of seq_length - 2 such words, so each is a query of seq_length pieces with
    [CLS] and [SEP])."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [f"w{i}" for i in range(vocab_size - len(vocab))]
    words = np.random.default_rng(0).integers(len(vocab) - 5, size=(queries, seq_length - 2))
    return vocab, np.array([" ".join(f"w{i}" for i in row) for row in words], dtype=object)


def _median_call_ms(fn: Callable, batches: Sequence[tf.Tensor], repeats: int) -> float:
    """Median ms of fn(batch) over `repeats` passes over `batches`, after three warm-up calls (tracing
    and XLA compilation)."""
    cycle = itertools.cycle(batches)
    return median_ms(lambda: fn(next(cycle)), repeats * len(batches), warmup=3)


def _best(latency: Dict[str, Dict[str, float]]) -> Dict[str, Tuple[str, float]]:
    return {b: min(modes.items(), key=lambda kv: kv[1]) for b, modes in latency.items()}


def measure(teacher_spec: str, students: Sequence[Tuple[int, int]], queries: int, seq_length: int,
            repeats: int, string_signature: bool = True, heads_on: str = "projection",
            student_vocab_size: int = 0, peer_threads: int = 0) -> dict:
    """All measurements as a JSON-ready dict (see `format_lines`); with `peer_threads` (> 0) also
    "peers" (benchmarks/peers.py), every runtime on that many threads."""
    with tempfile.TemporaryDirectory(prefix="latency_peers_") as tmp:
        return _measure(teacher_spec, students, queries, seq_length, repeats, string_signature, heads_on,
                        student_vocab_size, peer_threads, Path(tmp))


def _measure(teacher_spec, students, queries, seq_length, repeats, string_signature, heads_on, student_vocab_size,
             peer_threads, tmp: Path) -> dict:
    config = teacher_config(teacher_spec)
    ids = make_queries(config.vocab_size, queries, seq_length)
    student_vocab = student_vocab_size or config.vocab_size
    student_ids = make_queries(student_vocab, queries, seq_length)
    teacher = build_teacher(config, seq_length)
    result = {"teacher": {"config": teacher_spec, "parameters": int(teacher.count_params()),
                          "size_bytes": saved_model_bytes(teacher, seq_length),
                          "latency_ms": latencies(teacher, ids, repeats, {"tf.function": False, "xla": True})},
              "students": [], "queries": queries, "seq_length": seq_length, "repeats": repeats,
              "student_heads_on": heads_on, "student_vocab_size": student_vocab, "machine": machine()}
    rows = peers.teacher_rows(teacher, ids, repeats, peer_threads, tmp) if peer_threads else []
    macs = {"teacher": peers.teacher_macs(config, seq_length, len(TagVocab(LABELS)))}
    vocab, texts = word_texts(student_vocab, queries, seq_length)
    del teacher
    for e, h in students:
        trained = build_bilstm_student(student_vocab, len(TagVocab(LABELS)), e, h, config.hidden_size,
                                       name=f"student_{e}x{h}", heads_on=heads_on)
        served = served_model(trained, StudentMeta(LABELS))
        entry = {"name": f"{e}x{h}", "embedding_dim": e, "hidden": h, "parameters": int(served.count_params()),
                 "training_parameters": int(trained.count_params()),
                 "size_bytes": saved_model_bytes(served, seq_length)}
        entry["latency_ms"] = latencies(served, student_ids, repeats, {"keras": False, "keras+xla": True})
        # The unrolled graph is timed only under XLA (without it, ~600 small ops are dispatched one by
        # one: the slowest mode in every earlier run); BlockLSTMV2 has no XLA kernel.
        fused = latencies(fused_inference_model(trained, seq_length), student_ids, repeats, {"fused+xla": True})
        block = latencies(fused_inference_model(trained, seq_length, unroll=False), student_ids, repeats,
                          {"block": False})
        for b in BATCHES:
            entry["latency_ms"][f"batch{b}"].update({**fused[f"batch{b}"], **block[f"batch{b}"]})
        if string_signature:
            entry["string_signature_ms"] = string_signature_ms(trained, student_vocab, queries, repeats,
                                                               seq_length)
            entry["string_signature_xla_ms"] = string_signature_ms(trained, student_vocab, queries, repeats,
                                                                   seq_length, xla_lengths=(seq_length,))
        result["students"].append(_with_ratios(entry, result["teacher"]))
        if peer_threads:
            rows += peers.student_rows(trained, entry["name"], student_ids, vocab, texts, repeats, peer_threads, tmp)
            macs[entry["name"]] = peers.student_macs(served, seq_length)
    if peer_threads:
        result["peers"] = {"threads": peer_threads, "rounds": peers.ROUNDS, "macs_per_query": macs,
                           "rows": peers.with_ratios(peers.time_rows(rows), peer_threads)}
    return result


def _with_ratios(student: dict, teacher: dict) -> dict:
    teacher_best, student_best = _best(teacher["latency_ms"]), _best(student["latency_ms"])
    student["compression"] = teacher["parameters"] / student["parameters"]
    student["size_ratio"] = teacher["size_bytes"] / student["size_bytes"]
    for b in teacher_best:
        student[f"speedup_{b}"] = teacher_best[b][1] / student_best[b][1]
    return student


def machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"tensorflow": tf.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "cpu_model": cpu_model(),
            "load_average": [round(x, 2) for x in load]}


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (Linux), else ''."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        return ""


def format_lines(result: dict) -> List[str]:
    t, m = result["teacher"], result["machine"]
    modes = ["tf.function", "xla", "keras", "keras+xla", "fused+xla", "block"]
    lines = [
        f"latency: {result['queries']} queries of {result['seq_length']} pieces, per-query ms = median over "
        f"{result['repeats']} pass(es) of the per-call time / batch; teacher {t['config']}",
        f"tensorflow {m['tensorflow']}, python {m['python']}, {m['cpus']} CPUs, load average at the end "
        f"{', '.join(map(str, m['load_average']))}",
        f"students: heads on the {result['student_heads_on']}, {result['student_vocab_size']:,} word pieces; "
        "parameters: of the served graph (students: embeddings + BiLSTM + the heads on the path to the tags; "
        "the teacher: TokenTeacher.count_params()); size: inference SavedModel on disk",
        f"{'model':<10}{'params':>13}{'MiB':>8}  " + "".join(f"{'b1 ' + x:>15}" for x in modes),
        f"{'':<10}{'':>13}{'':>8}  " + "".join(f"{'b32 ' + x:>15}" for x in modes),
    ]
    for name, entry in [("teacher", t)] + [(s["name"], s) for s in result["students"]]:
        head = f"{name:<10}{entry['parameters']:>13,}{entry['size_bytes'] / 2**20:>8.1f}  "
        for b in BATCHES:
            cells = entry["latency_ms"][f"batch{b}"]
            lines.append((head if b == 1 else " " * len(head))
                         + "".join(f"{cells[x]:>15.3f}" if x in cells else f"{'-':>15}" for x in modes))
    lines.append("ratios (teacher / student; latency: best mode of each):")
    for s in result["students"]:
        best = _best(s["latency_ms"])
        line = (f"  {s['name']:<8} compression {s['compression']:.1f}x params ({s['training_parameters']:,} "
                f"when training), {s['size_ratio']:.1f}x disk, speedup {s['speedup_batch1']:.1f}x at batch 1 "
                f"({best['batch1'][0]}), {s['speedup_batch32']:.1f}x at batch 32 ({best['batch32'][0]})")
        lines.append(line)
        for key, how in (("string_signature_ms", "fused kernel"),
                         ("string_signature_xla_ms", f"--xla_lengths={result['seq_length']}")):
            if key in s:
                sig = s[key]
                lines.append(f"  {'':<8} exported string signature (tokenizer in graph, {how}): "
                             f"{sig['batch1']:.3f} ms/query at batch 1, {sig['batch32']:.3f} at batch 32")
    if "peers" in result:
        lines += peers.format_lines(result["peers"], result["seq_length"])
    return lines


def work_dir_students(work_dir) -> str:
    """`--students` for a work dir: its student's ExH from config.json (a BiLSTM student's)."""
    path = Path(work_dir) / "config.json"
    if not path.exists():
        raise ValueError(f"--work_dir={work_dir}: no config.json (a bin/train work dir); pass --students")
    student = json.loads(path.read_text(encoding="utf-8")).get("student") or {}
    student = student.get("arch", student)   # the config.json of a run before StudentArch: one flat dict
    sized = student.get("embedding_dim") and student.get("hidden")
    if student.get("architecture", "bilstm") != "bilstm" or not sized:
        raise ValueError(f"--work_dir={work_dir}: its student is not a BiLSTM with embedding_dim and hidden "
                         "(bin/benchmark latency times BiLSTM students); pass --students")
    return f"{student['embedding_dim']}x{student['hidden']}"


def run(repeats: int) -> List[str]:
    define_flags()  # no-op when bin/benchmark defined them before parsing
    # --repeats defaults to 50 for the cheap CRF benchmark; here one pass is already 1,000 calls.
    passes = repeats if FLAGS["repeats"].present else DEFAULT_REPEATS
    if FLAGS.student_heads_on not in HEADS_ON:
        raise ValueError(f"--student_heads_on must be one of {HEADS_ON}; got {FLAGS.student_heads_on!r}")
    if FLAGS.student_vocab_size < 0:
        raise ValueError(f"--student_vocab_size must be >= 0; got {FLAGS.student_vocab_size}")
    work_dir = FLAGS.work_dir if "work_dir" in FLAGS else ""
    students = FLAGS.students if FLAGS["students"].present or not work_dir else work_dir_students(work_dir)
    output = FLAGS.output_json or (str(Path(work_dir) / "latency.json") if work_dir else "")
    if output:
        check_output_file(output, f"--output_json={FLAGS.output_json}" if FLAGS.output_json else output)
    if FLAGS.latency_threads < 0:
        raise ValueError(f"--latency_threads must be >= 0; got {FLAGS.latency_threads}")
    if FLAGS["latency_threads"].present and not FLAGS.latency_peers:
        raise ValueError("--latency_threads sets the threads of the --latency_peers rows; pass --latency_peers")
    threads = 0
    if FLAGS.latency_peers:
        threads = set_tensorflow_threads(FLAGS.latency_threads)
    result = measure(FLAGS.teacher_config, parse_students(students), FLAGS.queries, FLAGS.seq_length,
                     passes, heads_on=FLAGS.student_heads_on, student_vocab_size=FLAGS.student_vocab_size,
                     peer_threads=threads)
    if output:
        atomic_write_json(output, result)
    return format_lines(result) + ([f"results written to {output}"] if output else [])
