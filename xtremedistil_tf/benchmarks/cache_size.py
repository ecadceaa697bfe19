"""bin/benchmark cache: disk bytes per 1,000 windows of the teacher-output cache in each layout (issue 30).

    bin/benchmark cache --work_dir=runs/wikiann --max_seq_length=128 --teacher_layer=4 [--cache_windows=1000]
                        [--cache_logits_topk=3]

Reads a work dir's fine-tuned teacher (teacher/model) and train sentences (data/train.jsonl), encodes the first
--cache_windows windows at --max_seq_length, runs the teacher over them once, and writes the same outputs
(`transfer/outputs.compute_window_outputs`) as a cache in each layout, under a temporary dir removed after:

* padded float16: every window padded to --max_seq_length, hidden float16 (the records of format v1, before
  issue 30; byte for byte the same Examples);
* ragged float16, ragged int8 (one float32 scale per position), ragged int8 + top-k logits;
* ragged int8 without hidden states (what a student that reads none, D0/D1 or multi-grained, caches).

Prints MB (10^6 bytes) per 1,000 windows, the factor against padded float16, and int8's largest error
relative to each position's largest |value| (bounded by 1/254).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Dict, List

import numpy as np
from absl import flags

from xtremedistil_tf.data.alignment import encode
from xtremedistil_tf.data.loading import read_jsonl
from xtremedistil_tf.teachers.saved import load_teacher
from xtremedistil_tf.transfer.cache import disk_bytes_per_1000, read_arrays, write_sharded
from xtremedistil_tf.transfer.outputs import compute_window_outputs, teacher_outputs_fn, window_layout

FLAGS = flags.FLAGS


def define_flags() -> None:
    if "cache_windows" not in FLAGS:
        flags.DEFINE_integer("cache_windows", 1000, "cache: windows of the work dir's train sentences to cache.")


# name, ragged, hidden_dtype, top-k logits (None: --cache_logits_topk), hidden stored
LAYOUTS = (("padded float16 (today)", False, "float16", 0, True),
           ("ragged float16", True, "float16", 0, True),
           ("ragged int8", True, "int8", 0, True),
           ("ragged int8 + top-k logits", True, "int8", None, True),
           ("ragged int8, no hidden states", True, "int8", 0, False))


def teacher_outputs(work_dir, windows_wanted: int, max_seq_length: int, layer: int):
    """(windows, {key: [N, T, ...] array}) of the first `windows_wanted` windows of the train sentences."""
    teacher, tokenizer = load_teacher(Path(work_dir) / "teacher" / "model")
    teacher.check_layer(layer)
    sentences = read_jsonl(Path(work_dir) / "data" / "train.jsonl")[:windows_wanted]
    windows = encode(sentences, tokenizer, teacher.tag_vocab, max_seq_length)
    n = min(windows_wanted, len(windows))   # a sentence gives one window or more
    run = teacher_outputs_fn(teacher, layer)
    parts = [compute_window_outputs(run, windows, np.arange(s, min(s + 64, n))) for s in range(0, n, 64)]
    return windows, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def measure(work_dir, windows_wanted: int, max_seq_length: int, layer: int, topk: int) -> List[Dict]:
    """One row per layout: MB per 1,000 windows and the factor against the padded float16 layout."""
    windows, arrays = teacher_outputs(work_dir, windows_wanted, max_seq_length, layer)
    n, rows, root = len(arrays["input_ids"]), [], Path(tempfile.mkdtemp(prefix="cache_size_"))
    try:
        for name, ragged, hidden_dtype, k, hidden in LAYOUTS:
            k = topk if k is None else k
            keys = [key for key in arrays if hidden or key != "hidden"]
            layout = window_layout(windows, keys, hidden_dtype, k)
            if not ragged:
                layout = {"dtypes": layout["dtypes"], "encodings": layout["encodings"]}
            out = root / name.replace(" ", "_")
            write_sharded(out, n, lambda rows, keys=keys: {key: arrays[key][rows] for key in keys},
                          fingerprint={"layout": name}, progress=False, **layout)
            row = {"layout": name if k or "top-k" not in name else f"{name} (k=0)", "topk": k,
                   "mb_per_1000": disk_bytes_per_1000(out) / 1e6}
            if hidden_dtype == "int8" and hidden:
                read = read_arrays(out, length=max_seq_length, keys=["hidden"])["hidden"]
                real = arrays["attention_mask"] > 0
                scale = np.abs(arrays["hidden"]).max(-1)[real]
                row["int8_error"] = float((np.abs(read - arrays["hidden"]).max(-1)[real] / scale).max())
            rows.append(row)
            shutil.rmtree(out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    today = rows[0]["mb_per_1000"]
    lengths = arrays["attention_mask"].sum(1)
    for row in rows:
        row.update(factor=today / row["mb_per_1000"], windows=n, mean_length=float(lengths.mean()),
                   max_seq_length=max_seq_length, hidden_size=int(arrays["hidden"].shape[-1]),
                   tags=int(arrays["logits"].shape[-1]))
    return rows


def run(repeats: int) -> List[str]:
    if not FLAGS.work_dir:
        raise SystemExit("bin/benchmark cache needs --work_dir (a work dir with teacher/ and data/)")
    rows = measure(FLAGS.work_dir, FLAGS.cache_windows, FLAGS.max_seq_length, FLAGS.teacher_layer,
                   FLAGS.cache_logits_topk or 3)
    first = rows[0]
    lines = [f"{first['windows']} windows of {Path(FLAGS.work_dir).name}'s train sentences, --max_seq_length="
             f"{first['max_seq_length']} (mean real length {first['mean_length']:.1f} pieces), hidden size "
             f"{first['hidden_size']}, {first['tags']} tags, teacher layer {FLAGS.teacher_layer}",
             "| layout | MB per 1,000 windows | smaller than today | int8 max error / row max |",
             "|---|---:|---:|---:|"]
    for row in rows:
        name = row["layout"] + (f" (k={row['topk']})" if row["topk"] else "")
        error = f"{row['int8_error']:.5f}" if "int8_error" in row else ""
        lines.append(f"| {name} | {row['mb_per_1000']:.2f} | {row['factor']:.1f}x | {error} |")
    return lines
