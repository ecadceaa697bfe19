"""`bin/benchmark formats --work_dir=W`: a work dir's student in every export format and
quantization, side by side (issue 19).

The student (<work_dir>/student or --formats_student) is exported once per variant (bin/export's code: SavedModel,
ONNX, TFLite; none / dynamic_int8 / float16 / bfloat16 where the format supports it) into
--formats_dir (default: a temporary dir, removed after). Each variant is then served by a fresh
Python process that imports only its runtime (TensorFlow + tensorflow-text for the SavedModel's
`serving_default`; numpy + tokenizers + onnxruntime or ai-edge-litert through the shipped
predict.py), so its peak RSS (VmHWM; ru_maxrss would include the benchmark's own, inherited
through fork) is that runtime's alone. In it, from raw text to entities:
- F1: exact entity character spans on <work_dir>/data/test.jsonl (tokens joined by spaces, as
  bin/evaluate scores an export), batches of 64;
- latency: the first --formats_queries test texts, median milliseconds per call at batch 1 (one
  text a call) and per call of 32 texts (the same texts), after one warm-up pass; --repeats passes.
Size is the model file (ONNX, TFLite) or the SavedModel directory without assets.extra; parameters
are the served graph's (the same for every variant). A variant the machine or format cannot run
(bfloat16 without AVX512-BF16/AMX: export.bfloat16) gets a row saying why.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from absl import flags

from xtremedistil_tf.data.loading import read_jsonl
from xtremedistil_tf.data.scoring import char_spans, span_scores
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export.formats import export
from xtremedistil_tf.io import dir_size
from xtremedistil_tf.students.artifact import read_config

VARIANTS = (("saved_model", "none"), ("saved_model", "bfloat16"), ("onnx", "none"), ("onnx", "dynamic_int8"),
            ("tflite", "none"), ("tflite", "dynamic_int8"), ("tflite", "float16"))
BATCH = 32
SCORE_BATCH = 64


def define_flags() -> None:
    """This benchmark's flags; call before flags are parsed (bin/benchmark does). Idempotent."""
    if "formats_queries" not in flags.FLAGS:
        flags.DEFINE_integer("formats_queries", 256, "formats: test texts timed at batch 1 and 32.")
    for name, default, help_text in [
        ("formats_variants", ",".join(f"{f}:{q}" for f, q in VARIANTS),
         "formats: format:quantize pairs to measure, comma-separated."),
        ("formats_dir", "", "formats: where to write the exports (default: a temporary dir, removed after)."),
        ("formats_student", "", "formats: the saved student to export (default: <work_dir>/student), e.g. one of "
                                "bin/ablate's <work_dir>/ablate/<strategy>."),
        ("formats_lengths", "", "formats: TFLite window lengths, comma-separated (default: the student's "
                                "max_seq_length; bin/export --xla_lengths)."),
    ]:
        if name not in flags.FLAGS:
            flags.DEFINE_string(name, default, help_text)
    if "work_dir" not in flags.FLAGS:
        flags.DEFINE_string("work_dir", "", "formats: the work dir whose student/ and data/test.jsonl are measured.")


CHILD = r"""
import json, statistics, sys, time


def peak_rss_mib():
    # VmHWM: this process image's peak RSS. Not ru_maxrss, which after fork + exec keeps the parent's peak.
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


fmt, directory, texts_path, queries, repeats = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
texts = json.load(open(texts_path, encoding="utf-8"))
if fmt == "saved_model":
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops)
    serve = tf.saved_model.load(directory).signatures["serving_default"]

    def predict(batch):
        out = {k: v.numpy() for k, v in serve(text=tf.constant(batch)).items()}
        return [[(int(out["entity_start"][i, j]), int(out["entity_end"][i, j]), out["entity_type"][i, j].decode())
                 for j in range(int(out["num_entities"][i]))] for i in range(len(batch))]
else:
    sys.path.insert(0, directory)
    import predict as shipped
    predictor = shipped.load(directory)

    def predict(batch):
        return [[(e["start"], e["end"], e["type"]) for e in r["entities"]] for r in predictor.predict(batch, len(batch))]

entities = []
for start in range(0, len(texts), %(score_batch)d):
    entities.extend(predict(texts[start:start + %(score_batch)d]))
timed = texts[:queries]

def median_ms(batches):
    for batch in batches:  # warm-up: tracing, allocation, first-shape work
        predict(batch)
    times = []
    for _ in range(repeats):
        for batch in batches:
            start = time.perf_counter()
            predict(batch)
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)

result = {"entities": entities, "b1_ms": median_ms([[t] for t in timed]),
          "b%(batch)d_ms": median_ms([timed[i:i + %(batch)d] for i in range(0, len(timed), %(batch)d)]),
          "peak_rss_mib": peak_rss_mib()}
print(json.dumps(result))
""" % {"score_batch": SCORE_BATCH, "batch": BATCH}


