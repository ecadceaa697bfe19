"""`bin/benchmark served_text`: where the batch-1 time of the SavedModel's `serving_default` (text in,
entities out) goes (issue 33 item 2).

A BiLSTM student of `--students` (the first ExH pair; untrained: the time does not depend on the
weights) over a vocabulary of `--student_vocab_size` one-piece words (latency.word_texts), served as
bin/export serves it (export.serving.NerServing). Texts are `--seq_length` - 2 such words, so each is a
query of `--seq_length` pieces. Each stage of `serve` runs on its own as a `tf.function` on the outputs
of the stage before (median ms per call at batch 1 over `--queries` texts, `--repeats` passes):

- tokens: valid UTF-8, the word split and the WordPieces (export.words.WordPieces), with its parts
  (valid_utf8, WordPieces.words, WordPieces.pieces) timed on their own as well;
- windows: the windows of pieces with [CLS]/[SEP] (serving.windows_of) and where each word's first piece is;
- student: the served model on the windows;
- word tags: the word decoder (crf/decoding.py) on the probabilities at the words' first pieces;
- entities: span decoding, character offsets and the padded outputs.

Beside them: the whole `serving_default` signature reloaded from disk, the student graph alone on ids
(the `keras+xla` row of `bin/benchmark latency`) and an empty `tf.function` call (each stage's time
includes one call's overhead, which the whole signature pays once).

With `--served_exports=DIR,DIR,...` it times those exports instead, interleaved in one process so that a
machine whose speed drifts from minute to minute (a shared VM) slows every export alike: SavedModel
version dirs (`ids` and `serving_default` signatures) and ONNX/TFLite export dirs (through the package's
copy of their predict.py: `Predictor.run` for ids, `Predictor.predict` for text), at each of `--served_batches`
(default 1), text in (`--served_texts`: `--seq_length` - 2 words "house", or `news`, news-like sentences of about
16 words with names) and ids in (ONNX/TFLite: the model on the windows the text path builds of the same texts,
so text / ids is what the text path adds to the model; SavedModel: queries of `--seq_length` pieces, ids 5-34).
`--served_baseline=REV` also times the ONNX/TFLite text path of git revision REV's portable.py on the same
exports, interleaved (before/after a change in one run). Each of `--repeats` rounds (default 15) takes, per
export and batch size in turn, the median of 100 calls of each input; a row is the median over the rounds, in
ms per sentence, with their range. TensorFlow runs `--latency_threads`
intra-op threads and `--served_inter_op_threads` inter-op threads (default 1, as `--latency_peers`; TF
Serving's own default is one per core); ONNX Runtime and LiteRT run `--latency_threads` threads.
"""
from __future__ import annotations

import importlib.util
import itertools
import random
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, List, Sequence

import numpy as np
import tensorflow as tf
from absl import flags

from xtremedistil_tf.benchmarks import latency
from xtremedistil_tf.benchmarks.peers import set_tensorflow_threads
from xtremedistil_tf.benchmarks.timing import median_ms
from xtremedistil_tf.export import portable
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.export.serving import NerServing, valid_utf8
from xtremedistil_tf.students.artifact import StudentMeta, served_model
from xtremedistil_tf.students.models import build_bilstm_student

FLAGS = latency.FLAGS
DEFAULT_VOCAB = 30522   # a BERT-base-sized vocabulary when --student_vocab_size is 0


def _median(fn: Callable, inputs: Sequence[tuple], repeats: int) -> float:
    """Median ms of fn(*args) over `repeats` passes over `inputs`, after one untimed pass (tracing)."""
    for args in inputs:
        fn(*args)
    cycle = itertools.cycle(inputs)
    return median_ms(lambda: fn(*next(cycle)), repeats * len(inputs), warmup=0)


def stage_ms(module: NerServing, texts: Sequence[str], repeats: int) -> dict:
    """{stage: median ms per call at batch 1} of `module.serve`'s stages (module docstring), each on the
    outputs of the stage before, with "serve" (the method itself, in process) and "call" (an empty tf.function)."""
    function = lambda f: tf.function(f, reduce_retracing=True)
    stages = {"tokens": function(module._tokens), "windows": function(module._windows),
              "student": function(module._student_outputs), "word tags": function(module._word_tags),
              "entities": function(module._entities)}
    parts = {"valid_utf8": function(valid_utf8), "words": function(module.tokenizer.words),
             "pieces": function(module.tokenizer.pieces), "call": function(tf.identity)}
    inputs = {name: [] for name in list(stages) + list(parts)}
    for text in texts:
        batch = tf.constant([text])
        inputs["call"].append((batch,))
        inputs["valid_utf8"].append((batch,))
        inputs["tokens"].append((batch,))
        valid, pieces, start, end, _ = stages["tokens"](batch)
        inputs["words"].append((valid,))
        inputs["pieces"].append((parts["words"](valid)[0].flat_values,))
        inputs["windows"].append((pieces,))
        windows = stages["windows"](pieces)
        inputs["student"].append(windows[:2])
        inputs["word tags"].append((stages["student"](*windows[:2]), windows, start))
        tags, probs = stages["word tags"](*inputs["word tags"][-1])
        inputs["entities"].append((valid, start, end, tags, probs))
    result = {name: _median(fn, inputs[name], repeats) for name, fn in {**stages, **parts}.items()}
    result["serve"] = _median(module.serve, inputs["call"], repeats)
    return result


