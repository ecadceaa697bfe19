"""`bin/benchmark embedding_drift --work_dir=W [--student_dir=D]`: how far a student's word embeddings moved from
their start (the SVD of W's fine-tuned teacher's embeddings, as the student step builds them) during distillation,
for the pieces its training text holds and for the rest, and which of those the unseen names of W's test split
are made of (issue 50, item 3: why a student recalls names it was taught and misses the others).

Pieces fall in three groups: those of W's labeled train windows, those only the unlabeled transfer windows hold
(W/transfer, the cache the student read), and those of neither, whose embeddings get no gradient and stay where the
SVD put them while the layers above them move. For each group: the pieces, the mean distance ||E - E0|| of their
rows, that distance over the mean ||E0||, and the mean cosine of E and E0. Then the pieces of W's test entities that
are unseen (data/scoring.entity_keys) and seen, each counted once a piece occurrence, by group. The student is
W/student or `--student_dir` (e.g. W/ablate/seed-1/D4.2); it must read SVD embeddings (--student_embeddings=svd).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import numpy as np
from absl import flags

from xtremedistil_tf.data import scoring
from xtremedistil_tf.data.loading import read_jsonl
from xtremedistil_tf.data.schemes import normalize_scheme
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import read_json
from xtremedistil_tf.methods.student_run import load_student
from xtremedistil_tf.students import svd_reduce
from xtremedistil_tf.teachers.saved import load_teacher
from xtremedistil_tf.transfer.cache import read_sharded

FLAGS = flags.FLAGS
GROUPS = ("labeled", "transfer only", "neither")


def define_flags() -> None:
    if "student_dir" not in FLAGS:
        flags.DEFINE_string("student_dir", "", "embedding_drift: the student to read (default: <work_dir>/student).")


def _piece_ids(tokenizer, texts: List[str]) -> np.ndarray:
    return np.array([i for text in texts for i in tokenizer(text, add_special_tokens=False)["input_ids"]], np.int64)


def measure(work_dir, student_dir=None) -> dict:
    work = Path(work_dir)
    student_dir = Path(student_dir) if student_dir else work / "student"
    for path in (work / "teacher" / "model", student_dir, work / "transfer"):
        if not path.exists():
            raise ConfigError(f"--work_dir={work_dir}: {path} is missing (bin/train makes it)")
    student, meta, tokenizer = load_student(student_dir)
    layer = next((layer for layer in student.layers if layer.name == "word_embedding"), None)
    if layer is None:
        raise ConfigError(f"{student_dir}: the student has no word_embedding layer")
    final = layer.get_weights()[0]
    teacher, _ = load_teacher(work / "teacher" / "model")
    start = svd_reduce(teacher.word_embeddings(), final.shape[1])
    if start.shape != final.shape:
        raise ConfigError(f"{student_dir}: its word embeddings {final.shape} are not an SVD of the teacher's "
                          f"({start.shape}); this reads students of --student_embeddings=svd")
    train = read_jsonl(work / "data" / "train.jsonl")
    labeled_windows = read_json(work / "transfer" / "step.json")["info"]["train_windows"]
    ids = {"labeled": [], "transfer": []}
    for index, window in enumerate(read_sharded(work / "transfer", keys=["input_ids"]).as_numpy_iterator()):
        ids["labeled" if index < labeled_windows else "transfer"].append(window["input_ids"])
    ids = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in ids.items()}
    group = np.full(len(final), 2, np.int64)
    group[np.unique(ids["transfer"])] = 1
    group[np.unique(ids["labeled"])] = 0
    distance = np.linalg.norm(final - start, axis=1)
    norm = np.linalg.norm(start, axis=1)
    cosine = (final * start).sum(1) / np.maximum(np.linalg.norm(final, axis=1) * norm, 1e-12)
    groups = {name: {"pieces": int((group == g).sum()), "distance": float(distance[group == g].mean()),
                     "relative": float(distance[group == g].mean() / norm[group == g].mean()),
                     "cosine": float(cosine[group == g].mean())} for g, name in enumerate(GROUPS)}
    scheme = normalize_scheme(meta.scheme)
    seen = scoring.train_entities(train, scheme)
    test = read_jsonl(work / "data" / "test.jsonl")
    texts = [s.raw_text for s in test]
    keys = scoring.entity_keys(texts, [scoring.char_spans(s, s.tags, scheme) for s in test])
    names: Dict[str, List[str]] = {"unseen": [], "seen": []}
    for text, spans in zip(texts, keys):
        for (begin, end, _), key in spans.items():
            names["seen" if key in seen else "unseen"].append(text[begin:end])
    entity_pieces = {}
    for kind, found in names.items():
        pieces = _piece_ids(tokenizer, found)
        entity_pieces[kind] = {"entities": len(found), "pieces": len(pieces),
                               **{name: float((group[pieces] == g).mean()) if len(pieces) else 0.0
                                  for g, name in enumerate(GROUPS)}}
    return {"work_dir": str(work_dir), "student_dir": str(student_dir), "labeled_windows": labeled_windows,
            "groups": groups, "test_entity_pieces": entity_pieces}


def format_lines(result: dict) -> List[str]:
    lines = [f"word embeddings of {result['student_dir']} against their start (the SVD of the teacher's), by where "
             f"the student's training text has each piece ({result['labeled_windows']:,} labeled windows first in the "
             "cache, then the transfer windows):",
             f"  {'pieces':<16}{'count':>8}{'||E-E0||':>10}{' / ||E0||':>10}{'cos(E,E0)':>11}"]
    for name, g in result["groups"].items():
        lines.append(f"  {name:<16}{g['pieces']:>8,}{g['distance']:>10.3f}{g['relative']:>10.3f}{g['cosine']:>11.3f}")
    lines.append("pieces of the test split's gold entities, by group:")
    for kind, e in result["test_entity_pieces"].items():
        shares = ", ".join(f"{name} {100 * e[name]:.1f}%" for name in GROUPS)
        lines.append(f"  {kind} names ({e['entities']:,} entities, {e['pieces']:,} pieces): {shares}")
    return lines


def run(repeats: int) -> List[str]:   # noqa: ARG001  (no timing: nothing to repeat)
    define_flags()
    if not FLAGS.work_dir:
        raise ConfigError("--work_dir is required: a bin/train work dir with a teacher, a transfer cache and a student")
    return format_lines(measure(FLAGS.work_dir, FLAGS.student_dir or None))
