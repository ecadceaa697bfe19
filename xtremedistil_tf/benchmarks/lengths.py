"""bin/benchmark lengths: what batching windows by length saves the teacher's two steps, per teacher.

    bin/benchmark lengths --work_dir=runs/i39/mpnet_en --length_teachers=minilm,mpnet-base --max_seq_length=64 \\
        [--length_windows=512] [--length_sets=train,transfer] [--repeats=2]

Reads a work dir's data step (data/train.jsonl, data/transfer.jsonl, data/labels.json). For each teacher of
--length_teachers (a pretrained encoder with a fresh token head, as the teacher step starts), the first
--length_windows windows of each set of --length_sets at the data's own lengths, and times, interleaved
(in order, grouped, in order, ... --repeats times each; the median is printed):

* fine-tuning: one pass of the teacher step's train step (batch --teacher_batch_size, every batch trimmed to
  its longest window) over the windows shuffled as an epoch is (`teachers.finetune.windows_dataset`), its
  batches of randomly mixed lengths against batches grouped by length (--teacher_group_by_length, default
  10 batches at a time here);
* the cache: the teacher's outputs over the windows in batches of --transfer_batch_size
  (`transfer.outputs.compute_window_outputs`), in index order against sorted by length within each shard
  of --shard_size (`transfer.cache.shard_batches`, what write_teacher_outputs does).

Printed per teacher and set: windows per second of each, the seconds an epoch / a cache of the whole set takes
at that rate, the saving, and the pieces computed (padding included) against the real ones.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
from absl import flags

from xtremedistil_tf.data.alignment import encode
from xtremedistil_tf.data.loading import read_jsonl
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import read_json
from xtremedistil_tf.teachers.finetune import FinetuneConfig, make_train_step, parameter_groups, windows_dataset
from xtremedistil_tf.teachers.model import build_teacher
from xtremedistil_tf.teachers.pretrained import resolve_teacher_path
from xtremedistil_tf.transfer.cache import shard_batches
from xtremedistil_tf.transfer.outputs import compute_window_outputs, teacher_outputs_fn, window_lengths

FLAGS = flags.FLAGS
DEFAULT_GROUP = 10


def define_flags() -> None:
    if "length_teachers" not in FLAGS:
        flags.DEFINE_list("length_teachers", ["minilm", "mpnet-base"], "lengths: teachers to time (names or dirs).")
        flags.DEFINE_integer("length_windows", 512, "lengths: windows of each set to time.")
        flags.DEFINE_list("length_sets", ["train", "transfer"], "lengths: the data step's sets to time.")


def _interleaved(fns: Dict[str, callable], repeats: int) -> Dict[str, float]:
    """{name: median seconds of fns[name]()}, the names taking turns."""
    times: Dict[str, list] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(work_dir, teacher_name: str, sets: List[str], windows_wanted: int, max_seq_length: int,
            batch_size: int, cache_batch: int, shard_size: int, group: int, repeats: int, layer: int) -> List[dict]:
    labels = read_json(Path(work_dir) / "data" / "labels.json")
    teacher, tokenizer = build_teacher(resolve_teacher_path(teacher_name), labels, max_seq_length, dropout=0.1)
    teacher.check_layer(layer)
    rows = []
    for name in sets:
        path = Path(work_dir) / "data" / f"{name}.jsonl"
        sentences = read_jsonl(path)
        if not sentences:
            raise ConfigError(f"{path} holds no sentences; --length_sets names the data step's sets with some")
        # The windows of the first `windows_wanted` sentences (a long sentence gives several).
        windows = encode(sentences[:windows_wanted], tokenizer, teacher.tag_vocab, max_seq_length)
        all_windows = len(encode(sentences, tokenizer, teacher.tag_vocab, max_seq_length)) \
            if len(sentences) > windows_wanted else len(windows)
        n, lengths = len(windows), window_lengths(windows)
        step = make_train_step(teacher, parameter_groups(teacher, FinetuneConfig(batch_size=batch_size), 10_000))
        datasets = {mode: list(windows_dataset(windows, batch_size, shuffle=True, seed=1, reshuffle=False,
                                               group=group if mode == "grouped" else 0))
                    for mode in ("in order", "grouped")}
        run = teacher_outputs_fn(teacher, layer)
        shards = [(s, min(s + shard_size, n)) for s in range(0, n, shard_size)]
        cache_batches = {"in order": [r for s, e in shards for r in shard_batches(s, e, cache_batch)],
                         "grouped": [r for s, e in shards for r in shard_batches(s, e, cache_batch, lengths)]}

        def train_pass(batches):
            def go():
                for batch in batches:
                    step(batch).numpy()
            return go

        def cache_pass(batches):
            def go():
                for r in batches:
                    compute_window_outputs(run, windows, r)
            return go

        train_pass(datasets["in order"][:2])()                     # trace before the clock starts
        cache_pass(cache_batches["in order"][:1])()
        train = _interleaved({m: train_pass(b) for m, b in datasets.items()}, repeats)
        cache = _interleaved({m: cache_pass(b) for m, b in cache_batches.items()}, repeats)
        for step_name, seconds, pieces in (
                ("fine-tuning", train, {m: sum(int(np.prod(b["input_ids"].shape)) for b in d)
                                        for m, d in datasets.items()}),
                ("cache", cache, {m: sum(len(r) * int(lengths[r].max()) for r in b)
                                  for m, b in cache_batches.items()})):
            rows.append({"teacher": teacher_name, "set": name, "step": step_name, "windows": n,
                         "set_windows": all_windows, "mean_length": float(lengths.mean()),
                         "real_pieces": int(lengths.sum()), **{f"{m}_s": seconds[m] for m in seconds},
                         **{f"{m}_pieces": pieces[m] for m in pieces}})
    return rows


def lines(rows: List[dict]) -> List[str]:
    out = ["| teacher | set (windows, mean pieces) | step | in order: windows/s | grouped: windows/s | saving | "
           "whole set, in order | whole set, grouped | pieces computed / real, in order | grouped |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rate = {m: r["windows"] / r[f"{m}_s"] for m in ("in order", "grouped")}
        whole = {m: r["set_windows"] / rate[m] for m in rate}
        out.append(f"| {r['teacher']} | {r['set']} ({r['set_windows']:,}, {r['mean_length']:.1f}) | {r['step']} | "
                   f"{rate['in order']:.1f} | {rate['grouped']:.1f} | {1 - r['grouped_s'] / r['in order_s']:.0%} | "
                   f"{whole['in order']:.0f} s | {whole['grouped']:.0f} s | "
                   f"{r['in order_pieces'] / r['real_pieces']:.2f} | {r['grouped_pieces'] / r['real_pieces']:.2f} |")
    return out


def run(repeats: int) -> List[str]:
    if not FLAGS.work_dir:
        raise ConfigError("bin/benchmark lengths needs --work_dir (a work dir whose data step is done)")
    group = FLAGS.teacher_group_by_length or DEFAULT_GROUP
    rows = []
    for teacher in FLAGS.length_teachers:
        rows += measure(FLAGS.work_dir, teacher, FLAGS.length_sets, FLAGS.length_windows, FLAGS.max_seq_length,
                        FLAGS.teacher_batch_size, FLAGS.transfer_batch_size, FLAGS.shard_size, group,
                        repeats, FLAGS.teacher_layer)
        for line in lines(rows[-2 * len(FLAGS.length_sets):]):
            print(line, flush=True)
    return [f"bin/benchmark lengths: batch {FLAGS.teacher_batch_size} (fine-tuning), {FLAGS.transfer_batch_size} "
            f"(cache, shards of {FLAGS.shard_size}), groups of {group} batches, median of {repeats}", *lines(rows)]
