"""bin/benchmark teacher: the pipeline's teacher beside a plain reference loop, same data and budget.

    bin/benchmark teacher --data_format=wikiann --data_dir=../shared/data/wikiann --langs=en \\
        --teacher=minilm --max_seq_length=64 --teacher_epochs=1 --work_dir=runs/bench_teacher_en1

Takes bin/train's flags. The pipeline's teacher is `bin/train --nostudent` with those flags (the
recipe's defaults for whatever is not given; its work dir resumes like any run); the reference
(benchmarks/reference_teacher.py, which shares no code with the package) then fine-tunes the same
pretrained model on the pipeline's data snapshot with the same epochs, batch size, encoder rate,
max_seq_length and seed. Printed: dev and test F1 of both (argmax at each word's first piece: the
teacher step's `argmax_scores`) and their training times (evaluation excluded).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import List

from absl import flags

from xtremedistil_tf.benchmarks.reference_teacher import train_and_score
from xtremedistil_tf.data.loading import CLASSIFICATION_FORMATS
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_json
from xtremedistil_tf.run import pipeline

log = logging.getLogger(__name__)


def run(repeats: int, config_from_flags=None, log_to_work_dir=None) -> List[str]:
    """``config_from_flags`` and ``log_to_work_dir`` are bin/train's (cli/train.py), passed down by
    cli/benchmark.py: this benchmark takes bin/train's flags, and cli/ sits above benchmarks/."""
    del repeats  # one training run each; the F1s are the result

    FLAGS = flags.FLAGS
    if FLAGS.data_format in CLASSIFICATION_FORMATS:
        raise ConfigError(f"--data_format={FLAGS.data_format}: the teacher benchmark's reference loop tags tokens")
    if FLAGS.teacher == pipeline.RANDOM_ALIAS or FLAGS.teacher_random_init:
        raise ConfigError("the teacher benchmark compares fine-tuning of a pretrained model; --teacher=random "
                          "and --teacher_random_init have no weights for the reference loop to start from")
    if not FLAGS.work_dir:
        FLAGS.work_dir = "runs/benchmark_teacher"
    FLAGS.student = False
    if config_from_flags is None:
        raise ConfigError("bin/benchmark teacher reads bin/train's flags: run it through bin/benchmark")
    cfg = config_from_flags()
    log_to_work_dir(cfg.work_dir)
    start = time.time()
    metrics = pipeline.run(cfg)
    pipeline_wall = time.time() - start
    teacher = metrics["teacher"]
    # The reference loop scores argmax at each word's first piece, as the teacher step's argmax_scores do
    # (a CRF teacher has only its Viterbi's `scores`).
    scores = teacher.get("argmax_scores", teacher["scores"])
    ft = cfg.teacher.finetune
    log.info("reference loop on %s", Path(cfg.work_dir) / "data")
    reference = train_and_score(Path(cfg.work_dir) / "data", pipeline.resolve_teacher_path(cfg.teacher.name),
                                ft.epochs, ft.batch_size, ft.learning_rate, cfg.teacher.max_seq_length, ft.seed,
                                log=log.info)
    rows = {
        "pipeline": {"dev_f1": scores["dev"]["all"]["f1"],
                     "test_f1": scores.get("test", {}).get("all", {}).get("f1", float("nan")),
                     "train_seconds": teacher["train_seconds"], "best_epoch": teacher.get("best_epoch"),
                     "recipe": ft.to_dict()},
        "reference": {k: reference[k] for k in ("dev_f1", "test_f1", "train_seconds", "history")},
    }
    atomic_write_json(Path(cfg.work_dir) / "benchmark_teacher.json", rows)
    lines = [f"teacher benchmark: {cfg.teacher.name}, {ft.epochs} epoch(s), batch {ft.batch_size}, encoder rate "
             f"{ft.learning_rate:g}, {cfg.teacher.max_seq_length} pieces, seed {ft.seed}; data {cfg.work_dir}/data",
             f"pipeline recipe: head rate {ft.head_learning_rate:g}, head init {ft.head_init}, warm-up "
             f"{ft.warmup_fraction:g}, layer decay {ft.layer_decay:g}, supervision {ft.supervision}",
             f"{'':10s} {'dev F1':>8s} {'test F1':>8s} {'train s':>8s}"]
    for name, row in rows.items():
        lines.append(f"{name:10s} {100 * row['dev_f1']:8.2f} {100 * row['test_f1']:8.2f} {row['train_seconds']:8.0f}")
    lines.append(f"test F1 pipeline - reference: {100 * (rows['pipeline']['test_f1'] - rows['reference']['test_f1']):+.2f}"
                 f"  (pipeline step wall time {pipeline_wall:.0f} s, 0 when its work dir was already done)")
    return lines