def measure(embedding_dim: int, hidden: int, vocab_size: int, queries: int, seq_length: int, repeats: int) -> dict:
    vocab, texts = latency.word_texts(vocab_size, queries, seq_length)
    student = build_bilstm_student(len(vocab), len(TagVocab(latency.LABELS)), embedding_dim, hidden)
    module = NerServing(student, StudentMeta(labels=latency.LABELS), vocab)
    result = {"student": f"{embedding_dim}x{hidden}", "vocab_size": len(vocab), "seq_length": seq_length,
              "queries": queries, "repeats": repeats, "machine": latency.machine(),
              "ms": stage_ms(module, list(texts), repeats)}
    with tempfile.TemporaryDirectory() as tmp:
        tf.saved_model.save(module, tmp, signatures={"serving_default": module.serve.get_concrete_function()})
        signature = tf.saved_model.load(tmp).signatures["serving_default"]
        result["ms"]["serving_default"] = _median(lambda t: signature(text=t), [(tf.constant([t]),) for t in texts],
                                                  repeats)
    ids = latency.make_queries(len(vocab), queries, seq_length)
    graph = latency.probs_fn(served_model(student, StudentMeta(latency.LABELS)), True, seq_length)
    mask = tf.ones([1, seq_length], tf.int32)
    result["ms"]["student graph"] = _median(lambda i: graph(i, mask), [(tf.constant(i[None]),) for i in ids], repeats)
    return result


STAGES = ("tokens", "windows", "student", "word tags", "entities")
PARTS = ("valid_utf8", "words", "pieces")


def format_lines(result: dict) -> List[str]:
    ms = result["ms"]
    total = sum(ms[s] for s in STAGES)
    lines = [f"served text path at batch 1: {result['student']} BiLSTM student, {result['vocab_size']} pieces, texts of "
             f"{result['seq_length'] - 2} one-piece words, median ms per call over {result['queries']} texts x "
             f"{result['repeats']} passes; {result['machine']}",
             "| stage | ms | share of the stages |", "|---|---|---|"]
    for stage in STAGES:
        lines.append(f"| {stage} | {ms[stage]:.3f} | {ms[stage] / total:.0%} |")
        if stage == "tokens":
            lines += [f"| - {part} | {ms[part]:.3f} | {ms[part] / total:.0%} |" for part in PARTS]
    lines += [f"| sum of the stages | {total:.3f} | 100% |",
              f"| empty tf.function call (in each stage's time) | {ms['call']:.3f} | |",
              f"| serve (the method, in process) | {ms['serve']:.3f} | |",
              f"| serving_default (reloaded SavedModel) | {ms['serving_default']:.3f} | |",
              f"| student graph on ids (keras+xla) | {ms['student graph']:.3f} | |",
              f"serving_default / student graph: {ms['serving_default'] / ms['student graph']:.2f}x"]
    return lines


def define_flags() -> None:
    if "served_exports" not in FLAGS:
        flags.DEFINE_list("served_exports", [], "served_text: time these exports side by side instead (SavedModel "
                          "version dirs, ONNX/TFLite export dirs), interleaved in one process.")
        flags.DEFINE_integer("served_inter_op_threads", 1, "served_text --served_exports: TensorFlow's inter-op threads.")
        flags.DEFINE_list("served_batches", ["1"], "served_text --served_exports: the batch sizes (texts per call).")
        flags.DEFINE_enum("served_texts", "words", ["words", "news"], "served_text --served_exports: the text input: "
                          "`words` (--seq_length - 2 words \"house\") or `news` (news-like sentences of about 16 words "
                          "with names, organisations and places: `news_texts`).")
        flags.DEFINE_string("served_baseline", "", "served_text --served_exports: also time the ONNX/TFLite text path "
                            "of this git revision's export/portable.py (e.g. HEAD~1) on the same exports, interleaved.")


