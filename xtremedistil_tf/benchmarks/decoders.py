"""bin/benchmark decoders --work_dir=<a bin/ablate work dir>: its teacher and every finished softmax
student of `ablate/` scored on the run's test split (dev without one) with both word decoders of
crf/decoding.py, constrained (the default everywhere) and argmax, so F1s recorded before constrained
decoding existed (argmax) stand beside today's, and a student is compared with a teacher decoded the
same way. F1 is the ablation's: the mean across languages, or pooled without languages. D0's
per-language students and CRF students (their own Viterbi only) are listed as skipped.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from absl import flags

from xtremedistil_tf.crf.decoding import DECODES
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import markdown_table, read_json
from xtremedistil_tf.methods.student_run import evaluate_student, load_student
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.ablate import ABLATE_DIR, _pct, _split, _summary_f1
from xtremedistil_tf.run.workdir import WorkDir
from xtremedistil_tf.teachers.finetune import evaluate_teacher_by_decode
from xtremedistil_tf.teachers.saved import load_teacher

FLAGS = flags.FLAGS


def run(repeats: int) -> List[str]:
    """The table; `repeats` is unused (scores are not timed)."""
    root = Path(FLAGS.work_dir or ".")
    if not FLAGS.work_dir or not (root / "teacher" / "step.json").exists() or not (root / ABLATE_DIR).is_dir():
        raise ConfigError(f"--work_dir={FLAGS.work_dir!r}: expected a bin/ablate work dir (a finished teacher/ "
                          f"step and an {ABLATE_DIR}/ dir)")
    work = WorkDir(root)
    splits = {k: v for k, v in pipeline.load_data(work).items() if k in ("dev", "test") and v}
    split = _split(splits)
    sentences, scheme = splits[split], work.stored("data")["fingerprint"]["data"]["scheme"]
    rows, skipped = [], []
    teacher, tokenizer = load_teacher(work.path("teacher") / "model")
    # Both decoders from one forward pass; a CRF teacher decodes with its Viterbi only (the constrained
    # column), it has no argmax.
    teacher_scores = evaluate_teacher_by_decode(teacher, tokenizer, sentences, scheme,
                                                [d for d in DECODES if d != "argmax" or not hasattr(teacher, "crf")])
    rows.append(["teacher", *(_pct(_summary_f1(teacher_scores[d]) if d in teacher_scores else None) for d in DECODES)])
    for meta_file in sorted((root / ABLATE_DIR).rglob("student.json")):
        name = str(meta_file.parent.relative_to(root / ABLATE_DIR))
        if meta_file.parent.name.startswith("student-") or read_json(meta_file).get("decoder") == "crf":
            skipped.append(name)
            continue
        student, meta, student_tokenizer = load_student(meta_file.parent)
        rows.append([name, *(_pct(_summary_f1(evaluate_student(student, student_tokenizer, TagVocab(meta.labels),
                                                                meta.max_seq_length, sentences, scheme,
                                                                decode_as=d))) for d in DECODES)])
    return [f"{split} F1 (%) of {root}, {len(sentences)} sentences, by word decoder:", "",
            *markdown_table(["model", *DECODES], rows),
            *([f"skipped (per-language D0 students, CRF students): {', '.join(skipped)}"] if skipped else [])]
