"""Probe sentences: names a run's training data does not hold, tagged by the teacher and the student side by side.

A test F1 says how often the student agrees with the gold tags of sentences like its training data; it does not show
whether the student learned the teacher's knowledge of names it never saw (issue 29: a student distilled on the labeled
sentences alone learns the names it saw). report.md lists a handful of such sentences (`DEFAULT_PROBES` for the run's
languages, or a file of one raw text a line), each in the served word split, with the entities of the teacher (decoded
as the students are) and of the student, and which of its capitalised words the training data does hold.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

from xtremedistil_tf.crf.decoding import DEFAULT_DECODE
from xtremedistil_tf.data.alignment import TagVocab, encode
from xtremedistil_tf.data.loading import read_jsonl
from xtremedistil_tf.data.scoring import char_spans
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.wordsplit import split_words
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_json, read_json
from xtremedistil_tf.methods.student_run import load_student, predict_words
from xtremedistil_tf.run.workdir import STEP_FILE
from xtremedistil_tf.students.artifact import CLASSIFIER, read_config
from xtremedistil_tf.teachers.finetune import teacher_word_tags
from xtremedistil_tf.teachers.saved import load_teacher

# Names chosen to be rare in news, Wikipedia and tweets; report.md says which words of each the training data holds.
DEFAULT_PROBES: Dict[str, List[str]] = {
    "en": ["Adaeze Okonkwo-Baptiste flew from Tallinn to Winnipeg to meet the board of Quillfeather Robotics .",
           "Senator Margarethe Vallonquist said on Tuesday that Brightwater Lumen will open an office in Ouagadougou .",
           "Tomasz Wierzbicki-Hale plays for the Saskatoon Hornets and studied at Kilbride University ."],
    "de": ["Adaeze Okonkwo-Baptiste reiste von Tallinn nach Winnipeg , um den Vorstand von Quillfeather Robotics "
           "zu treffen ."],
    "fr": ["Adaeze Okonkwo-Baptiste a quitté Tallinn pour Winnipeg afin de rencontrer la direction de Quillfeather "
           "Robotics ."],
    "nl": ["Adaeze Okonkwo-Baptiste vloog van Tallinn naar Winnipeg voor een gesprek met Quillfeather Robotics ."],
    "pt": ["Adaeze Okonkwo-Baptiste viajou de Tallinn para Winnipeg para encontrar a diretoria da Quillfeather "
           "Robotics ."],
    "zh": ["欧阳明轩昨天从哈尔滨来到厦门，参加星澜科技公司的年会。"],
}


def probe_texts(work_dir: Path, probes_file: Optional[str] = None) -> List[tuple]:
    """[(language or None, raw text)]: the lines of `probes_file`, else the defaults of the run's languages (its
    data step's, in config.json; English when the data names none)."""
    if probes_file:
        path = Path(probes_file)
        if not path.is_file():
            raise ConfigError(f"--probes={probes_file}: not a file (expected one raw text a line)")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise ConfigError(f"--probes={probes_file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        return [(None, line.strip()) for line in lines if line.strip()]
    config = read_json(work_dir / "config.json") if (work_dir / "config.json").exists() else {}
    data = config.get("data") or {}
    langs = list(data.get("langs") or []) or (["zh"] if data.get("format") == "char_bmes" else ["en"])
    return [(lang, text) for lang in langs for text in DEFAULT_PROBES.get(lang, [])]


def as_sentence(text: str, lang: Optional[str] = None) -> Sentence:
    """A raw text in the served word split."""
    return Sentence([text[a:b] for a, b in split_words([text])[0]], lang=lang, text=text)


def _markup(sentence: Sentence, tags: Sequence[str], scheme: str) -> str:
    text, out, position = sentence.raw_text, [], 0
    for start, end, kind in sorted(char_spans(sentence, tags, scheme)):
        out += [text[position:start], f"[{text[start:end]}]{kind}"]
        position = end
    return "".join(out + [text[position:]])


def probe_rows(work_dir, probes_file: Optional[str] = None) -> List[List[str]]:
    """[text, teacher's entities, student's entities, capitalised words the train split holds, "k of n": the
    teacher's n entities of which the student finds k, same span and type] per probe; [] when the work dir has no
    tagging teacher and student."""
    work_dir = Path(work_dir)
    teacher_dir, student_dir = work_dir / "teacher" / "model", work_dir / "student"
    if not (teacher_dir / "teacher.json").exists() or not (student_dir / "student.json").exists():
        return []
    if read_config(student_dir).decoder == CLASSIFIER:
        return []
    probes = probe_texts(work_dir, probes_file)
    if not probes:
        return []
    key = _rows_key(work_dir, probes)
    kept = read_json(work_dir / ROWS_FILE) if (work_dir / ROWS_FILE).is_file() else {}
    if kept.get("key") == key:
        return kept["rows"]
    rows = _compute_rows(work_dir, probes, teacher_dir, student_dir)
    atomic_write_json(work_dir / ROWS_FILE, {"key": key, "rows": rows})
    return rows


# The rows of the last probe_rows call, with what they were made from: `bin/report` after `bin/train` (make demo) writes
# report.md again with the speed table and keeps them rather than loading both models once more.
ROWS_FILE = "probes.json"


def _rows_key(work_dir: Path, probes: List[tuple]) -> dict:
    """What the probe rows depend on: the texts, and the data, teacher and student steps as they are on disk (a step
    made again, even with the same settings, is a new step.json)."""
    steps = {}
    for name in ("data", "teacher", "student"):
        step = work_dir / name / STEP_FILE
        steps[name] = [read_json(step).get("hash"), step.stat().st_mtime_ns] if step.is_file() else None
    return {"probes": [list(p) for p in probes], "steps": steps}


def _compute_rows(work_dir: Path, probes: List[tuple], teacher_dir: Path, student_dir: Path) -> List[List[str]]:
    sentences = [as_sentence(text, lang) for lang, text in probes]
    model, meta, tokenizer = load_student(student_dir)
    student_tags = predict_words(model, tokenizer, TagVocab(meta.labels), meta.max_seq_length, sentences,
                                 meta.scheme, meta.decoder)
    teacher, teacher_tokenizer = load_teacher(teacher_dir)
    windows = encode(sentences, teacher_tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    decode = None if hasattr(teacher, "crf") else DEFAULT_DECODE
    teacher_tags = teacher_word_tags(teacher, windows, meta.scheme, decode)
    train = work_dir / "data" / "train.jsonl"
    seen = {w for s in read_jsonl(train) for w in s.tokens} if train.exists() else set()
    rows = []
    for sentence, t, s in zip(sentences, teacher_tags, student_tags):
        known = sorted({w for w in sentence.tokens if w[:1].isupper() and w in seen})
        found = set(char_spans(sentence, t, meta.scheme))
        rows.append([sentence.raw_text, _markup(sentence, t, meta.scheme), _markup(sentence, s, meta.scheme),
                     ", ".join(known) or "none", f"{len(found & set(char_spans(sentence, s, meta.scheme)))} of "
                                                 f"{len(found)}"])
    return rows


def probe_agreement(work_dir, student_dir, probes_file: Optional[str] = None) -> tuple:
    """`agreement` of another student of the work dir's teacher (e.g. one seed of bin/ablate's,
    <work_dir>/ablate/seed-N/D4.2) on the probe sentences: (the teacher's entities it finds, the teacher's)."""
    work_dir, student_dir = Path(work_dir), Path(student_dir)
    if not (student_dir / "student.json").is_file():
        raise ConfigError(f"--probe_students: {student_dir} is no saved student (no student.json)")
    if read_config(student_dir).decoder == CLASSIFIER:
        raise ConfigError(f"--probe_students: {student_dir} is a sentence classifier; probes are for NER students")
    teacher_dir = work_dir / "teacher" / "model"
    if not (teacher_dir / "teacher.json").is_file():
        raise ConfigError(f"--work_dir={work_dir}: no fine-tuned teacher in {teacher_dir} to probe against")
    return agreement(_compute_rows(work_dir, probe_texts(work_dir, probes_file), teacher_dir, student_dir))


def agreement(rows: Sequence[Sequence[str]]) -> tuple:
    """(entities of the teacher the student finds too, the teacher's entities) over `probe_rows`' rows."""
    counts = [tuple(int(n) for n in row[4].split(" of ")) for row in rows]
    return sum(k for k, _ in counts), sum(n for _, n in counts)
