"""bin/evaluate: score a saved teacher or student on a labeled file.

    bin/evaluate --model=runs/demo/student --data_format=demo
    bin/evaluate --model=runs/msra/teacher/model --data_format=char_bmes --scheme=BMES \
        --data_dir=/path/to/msra --test_file=test.txt --output_json=runs/msra/test_teacher.json
    bin/evaluate --model=runs/wikiann/ablate/D0/student-de --data_format=wikiann \
        --data_dir=/path/to/wikiann --langs=de

--model is a teacher dir (with teacher.json: <work_dir>/teacher/model, or <work_dir>/teacher),
a student dir (with student.json: <work_dir>/student, <work_dir>/ablate/<strategy>), an
exported model (a SavedModel <export_dir>/<name>[/<version>], or an ONNX or TFLite export dir with
export.json, from bin/export), or a spaCy NER pipeline (config.cfg and meta.json: <work_dir>/peers/spacy of
bin/benchmark peers, the peer trained on the same labels): an export or pipeline is given each sentence's raw
text and scored on exact entity character spans. A teacher or student dir is scored on the
words of --word_split (bert, the default: the data's tokens re-split as an export splits raw text), by
entity over words (the token-level F1) and, beside it, on the same exact entity character spans of the
raw text (the span F1: what its export scores). The
data flags are bin/train's: the file is --test_file (relative to --data_dir); for wikiann it is
<data_dir>/<lang>/<test_file> for each of --langs (default: the test split); for demo it is the
test split bin/train holds out (same --dev_fraction, --test_fraction and --seed).
Prints entity precision, recall and F1, and per-language F1 with their mean and standard
deviation when the sentences carry a language. --train_labels (the work dir bin/train made, or the labeled
file the model was trained on) adds recall and precision on seen and unseen names: gold entities whose type and
words are those of an entity of those labels, and the rest (docs/data.md, "Seen and unseen names").
A student dir or export is refused in one line,
before it loads, when the data has tags outside its label set or another --scheme. A --test_file
that is a FIFO is announced on stderr ("reading <file>") before the read waits for its writer.

A softmax student is scored as bin/export serves it: its word tags decoded by --decode
(constrained, the default: the most probable sequence the tag scheme allows; argmax: each word's
best tag), with the same decoder as the export (crf/decoding.py). An exported model is scored as
it was exported (its assets.extra/export.json says how); --decode, if given, must agree.
A token teacher is decoded as a softmax student is (--decode, constrained by default; a CRF
teacher by its CRF's Viterbi), so a teacher and its students are compared with one decoder and the
default gives the teacher F1 of bin/train's summary and bin/ablate's Table 3; --decode=own scores it
its own way (argmax over the word labels at each word's first piece; a fine-tuned checkpoint's own
argmax column through its label map; a CRF's Viterbi): the teacher step's `argmax_scores`.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from absl import flags

from xtremedistil_tf.benchmarks.spacy_peer import load_spacy_pipeline, spacy_spans
from xtremedistil_tf.cli.common import command, define_common_flags
from xtremedistil_tf.crf.decoding import DEFAULT_DECODE
from xtremedistil_tf.damage import REEXPORT, RETRAIN, reading
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.data.classification import ClassVocab
from xtremedistil_tf.data.demo import read_demo, split_train_dev_test
from xtremedistil_tf.data.loading import CLASSIFICATION_FORMATS, DATA_FORMATS, read_jsonl, reader_kwargs
from xtremedistil_tf.data.readers import read_dataset, read_wikiann_dirs
from xtremedistil_tf.data.schemes import normalize_scheme
from xtremedistil_tf.data.scoring import (
    char_spans,
    score_by_language,
    seen_scores,
    seen_unseen_rows,
    span_scores,
    train_entities,
)
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.wordsplit import DEFAULT_WORD_SPLIT, apply_word_split
from xtremedistil_tf.errors import ConfigError, DamagedArtifact
from xtremedistil_tf.export.portable import PORTABLE_FILES, DamagedModel, Predictor, read_meta
from xtremedistil_tf.export.predictor import load_serving_fn, predict, saved_model_dir
from xtremedistil_tf.export.serving import exported_decode
from xtremedistil_tf.io import atomic_write_json, check_output_file, read_json, say_if_blocking
from xtremedistil_tf.methods.classification import evaluate_classifier_student
from xtremedistil_tf.methods.student_run import evaluate_student, load_student
from xtremedistil_tf.students.artifact import CLASSIFIER, read_config
from xtremedistil_tf.teachers.classifier import SequenceTeacher, evaluate_sequence_teacher
from xtremedistil_tf.teachers.finetune import evaluate_teacher
from xtremedistil_tf.teachers.pretrained import PretrainedSequenceTeacher
from xtremedistil_tf.teachers.saved import load_teacher

OWN = "own"   # --decode of a token teacher's own decoding

FLAGS = flags.FLAGS

flags.DEFINE_string("model", "", "Saved teacher dir (teacher.json), student dir (student.json), exported "
                    "model (<export_dir>/<name>[/<version>]) or spaCy pipeline (<work_dir>/peers/spacy).")
# The data flags of bin/train (cli/train.py), with the same names and defaults.
flags.DEFINE_enum("data_format", "conll", list(DATA_FORMATS),
                  "Input format.")
flags.DEFINE_string("data_dir", "", "Directory the data files are relative to (wikiann: <data_dir>/<lang>/<split>).")
flags.DEFINE_string("test_file", "", "Labeled file to score (wikiann: the split file in each language folder, "
                    "default test).")
flags.DEFINE_list("langs", [], "WikiAnn languages, e.g. en,de,fr.")
flags.DEFINE_enum("scheme", "IOB2", ["IOB1", "IOB2", "BIOES", "BMES"], "Tag scheme of the data.")
flags.DEFINE_enum("word_split", "bert", ["bert", "none"],
                  "bin/train's --word_split: the words a teacher or student is scored on (bert: the served split "
                  "of the raw text; none: the data's own tokens). An export always splits raw text itself.")
flags.DEFINE_bool("strict_tags", False, "Reject invalid tag sequences instead of reading them leniently.")
flags.DEFINE_enum("span_alignment", "refuse", ["refuse", "snap"],
                  "spans_jsonl: a span that cuts a word is refused (refuse) or widened to the words it touches (snap).")
flags.DEFINE_float("dev_fraction", 0.1, "demo only: the dev fraction bin/train held out.")
flags.DEFINE_float("test_fraction", 0.1, "demo only: the test fraction bin/train held out.")
flags.DEFINE_integer("seed", 42, "demo only: the seed of bin/train's split.")
flags.DEFINE_integer("examples", 0, "Exports: also print N test sentences whose served entities are all right (those "
                     "with the most entities first) and one it gets wrong, each with its gold entities beside the "
                     "served ones (0: none).")
flags.DEFINE_string("output_json", "", "Also write the scores here (JSON, written atomically).")
flags.DEFINE_string("train_labels", "", "Taggers: the labels the model was trained on, to score seen and unseen names "
                    "apart: the work dir bin/train made (its data/train.jsonl), or a labeled file read as --test_file "
                    "is (--data_format, relative to --data_dir; wikiann: the split name, e.g. train).")
flags.DEFINE_enum("decode", "constrained", ["constrained", "argmax", OWN],
                  "Softmax students and token teachers: decode word tags as bin/export --decode does (constrained: "
                  "the best sequence the tag scheme allows; argmax: each word's best tag). Exports: as exported. "
                  f"{OWN}: a token teacher's own decoding (the teacher step's argmax_scores).")

define_common_flags()


def read_labeled(fmt: str, data_dir: str, test_file: str, langs: Sequence[str], scheme: str,
                 strict_tags: bool = False, dev_fraction: float = 0.1, test_fraction: float = 0.1,
                 seed: int = 42, word_split: str = DEFAULT_WORD_SPLIT,
                 span_alignment: str = "refuse") -> List[Sentence]:
    """The labeled sentences the data flags name, read as bin/train reads its test split (in `word_split`'s
    words; sentence-classification data as it is)."""
    if fmt == "demo":
        sentences = split_train_dev_test(read_demo(), dev_fraction, test_fraction, seed)[2]
    elif fmt == "wikiann":
        if not langs:
            raise ConfigError("--data_format=wikiann needs --langs (e.g. en,de)")
        sentences = read_wikiann_dirs(data_dir, langs, test_file or "test", scheme=scheme, strict_tags=strict_tags)
    else:
        if not test_file:
            raise ConfigError("--test_file is required")
        path = Path(test_file)
        if data_dir and not path.is_absolute():
            path = Path(data_dir) / path
        say_if_blocking(path)
        sentences = read_dataset(fmt, path, **reader_kwargs(fmt, scheme, strict_tags, "test", span_alignment))
    return sentences if fmt in CLASSIFICATION_FORMATS else apply_word_split(sentences, word_split, scheme)


def read_train_entities(train_labels: str, fmt: str, data_dir: str, langs: Sequence[str], scheme: str,
                        strict_tags: bool = False) -> frozenset:
    """The entities that make a name seen (data/scoring.train_entities) of --train_labels: a work dir bin/train made
    (its data/train.jsonl, in the run's --scheme), its data/ folder, or a labeled file read as `read_labeled` reads
    --test_file."""
    path = Path(train_labels)
    if fmt in CLASSIFICATION_FORMATS:
        raise ConfigError(f"--train_labels scores names of a tagger; --data_format={fmt} classifies sentences")
    if path.is_dir():
        found = next((p for p in (path / "data" / "train.jsonl", path / "train.jsonl") if p.is_file()), None)
        if found is None:
            raise ConfigError(f"--train_labels={train_labels}: a directory without data/train.jsonl (a work dir of "
                              "bin/train) or train.jsonl (its data/ folder)")
        step = found.parent / "step.json"
        run_scheme = read_json(step).get("fingerprint", {}).get("data", {}).get("scheme") if step.is_file() else None
        return train_entities(read_jsonl(found), run_scheme or scheme)
    if fmt == "demo":
        raise ConfigError(f"--train_labels={train_labels}: --data_format=demo has no train file; give the work dir "
                          "bin/train made (its data/train.jsonl)")
    return train_entities(read_labeled(fmt, data_dir, train_labels, langs, scheme, strict_tags), scheme)


def model_kind(directory) -> Tuple[str, Path]:
    """("teacher" | "student" | "export", its dir); a work dir's teacher/ is accepted too."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"--model={directory} is not a directory")
    for kind, path in (("teacher", directory), ("student", directory), ("teacher", directory / "model")):
        if (path / f"{kind}.json").exists():
            return kind, path
    if (directory / "config.cfg").exists() and (directory / "meta.json").exists():
        return "spacy", directory
    portable = (directory / "export.json").exists() or any((directory / f).exists() for f in PORTABLE_FILES)
    if portable and "teacher_dir" in portable_meta(directory):
        raise ConfigError(f"{directory} is a teacher's ids-in ONNX export (bin/export --teacher), the speed peer of "
                          f"bin/benchmark latency; it has no text path to score: score the teacher it was made from, "
                          f"--model={portable_meta(directory)['teacher_dir']}")
    if portable or (directory / "saved_model.pb").exists() or any(directory.glob("[0-9]*/saved_model.pb")):
        return "export", directory
    raise ConfigError(f"{directory} holds neither teacher.json (a saved teacher, e.g. <work_dir>/teacher/model), "
                      "student.json (a saved student, e.g. <work_dir>/student), an export (a SavedModel, or "
                      "export.json of an ONNX or TFLite export) nor a spaCy pipeline (config.cfg and meta.json, e.g. "
                      "<work_dir>/peers/spacy of bin/benchmark peers)")


def evaluate_model(directory, sentences: Sequence[Sentence], scheme: str, decode: Optional[str] = None,
                   served: Optional[list] = None, seen: Optional[frozenset] = None) -> Dict:
    """Entity scores of a saved teacher's or student's word-level predictions on `sentences`.

    `decode` (crf/decoding.py): how a softmax student's or token teacher's word tags are decoded (None:
    "constrained", as bin/export serves by default and the pipeline scores teachers; OWN: a token
    teacher's own decoding, teachers.finetune.teacher_word_tags); an export decodes as it was exported,
    and a `decode` that differs is refused. `served`: a list that gets an export's entities of each
    sentence, as sets of (start, end, type). `seen` (`read_train_entities`): a tagger's scores also get
    "seen_unseen" (data/scoring.seen_scores)."""
    if not sentences:
        raise ConfigError("no labeled sentences to score")
    kind, path = model_kind(directory)
    if decode == OWN and kind != "teacher":
        raise ConfigError(f"--decode={OWN} is a token teacher's own decoding; {path} is {'an' if kind == 'export' else 'a'} "
                          f"{kind}")
    if kind == "spacy":
        if decode is not None:
            raise ConfigError(f"--decode={decode}: {path} is a spaCy pipeline, which decodes its own entities")
        return {"model": str(path), "kind": kind, "scheme": scheme, **_evaluate_spacy(path, sentences, scheme,
                                                                                     served, seen)}
    with reading(path, REEXPORT if kind == "export" else RETRAIN):   # a damaged or missing file named in one line
        if kind == "export":
            return _evaluate_export(path, sentences, scheme, decode, served, seen)
        _check_task(path, kind, sentences)
        if kind == "teacher":
            scores = _evaluate_teacher(path, sentences, scheme, decode, seen)
        else:
            scores = _evaluate_student(path, sentences, scheme, decode or DEFAULT_DECODE, seen)
    return {"model": str(path), "kind": kind, "scheme": scheme, **scores}


def _evaluate_teacher(path: Path, sentences: Sequence[Sentence], scheme: str, decode: Optional[str],
                      seen: Optional[frozenset] = None) -> Dict:
    teacher, tokenizer = load_teacher(path)
    if isinstance(teacher, (SequenceTeacher, PretrainedSequenceTeacher)):
        if decode is not None:
            raise ConfigError(f"--decode={decode}: {path} classifies sentences; --decode is for taggers")
        return evaluate_sequence_teacher(teacher, tokenizer, sentences)
    decode = decode or DEFAULT_DECODE
    return {"decode": decode,
            **evaluate_teacher(teacher, tokenizer, sentences, scheme, decode=None if decode == OWN else decode,
                               seen=seen)}


def _evaluate_export(path: Path, sentences: Sequence[Sentence], scheme: str, decode: Optional[str],
                     served: Optional[list], seen: Optional[frozenset] = None) -> Dict:
    """evaluate_model of an export: a SavedModel, or an ONNX or TFLite export dir (export.json)."""
    portable = (path / "export.json").exists() or any((path / f).exists() for f in PORTABLE_FILES)
    if portable:
        meta = portable_meta(path)
        _check_tags(path, meta["scheme"], meta["word_labels"], sentences, scheme)
        exported = meta["decode"]
    else:
        meta = _export_meta(path)
        if meta is not None:
            _check_tags(path, meta.scheme, meta.labels, sentences, scheme)

        exported = exported_decode(saved_model_dir(path))
    if decode is not None and decode != exported:
        raise ConfigError(f"--decode={decode}: {path} was exported with {exported} decoding; score it without "
                          f"--decode or re-export with bin/export --decode={decode}")
    return {"model": str(path), "kind": "export", "scheme": scheme, "decode": exported,
            **({"format": meta["format"], "quantize": meta["quantize"]} if portable else {"format": "saved_model"}),
            **_evaluate_served(path, sentences, scheme, portable, served, seen)}


def portable_meta(directory: Path) -> dict:
    """export.json of an ONNX or TFLite export folder; missing or damaged: one line naming it (portable.read_meta)."""
    try:
        return read_meta(directory)
    except DamagedModel as e:
        raise DamagedArtifact(f"{e}; {REEXPORT}") from None


def _check_task(path: Path, kind: str, sentences: Sequence[Sentence]) -> None:
    """A classifier needs class labels, a tagger token tags: refuse data of the other task."""
    meta = read_json(path / f"{kind}.json")
    classifier = meta.get("task") == "classification" or meta.get("decoder") == CLASSIFIER
    if classifier and any(s.label is None for s in sentences):
        raise ConfigError(f"{path} is a sentence classifier; score it on --data_format=label_tsv data")
    if not classifier and any(s.tags is None for s in sentences):
        raise ConfigError(f"{path} tags tokens; score it on tagged data, not --data_format=label_tsv")


def _export_meta(path: Path):
    """The student.json an export carries (assets.extra/, export.serving), None if it has none."""
    extra = saved_model_dir(path) / "assets.extra"
    return read_config(extra) if (extra / "student.json").exists() else None


def _check_tags(path: Path, model_scheme: str, labels: Sequence[str], sentences: Sequence[Sentence],
                scheme: str) -> None:
    """A tagger (student dir or export) scores data of its own scheme and label set only; checked
    before the model loads. Predicted tags are in the model's scheme and gold tags in --scheme;
    scoring converts both with one scheme, so they must agree."""
    if model_scheme != normalize_scheme(scheme):
        raise ConfigError(f"{path} tags in {model_scheme}, but --scheme={scheme}")
    unknown = sorted({tag for s in sentences for tag in (s.tags or ())} - set(labels))
    if unknown:
        raise ConfigError(f"--model={path} was trained on the labels {', '.join(labels)}; the data has "
                          f"{', '.join(unknown)}, which it cannot predict: score it on data of its label set")


def _evaluate_student(path: Path, sentences: Sequence[Sentence], scheme: str, decode: str,
                      seen: Optional[frozenset] = None) -> Dict:
    meta = read_config(path)
    if meta.decoder != CLASSIFIER:
        _check_tags(path, meta.scheme, meta.labels, sentences, scheme)
    model, meta, tokenizer = load_student(path)
    if meta.decoder == CLASSIFIER:
        return evaluate_classifier_student(model, tokenizer, ClassVocab(meta.labels), meta.max_seq_length, sentences)
    return {"decode": decode, **evaluate_student(model, tokenizer, TagVocab(meta.labels), meta.max_seq_length,
                                                 sentences, scheme, meta.decoder, decode, seen=seen)}


def _evaluate_served(path: Path, sentences: Sequence[Sentence], scheme: str, portable: bool = False,
                     served: Optional[list] = None, seen: Optional[frozenset] = None) -> Dict:
    """Exact character-span scores of an exported model's entities on the sentences' raw text (its own
    tokenizer splits it into words): a SavedModel through its serving signature, an ONNX or TFLite export
    through its shipped predict.py (export/portable.py), in this process."""
    if any(s.tags is None for s in sentences):
        raise ConfigError(f"{path} tags tokens; score it on tagged data, not --data_format=label_tsv")
    texts = [s.raw_text for s in sentences]
    if portable:
        try:
            predictor = Predictor(path)
        except DamagedModel as e:   # the model file against export.json's record, or its runtime's refusal
            raise DamagedArtifact(f"{e}; {REEXPORT}") from e
        records = predictor.predict(texts)
    else:
        records = predict(load_serving_fn(path), texts)
    return _score_served(sentences, scheme, [{(e["start"], e["end"], e["type"]) for e in r["entities"]}
                                             for r in records], served, seen)


def _evaluate_spacy(path: Path, sentences: Sequence[Sentence], scheme: str, served: Optional[list] = None,
                    seen: Optional[frozenset] = None) -> Dict:
    """A spaCy pipeline (bin/benchmark peers' W/peers/spacy) scored as an export is: its own tokenizer on the raw
    text, its entities as character spans, the same scorer."""
    if any(s.tags is None for s in sentences):
        raise ConfigError(f"{path} is a spaCy NER pipeline; score it on tagged data, not --data_format=label_tsv")
    nlp = load_spacy_pipeline(path)
    return _score_served(sentences, scheme, spacy_spans(nlp, [s.raw_text for s in sentences]), served, seen)


def _score_served(sentences: Sequence[Sentence], scheme: str, pred: List[set], served: Optional[list] = None,
                  seen: Optional[frozenset] = None) -> Dict:
    """Scores of a system's entities `pred` (per sentence, (start, end, type) character spans of its raw text)."""
    gold = [char_spans(s, s.tags, scheme) for s in sentences]
    if served is not None:
        served.extend(pred)
    scores = score_by_language(gold, pred, [s.lang for s in sentences], scorer=span_scores)
    if seen is not None:
        scores["seen_unseen"] = seen_scores(sentences, gold, pred, seen)
    return scores


def format_examples(sentences: Sequence[Sentence], served: Sequence[set], scheme: str, count: int) -> str:
    """`count` sentences whose served entities equal the gold ones (those with three or more entities first, then
    two, then one, the shortest texts first: what reads as an example) and the first with an entity served wrong,
    each as its raw text with the gold and the served entities."""
    gold = [char_spans(s, s.tags, scheme) for s in sentences]
    right = sorted((i for i, (g, p) in enumerate(zip(gold, served)) if g and g == p),
                   key=lambda i: (-min(len(gold[i]), 3), len(sentences[i].raw_text), i))
    wrong = next((i for i, (g, p) in enumerate(zip(gold, served)) if g and g != p), None)

    def entities(text: str, spans) -> str:
        return ", ".join(f"{text[a:b]} [{kind}]" for a, b, kind in sorted(spans)) or "(none)"

    lines = [f"{len(right[:count])} test sentences served right (of {len(right)} with every entity right)"
             + (" and one served wrong" if wrong is not None else "") + ":"]
    for i in right[:count] + ([wrong] if wrong is not None else []):
        text = sentences[i].raw_text
        lines += [f"  {'right' if i != wrong else 'WRONG'}: {text}", f"    gold:   {entities(text, gold[i])}",
                  f"    served: {entities(text, served[i])}"]
    return "\n".join(lines)


def format_scores(scores: Dict) -> str:
    a = scores["all"]
    metric = (f" ({scores.get('format', 'saved_model')}" + (f" {scores['quantize']}" if scores.get('quantize', 'none') != 'none' else '')
              + ': exact entity character spans)') if scores['kind'] == 'export' else ''
    decoding = f", {scores['decode']} decoding" if "decode" in scores else ""
    lines = [f"{scores['kind']} {scores['model']} on {a['sentences']:,} sentences{metric}{decoding}",
             f"precision {a['precision']:.4f}  recall {a['recall']:.4f}  F1 {a['f1']:.4f}"
             + (f"  accuracy {a['accuracy']:.4f}  (P/R/F1 macro-averaged over classes)" if "accuracy" in a else "")]
    for lang, s in scores.get("languages", {}).items():
        lines.append(f"  {lang:<8} F1 {s['f1']:.4f}  P {s['precision']:.4f}  R {s['recall']:.4f}  "
                     f"({s['sentences']:,} sentences)")
    if "f1_mean" in scores:
        lines.append(f"F1 across languages: mean {scores['f1_mean']:.4f}, std {scores['f1_std']:.4f}")
    if "spans" in scores:   # a tagger dir: the same predictions on exact entity character spans of the raw text
        spans = scores["spans"]
        lines.append(f"span precision {spans['all']['precision']:.4f}  recall {spans['all']['recall']:.4f}  "
                     f"F1 {spans['all']['f1']:.4f}  (exact entity character spans of the raw text, as an export "
                     "of it is scored)" + (f"; across languages: mean {spans['f1_mean']:.4f}, std "
                                           f"{spans['f1_std']:.4f}" if "f1_mean" in spans else ""))
    if "seen_unseen" in scores:   # --train_labels
        train = scores["seen_unseen"]["train_entities"]
        what = {"seen": f"gold entities whose type and words are those of one of the {train:,} entities of "
                        "--train_labels", "unseen": "other gold entities"}
        lines += [f"{kind} names recall / precision {cell}  (of {gold} {what[kind]})"
                  for kind, gold, cell in seen_unseen_rows({"model": scores["seen_unseen"]})]
    return "\n".join(lines)


def evaluate() -> None:
    if not FLAGS.model:
        raise ConfigError("--model is required")
    model_kind(FLAGS.model)   # a wrong dir fails before the data is read
    if FLAGS.output_json:
        check_output_file(FLAGS.output_json, f"--output_json={FLAGS.output_json}")
    sentences = read_labeled(FLAGS.data_format, FLAGS.data_dir, FLAGS.test_file, FLAGS.langs, FLAGS.scheme,
                             FLAGS.strict_tags, FLAGS.dev_fraction, FLAGS.test_fraction, FLAGS.seed, FLAGS.word_split,
                             FLAGS.span_alignment)
    if FLAGS.examples < 0:
        raise ConfigError(f"--examples={FLAGS.examples}; expected 0 (none) or a number of sentences")
    if FLAGS.examples and model_kind(FLAGS.model)[0] != "export":
        raise ConfigError("--examples shows an export's served entities; give --model an export (bin/export)")
    seen = read_train_entities(FLAGS.train_labels, FLAGS.data_format, FLAGS.data_dir, FLAGS.langs, FLAGS.scheme,
                               FLAGS.strict_tags) if FLAGS.train_labels else None
    served: list = []
    scores = evaluate_model(FLAGS.model, sentences, FLAGS.scheme, FLAGS.decode if FLAGS["decode"].present else None,
                            served, seen)
    if FLAGS.output_json:
        atomic_write_json(FLAGS.output_json, scores)
    print(format_scores(scores), file=sys.stdout, flush=True)
    if FLAGS.examples:
        print(format_examples(sentences, served, FLAGS.scheme, FLAGS.examples), file=sys.stdout, flush=True)


main, run = command(evaluate, __doc__, 'bin/evaluate --model=runs/demo/student --data_format=demo')