# News-like sentences for --served_texts=news: about 16 words (13 to 19), capitalised names, numbers, punctuation.
_FIRST = ("John", "Maria", "Ahmed", "Li", "Olga", "Pierre", "Kwame", "Sofia", "Hiroshi", "Anna", "David", "Fatima")
_LAST = ("Smith", "Garcia", "Khan", "Wei", "Petrova", "Dubois", "Mensah", "Rossi", "Tanaka", "Novak", "Miller", "Haddad")
_ORGS = ("Reuters", "the United Nations", "Siemens", "Manchester United", "the World Bank", "Toyota Motor Corp",
         "the European Commission", "Goldman Sachs", "NATO", "the Red Cross")
_PLACES = ("Paris", "New York", "Nairobi", "Berlin", "South Korea", "Brazil", "Sydney", "the Middle East", "Moscow",
           "Texas")
_TEMPLATES = ("{p} told {o} on Tuesday that talks in {l} would resume next week .",
              "Shares of {o} fell 3.2 percent in {l} after {p} resigned as chairman .",
              "{p} , a spokesman for {o} , said the deal was signed in {l} .",
              "Police in {l} arrested two men on Friday , officials at {o} said .",
              "The striker {p} scored twice as {o} beat their rivals 2-1 in {l} .",
              "{o} expects growth of about 1.5 percent in {l} this year , {p} said .",
              "Heavy rain forced thousands to leave their homes near {l} , {o} reported .",
              "{p} will meet leaders from {l} and {o} at the summit in {m} .")


def news_texts(count: int, seed: int = 0) -> List[str]:
    rng = random.Random(seed)
    return [rng.choice(_TEMPLATES).format(p=f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", o=rng.choice(_ORGS),
                                          l=rng.choice(_PLACES), m=rng.choice(_PLACES)) for _ in range(count)]


def text_batches(kind: str, batch: int, seq_length: int, count: int = 256) -> List[List[str]]:
    """The text inputs of one batch size: `count` texts (at least one batch) cut into batches of `batch`."""
    if kind == "words":
        return [[" ".join(["house"] * (seq_length - 2))] * batch]
    texts = news_texts(max(count, batch))
    return [texts[i:i + batch] for i in range(0, len(texts) - batch + 1, batch)]