def parse_variants(spec: str) -> List[Tuple[str, str]]:
    variants = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        fmt, _, quantize = item.partition(":")
        variants.append((fmt, quantize or "none"))
    return variants


def export_variant(student_dir, out_dir, fmt: str, quantize: str, lengths: Sequence[int]):
    """Exported(directory, model_file, module) of one variant, written by bin/export's function."""
    saved_model = fmt == "saved_model"
    return export(student_dir, out_dir, fmt, quantize, "ner" if quantize == "none" or not saved_model else
                  f"ner-{quantize}", version=int(saved_model), overwrite=True, lengths=lengths if fmt == "tflite" else ())


def serve_in_fresh_process(fmt: str, directory, texts_path, queries: int, repeats: int) -> Dict:
    """Run CHILD for one export in a new Python process; its JSON result."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", CHILD, fmt, str(directory), str(texts_path), str(queries),
                           str(repeats)], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"serving {directory} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def benchmark(work_dir, variants: Sequence[Tuple[str, str]] = VARIANTS, queries: int = 256, repeats: int = 1,
              out_dir: Optional[str] = None, lengths: Sequence[int] = (),
              student_dir: Optional[str] = None) -> Tuple[List[str], List[Dict]]:
    """(printable lines, one dict per variant: format, quantize, size_bytes, parameters, f1, b1_ms,
    b32_ms, peak_rss_mib, or `refused` with the reason)."""
    work_dir = Path(work_dir)
    student_dir, test_path = Path(student_dir or work_dir / "student"), work_dir / "data" / "test.jsonl"
    for path in (student_dir / "student.json", test_path):
        if not path.exists():
            raise ConfigError(f"--work_dir={work_dir}: {path} not found (bin/benchmark formats measures a trained "
                              "work dir's student on its test split)")
    scheme = read_config(student_dir).scheme
    sentences = [s for s in read_jsonl(test_path) if s.tags is not None]
    gold = [char_spans(s, s.tags, scheme) for s in sentences]
    root = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="xd_formats_"))
    texts_path = root / "texts.json"
    root.mkdir(parents=True, exist_ok=True)
    texts_path.write_text(json.dumps([s.raw_text for s in sentences], ensure_ascii=False), encoding="utf-8")
    rows = []
    try:
        for fmt, quantize in variants:
            try:
                exported = export_variant(student_dir, root, fmt, quantize, lengths)
            except ConfigError as e:
                rows.append({"format": fmt, "quantize": quantize, "refused": str(e)})
                continue
            served = serve_in_fresh_process(fmt, exported.directory, texts_path, queries, repeats)
            pred = [{tuple(e) for e in found} for found in served.pop("entities")]
            # The model file, or the SavedModel without assets.extra (the clients' copies).
            model = Path(exported.model_file)
            size = model.stat().st_size if model.is_file() else dir_size(model, skip=("assets.extra",))
            rows.append({"format": fmt, "quantize": quantize, "size_bytes": size,
                         "parameters": exported.module.served_parameters(),
                         "f1": span_scores(gold, pred)["f1"], **served})
    finally:
        if not out_dir:
            shutil.rmtree(root, ignore_errors=True)
    lines = [f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, TF {tf.__version__}; "
             f"{student_dir} on {test_path}: {len(sentences):,} sentences (F1: exact entity character spans), latency over the "
             f"first {min(queries, len(sentences))} (median ms per call, text in, entities out), each variant served "
             f"by its own process",
             f"{'format':<12}{'quantize':<14}{'size MiB':>9}{'vs first':>9}{'parameters':>12}{'F1':>8}"
             f"{'b1 ms':>8}{f'b{BATCH} ms':>9}{'peak RSS MiB':>13}"]
    base = next((r["size_bytes"] for r in rows if "size_bytes" in r), None)
    for r in rows:
        if "refused" in r:
            lines.append(f"{r['format']:<12}{r['quantize']:<14}refused: {r['refused']}")
            continue
        lines.append(f"{r['format']:<12}{r['quantize']:<14}{r['size_bytes'] / 2**20:>9.2f}"
                     f"{r['size_bytes'] / base:>8.2f}x{r['parameters']:>12,}{100 * r['f1']:>8.2f}"
                     f"{r['b1_ms']:>8.2f}{r[f'b{BATCH}_ms']:>9.2f}{r['peak_rss_mib']:>13.0f}")
    return lines, rows


def run(repeats: int) -> List[str]:
    FLAGS = flags.FLAGS
    if not FLAGS.work_dir:
        raise ValueError("bin/benchmark formats needs --work_dir (a trained work dir: student/, data/test.jsonl)")
    try:
        lengths = [int(n) for n in FLAGS.formats_lengths.split(",") if n.strip()]
    except ValueError:
        raise ValueError(f"--formats_lengths={FLAGS.formats_lengths}: expected integers") from None
    return benchmark(FLAGS.work_dir, parse_variants(FLAGS.formats_variants), FLAGS.formats_queries, repeats,
                     FLAGS.formats_dir or None, lengths, FLAGS.formats_student or None)[0]