def baseline_portable(revision: str):
    """The module export/portable.py of git `revision`, loaded from a temporary copy with the files an export ships
    beside it (shapes.py, textfile.py: the package's own), as a client's predict.py."""
    root = Path(portable.__file__).resolve().parents[2]
    found = subprocess.run(["git", "-C", str(root), "show", f"{revision}:xtremedistil_tf/export/portable.py"],
                           capture_output=True, text=True)
    if found.returncode:
        raise ValueError(f"--served_baseline={revision}: {found.stderr.strip().splitlines()[0]}")
    folder = Path(tempfile.mkdtemp(prefix="served_baseline_"))
    (folder / "portable.py").write_text(found.stdout, encoding="utf-8")
    for name in ("data/shapes.py", "textfile.py"):
        shutil.copyfile(root / "xtremedistil_tf" / name, folder / Path(name).name)
    spec = importlib.util.spec_from_file_location("_served_baseline_portable", folder / "portable.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _export_calls(path: Path, seq_length: int, threads: int, batches: Sequence[List[str]], baseline=None) -> dict:
    """{"ids": call, "text": call[, "baseline": call]} of the export at `path` (a SavedModel, or a dir with predict.py)
    on `batches` of texts, one batch per call in turn. ids: for an ONNX/TFLite export, the model on the very windows
    its text path builds of the same texts (`Predictor.windows`); for a SavedModel, queries of `seq_length` pieces."""
    if (path / "saved_model.pb").is_file():
        signatures = tf.saved_model.load(str(path)).signatures
        ids_fn, text_fn = signatures["ids"], signatures["serving_default"]
        ids = np.tile((np.arange(seq_length, dtype=np.int32) % 30 + 5)[None], (len(batches[0]), 1))
        ids_t, mask_t = tf.constant(ids), tf.ones(ids.shape, tf.int32)
        texts = itertools.cycle([tf.constant(b) for b in batches])
        return {"ids": lambda: ids_fn(input_ids=ids_t, attention_mask=mask_t),
                "text": lambda: text_fn(text=next(texts))}
    if (path / "export.json").is_file():
        predictor = portable.Predictor(path, threads=threads)
        windows = itertools.cycle([(i, m, c) for i, m, _, c in map(predictor.windows, batches)])
        texts = itertools.cycle(batches)
        calls = {"ids": lambda: predictor.run(*next(windows)),
                 "text": lambda: predictor.predict(next(texts), batch_size=len(batches[0]))}
        if baseline is not None:
            old, old_texts = baseline.Predictor(path, threads=threads), itertools.cycle(batches)
            calls["baseline"] = lambda: old.predict(next(old_texts), batch_size=len(batches[0]))
        return calls
    raise ValueError(f"--served_exports: {path} is neither a SavedModel (saved_model.pb) nor an ONNX/TFLite export "
                     "(export.json)")


def compare_exports(paths: Sequence[str], rounds: int, seq_length: int, threads: int, inter_op: int,
                    calls: int = 100, batch_sizes: Sequence[int] = (1,), texts: str = "words",
                    baseline: str = "") -> dict:
    """{"ms": {path: {batch: {"ids": [per round], "text": [per round][, "baseline": [per round]]}}}, ...}: ms per
    sentence (per call / batch); each round times every export and batch size in turn (the median of `calls` calls
    of each input). `baseline`: a git revision whose portable.py also runs the ONNX/TFLite text path."""
    paths = [Path(p) for p in paths]
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        raise ValueError(f"--served_exports: no such directory: {', '.join(missing)}")
    old = baseline_portable(baseline) if baseline else None
    threads = set_tensorflow_threads(threads, inter_op)
    exports = {(str(p), b): _export_calls(p, seq_length, threads, text_batches(texts, b, seq_length), old)
               for p in paths for b in batch_sizes}
    for row in exports.values():   # trace and warm up
        for _ in range(10):
            for call in row.values():
                call()
    ms = {str(p): {b: {name: [] for name in exports[str(p), b]} for b in batch_sizes} for p in paths}
    for _ in range(rounds):
        for (p, b), row in exports.items():
            for name, call in row.items():
                ms[p][b][name].append(median_ms(call, calls, warmup=0) / b)
    words = float(np.mean([len(t.split()) for batch in text_batches(texts, 1, seq_length) for t in batch]))
    return {"ms": ms, "rounds": rounds, "calls": calls, "seq_length": seq_length, "threads": threads,
            "inter_op": inter_op, "texts": texts, "words": words, "baseline": baseline, "machine": latency.machine()}


def format_exports(result: dict) -> List[str]:
    medians = {p: {b: {k: float(np.median(v)) for k, v in row.items()} for b, row in by_batch.items()}
               for p, by_batch in result["ms"].items()}
    fastest = {b: min(m[b]["text"] for m in medians.values()) for b in next(iter(medians.values()))}
    text = (f"{result['seq_length'] - 2} words \"house\"" if result["texts"] == "words"
            else f"news-like sentences of {result['words']:.1f} words")
    old = result["baseline"]
    lines = [f"served exports, interleaved: {result['rounds']} rounds x {result['calls']} calls of each input per "
             f"export and batch size; ms per sentence (per call / batch); text: {text}; ids: the model on the text "
             f"path's own windows (ONNX/TFLite), {result['seq_length']} pieces (SavedModel)"
             + (f"; baseline: the text path of {old}'s portable.py" if old else "")
             + f"; TensorFlow intra-op {result['threads']}, inter-op {result['inter_op']}; ONNX Runtime / LiteRT "
             f"{result['threads']} threads; {result['machine']}",
             "| export | batch | ids ms | text ms | text / ids | text / fastest text | rounds' text ms |"
             + (" baseline text ms | baseline / ids |" if old else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|" if old else "")]
    for p, by_batch in medians.items():
        for b, m in by_batch.items():
            texts = result["ms"][p][b]["text"]
            line = (f"| {p} | {b} | {m['ids']:.3f} | {m['text']:.3f} | {m['text'] / m['ids']:.2f} | "
                    f"{m['text'] / fastest[b]:.2f} | {min(texts):.3f}-{max(texts):.3f} |")
            if old:
                line += (f" {m['baseline']:.3f} | {m['baseline'] / m['ids']:.2f} |" if "baseline" in m else " | |")
            lines.append(line)
    return lines


def run(repeats: int) -> List[str]:
    latency.define_flags()
    define_flags()
    if FLAGS.served_exports:
        return format_exports(compare_exports(FLAGS.served_exports, repeats if FLAGS["repeats"].present else 15,
                                              FLAGS.seq_length, FLAGS.latency_threads, FLAGS.served_inter_op_threads,
                                              batch_sizes=[int(b) for b in FLAGS.served_batches],
                                              texts=FLAGS.served_texts, baseline=FLAGS.served_baseline))
    passes = repeats if FLAGS["repeats"].present else 3
    (embedding_dim, hidden), = latency.parse_students(FLAGS.students)[:1]
    return format_lines(measure(embedding_dim, hidden, FLAGS.student_vocab_size or DEFAULT_VOCAB,
                                FLAGS.queries if FLAGS["queries"].present else 200, FLAGS.seq_length, passes))
