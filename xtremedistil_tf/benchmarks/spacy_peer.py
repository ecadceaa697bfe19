"""`bin/benchmark peers --work_dir=W`: W's student beside the system a user would pick instead, spaCy's CPU
"efficiency" NER trained on the same labels (issue 51).

- spaCy's pipeline: `spacy init config --pipeline ner --optimize efficiency` (no pretrained vectors), trained on W's
  labeled train split with W's dev split for spaCy's own evaluation and early stopping (`--spacy_patience` steps
  without a better dev F1, at most `--spacy_max_steps`, at most `--spacy_max_minutes`: then the best checkpoint so
  far, the dev set scored once more), seeded (`--spacy_seed`). Each sentence becomes a spaCy Doc of its words with
  the whitespace of its raw text between them (`to_doc`: the Doc's text is the raw text), its entities those of its
  tags. Kept in W/peers/spacy/ (written whole or not at all), with training.json: what it was trained on (the
  splits' hashes, the settings, spaCy's version) and how the training went. A rerun reuses it; other data or settings
  are refused, `--overwrite` retrains.
- Scores: each system reads the raw text of W's test split through its own tokenizer, and the entities it returns
  as character spans are scored by one function, data/scoring.span_scores (`score_systems`), overall and per type:
  the student's SavedModel (W/export/ner if bin/export wrote one, else the student dir as bin/export would export it,
  in memory), its int8 ONNX export (W/export/ner-onnx-dynamic_int8, exported there as `bin/export --format=onnx
  --quantize=dynamic_int8` would when missing) and spaCy's `nlp(text).ents`.
- Speed: in one process, `--peers_threads` thread(s) each (TensorFlow and ONNX Runtime intra-op; spaCy's thinc runs
  its matrix products in blis, single-threaded), rows interleaved (benchmarks/peers.time_rows), raw text in and
  entities out (Python records: the SavedModel's output tensors decoded by export/predictor.entities, predict.py's
  `Predictor.predict`, spaCy's `doc.ents` as (start, end, type)), the first `--queries` test sentences at batch 1 and
  32: the SavedModel's `serving_default`, the int8 ONNX `predict.py`, spaCy's `nlp(text)` (batch 1) and
  `nlp.pipe(texts, batch_size=32)`. Milliseconds per sentence and words (of the run's word split) per second per
  core.
The results go to W/peers.json (or --output_json).

    bin/benchmark peers --work_dir=runs/demo [--spacy_max_minutes=30 --spacy_seed=0 --peers_threads=1 --queries=1000]

spaCy is an optional extra (setup.py's `peers`); without it the benchmark refuses in one line before any work.
"""
from __future__ import annotations

import copy
import logging
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set

import numpy as np
import tensorflow as tf
from absl import flags

from xtremedistil_tf.benchmarks import peers
from xtremedistil_tf.benchmarks.latency import DEFAULT_REPEATS, machine
from xtremedistil_tf.benchmarks.latency import define_flags as define_latency_flags
from xtremedistil_tf.data import scoring
from xtremedistil_tf.data.loading import read_jsonl
from xtremedistil_tf.data.schemes import normalize_scheme, tags_to_spans
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.wordsplit import word_offsets
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export import formats
from xtremedistil_tf.export.portable import Predictor
from xtremedistil_tf.export.predictor import (check_exported_from, entities, exported_student, load_serving_fn,
                                               predict)
from xtremedistil_tf.io import atomic_dir, atomic_write_json, check_output_file, file_sha256, read_json
from xtremedistil_tf.students.artifact import CLASSIFIER, read_config

FLAGS = flags.FLAGS
log = logging.getLogger(__name__)
RESULT = "peers.json"
SPACY_VERSION = "3.8.18"   # setup.py's `peers` extra and the Makefile pin it
INSTALL = f'pip install ".[peers]" (or pip install spacy=={SPACY_VERSION})'
TRAINING = "training.json"   # beside spaCy's pipeline in W/peers/spacy/
ONNX_INT8 = ("onnx", "dynamic_int8")

# The timed rows, in the table's order (keys as peers.KEYS); the first's format is "student_dir" when W has no
# SavedModel export and the student dir is served in memory.
SAVED_MODEL = ("student", "tensorflow", "saved_model", "none", "text")
ONNX_ROW = ("student", "onnxruntime", "onnx", "dynamic_int8", "text")
SPACY_ROW = ("spacy", "spacy", "efficiency_ner", "none", "text")


def define_flags() -> None:
    define_latency_flags()   # --queries, --output_json
    if "spacy_max_minutes" in FLAGS:
        return
    flags.DEFINE_float("spacy_max_minutes", 60.0, "peers: stop spaCy's training after this many minutes (its best "
                       "checkpoint so far is kept); 0: no limit.")
    flags.DEFINE_integer("spacy_max_steps", 20000, "peers: spaCy's training.max_steps (its efficiency config's).")
    flags.DEFINE_integer("spacy_patience", 1600, "peers: spaCy's training.patience: steps without a better dev F1 "
                         "before it stops (its efficiency config's).")
    flags.DEFINE_integer("spacy_eval_frequency", 200, "peers: spaCy's training.eval_frequency: steps between its "
                         "dev evaluations (its efficiency config's).")
    flags.DEFINE_integer("spacy_seed", 0, "peers: spaCy's system.seed (its config's default).")
    flags.DEFINE_string("spacy_lang", "en", "peers: spaCy's language (its tokenizer's rules); xx: multi-language.")
    flags.DEFINE_integer("peers_threads", 1, "peers: threads of each timed system (TensorFlow and ONNX Runtime "
                         "intra-op; spaCy runs on one).")
    if "overwrite" not in FLAGS:
        flags.DEFINE_bool("overwrite", False, "Replace artifacts in --work_dir made by another configuration.")


def require_spacy():
    """The spacy module, or a ConfigError saying in one line how to install it."""
    try:
        import spacy  # noqa: PLC0415  (the optional `peers` extra)
    except ImportError:
        raise ConfigError(f"spaCy is not installed (an optional extra): {INSTALL}") from None
    # spaCy gives its logger a stderr handler of its own: its records go to the root's handlers instead, like every
    # other library's (the console shows them with --verbose).
    own = logging.getLogger("spacy")
    for handler in [h for h in own.handlers if type(h) is logging.StreamHandler]:
        own.removeHandler(handler)
    return spacy


def load_spacy_pipeline(path):
    """A spaCy pipeline directory (config.cfg, meta.json: W/peers/spacy of this benchmark); a directory spaCy cannot
    load is one line naming it."""
    spacy = require_spacy()
    try:
        return spacy.load(path)
    except (OSError, ValueError, KeyError) as e:   # spaCy's own errors for a pipeline it cannot read
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(f"{path}: spaCy {spacy.__version__} cannot load this pipeline ({first})") from None


# --- spaCy's training data: our sentences as Docs --------------------------------------------------------------

def to_doc(vocab, sentence: Sentence, scheme: str):
    """`sentence` as a spaCy Doc whose text is its raw text: its words, the one space after a word as the word's
    trailing space, any other text between words (more whitespace) as a token of its own; its entities those of its
    tags (under `scheme`), so their character spans are data/scoring.char_spans'."""
    from spacy.tokens import Doc, Span  # noqa: PLC0415

    text = sentence.raw_text
    words: List[str] = []
    spaces: List[bool] = []
    index: List[int] = []   # the Doc token of each of our words

    def between(gap: str) -> None:
        if gap and words and gap[0] == " ":
            spaces[-1], gap = True, gap[1:]
        if gap:
            words.append(gap)
            spaces.append(False)

    position = 0
    for start, end in word_offsets(sentence):
        between(text[position:start])
        index.append(len(words))
        words.append(text[start:end])
        spaces.append(False)
        position = end
    between(text[position:])
    doc = Doc(vocab, words=words, spaces=spaces)
    if sentence.tags is not None:
        doc.ents = [Span(doc, index[first], index[end - 1] + 1, label=etype)
                    for etype, first, end in tags_to_spans(list(sentence.tags), scheme)]
    return doc


# --- spaCy's training, its own early stopping, a time budget ---------------------------------------------------

def spacy_config(lang: str, seed: int, max_steps: int, patience: int, eval_frequency: int):
    """`spacy init config --lang LANG --pipeline ner --optimize efficiency` (CPU), seeded, with its stopping rule."""
    from spacy.cli.init_config import init_config  # noqa: PLC0415

    config = init_config(lang=lang, pipeline=["ner"], optimize="efficiency", gpu=False)
    config["system"]["seed"] = seed
    config["training"].update({"max_steps": max_steps, "patience": patience, "eval_frequency": eval_frequency})
    return config


def parameters(nlp) -> int:
    """The trained parameters of a spaCy pipeline (every component's thinc model)."""
    seen, total = set(), 0
    for _, component in nlp.pipeline:
        model = getattr(component, "model", None)
        for node in (model.walk() if hasattr(model, "walk") else ()):
            for name in node.param_names:
                if node.has_param(name) and (node.id, name) not in seen:
                    seen.add((node.id, name))
                    total += int(node.get_param(name).size)
    return total


def train_spacy(train: Sequence[Sentence], dev: Sequence[Sentence], scheme: str, settings: dict,
                max_minutes: float):
    """(the trained nlp at its best dev checkpoint, a dict of how the training went), as `spacy train` trains it
    (spacy.training.loop.train's steps) but stopping also after `max_minutes` (0: no limit)."""
    import spacy  # noqa: PLC0415
    from spacy.tokens import DocBin  # noqa: PLC0415
    from spacy.training.initialize import init_nlp  # noqa: PLC0415
    from spacy.training.loop import (  # noqa: PLC0415
        create_evaluation_callback,
        create_train_batches,
        train_while_improving,
    )
    from spacy.util import registry, resolve_dot_names  # noqa: PLC0415
    from spacy.schemas import ConfigSchemaTraining  # noqa: PLC0415
    from thinc.api import fix_random_seed  # noqa: PLC0415

    config = spacy_config(settings["lang"], settings["seed"], settings["max_steps"], settings["patience"],
                          settings["eval_frequency"])
    blank = spacy.blank(settings["lang"])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="spacy_peer_") as scratch:
        for name, sentences in (("train", train), ("dev", dev)):
            DocBin(docs=[to_doc(blank.vocab, s, scheme) for s in sentences]).to_disk(Path(scratch) / f"{name}.spacy")
            config["paths"][name] = str(Path(scratch) / f"{name}.spacy")
        nlp = init_nlp(config, use_gpu=-1)
        resolved = nlp.config.interpolate()
        fix_random_seed(settings["seed"])
        T = registry.resolve(resolved["training"], schema=ConfigSchemaTraining)
        train_corpus, dev_corpus = resolve_dot_names(resolved, [T["train_corpus"], T["dev_corpus"]])
        optimizer = T["optimizer"]
        evaluate = create_evaluation_callback(nlp, dev_corpus, T["score_weights"])
        steps = train_while_improving(
            nlp, optimizer, create_train_batches(nlp, train_corpus, T["batcher"], T["max_epochs"]), evaluate,
            dropout=T["dropout"], accumulate_gradient=T["accumulate_gradient"], patience=T["patience"],
            max_steps=T["max_steps"], eval_frequency=T["eval_frequency"], exclude=T["frozen_components"],
            annotating_components=T["annotating_components"], before_update=T["before_update"])
        deadline = started + 60 * max_minutes if max_minutes > 0 else None
        best: Optional[bytes] = None
        best_score, best_step, info = -1.0, -1, {"step": -1, "epoch": 0}
        stopped = "early stopping (patience)"
        log.info(f"peers: training spaCy's efficiency NER on {len(train):,} train sentences, dev F1 every "
                 f"{settings['eval_frequency']} steps (at most {settings['max_steps']:,} steps"
                 + (f" and {max_minutes:g} minutes" if max_minutes > 0 else "")
                 + f"; it stops after {settings['patience']:,} without a better dev F1)")
        for _, info, is_best in steps:
            if is_best is not None:
                log.info(f"  spaCy step {info['step']:,} (epoch {info['epoch']}): dev F1 {info['score']:.4f}"
                         + (" (best)" if is_best else ""))
            if is_best:
                with nlp.use_params(optimizer.averages):
                    best, best_score, best_step = nlp.to_bytes(), float(info["score"]), int(info["step"])
            if settings["max_steps"] and info["step"] >= settings["max_steps"]:
                stopped = "max_steps"
            if deadline is not None and time.perf_counter() > deadline:
                stopped = "time budget"
                if is_best is None:   # the steps since the last evaluation: scored once, kept if better
                    with nlp.use_params(optimizer.averages):
                        score, _ = evaluate()
                        if best is None or score > best_score:
                            best, best_score, best_step = nlp.to_bytes(), float(score), int(info["step"])
                break
        if best is not None:
            nlp.from_bytes(best)
    return nlp, {"seconds": round(time.perf_counter() - started, 1), "steps": int(info["step"]) + 1,
                 "epochs": int(info["epoch"]), "best_step": best_step, "dev_f1": best_score, "stopped": stopped,
                 "train_sentences": len(train), "dev_sentences": len(dev)}


def spacy_pipeline(work: Path, scheme: str, settings: dict, max_minutes: float, overwrite: bool):
    """(nlp, training.json's record, whether it was trained now): W/peers/spacy/ when it was trained on W's splits as
    they are with these settings; else trained (refused without `overwrite` when one made otherwise is there)."""
    spacy = require_spacy()
    target = work / "peers" / "spacy"
    fingerprint = {"train_sha256": file_sha256(work / "data" / "train.jsonl"),
                   "dev_sha256": file_sha256(work / "data" / "dev.jsonl"), "scheme": scheme, "spacy": spacy.__version__,
                   "config": "init config --pipeline ner --optimize efficiency", "max_minutes": max_minutes,
                   **settings}
    if (target / TRAINING).exists():
        stored = read_json(target / TRAINING)
        if stored.get("fingerprint") == fingerprint:
            return load_spacy_pipeline(target), stored, False
        if not overwrite:
            old = stored.get("fingerprint", {})
            differ = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
            raise ConfigError(f"{target} was trained on other data or settings ({', '.join(differ)} differ); "
                              "--overwrite retrains it")
    train = read_jsonl(work / "data" / "train.jsonl")
    dev = read_jsonl(work / "data" / "dev.jsonl")
    if not train or not dev:
        raise ConfigError(f"--work_dir={work}: spaCy trains on labeled train and dev sentences; its data/ has "
                          f"{len(train)} and {len(dev)}")
    nlp, training = train_spacy(train, dev, scheme, settings, max_minutes)
    record = {"fingerprint": fingerprint, "training": training, "parameters": parameters(nlp)}
    with atomic_dir(target) as tmp:
        nlp.to_disk(tmp)
        atomic_write_json(tmp / TRAINING, record)
    return nlp, record, True


# --- scores: one scorer for every system -----------------------------------------------------------------------

Spans = List[Set[scoring.Span]]


def record_spans(records: Sequence[dict]) -> Spans:
    """Entity records ({"entities": [{"start", "end", "type"}]}, as the SavedModel and predict.py return them) as
    (start, end, type) character spans."""
    return [{(e["start"], e["end"], e["type"]) for e in r["entities"]} for r in records]


def spacy_spans(nlp, texts: Sequence[str], batch_size: int = 64) -> Spans:
    """spaCy's entities of `texts` (its own tokenizer) as (start, end, type) character spans."""
    return [{(e.start_char, e.end_char, e.label_) for e in doc.ents} for doc in nlp.pipe(texts, batch_size=batch_size)]


def score_systems(sentences: Sequence[Sentence], scheme: str,
                  systems: Dict[str, Callable[[List[str]], Spans]], seen: Optional[frozenset] = None) -> Dict[str, dict]:
    """Each system's character spans of the sentences' raw text scored against their tags' spans
    (data/scoring.char_spans) by one function, data/scoring.span_scores (overall, per type and per language); with
    `seen` (data/scoring.train_entities of the labels both were trained on), on seen and unseen names too
    ("seen_unseen": data/scoring.seen_scores)."""
    texts = [s.raw_text for s in sentences]
    gold = [scoring.char_spans(s, s.tags, scheme) for s in sentences]
    langs = [s.lang for s in sentences]
    scores = {}
    for name, system in systems.items():
        pred = system(texts)
        scores[name] = scoring.score_by_language(gold, pred, langs, scorer=scoring.span_scores)
        if seen is not None:
            scores[name]["seen_unseen"] = scoring.seen_scores(sentences, gold, pred, seen)
    return scores


# --- the benchmark ---------------------------------------------------------------------------------------------

def check_exports(work: Path) -> None:
    """W's exports that the benchmark serves, each made from W/student (not a student trained since), or refused in
    one line."""
    for export in (work / "export" / "ner", formats.portable_dir(work / "export", "ner", *ONNX_INT8)):
        try:
            made_from = exported_student(export) if export.exists() else None
        except ConfigError:   # no SavedModel version in W/export/ner: the student dir is served instead
            continue
        if made_from is not None:
            check_exported_from(export, work / "student")


def _students(work: Path):
    """(the SavedModel's serving function, its source, its row's format: saved_model, or student_dir when W has no
    SavedModel export; the int8 ONNX export's directory, exported now if missing)."""
    saved, student = work / "export" / "ner", work / "student"
    onnx_dir = formats.portable_dir(work / "export", "ner", *ONNX_INT8)
    try:
        serving_fn, source, fmt = load_serving_fn(saved), saved, "saved_model"
    except (ConfigError, FileNotFoundError):
        serving_fn, source, fmt = load_serving_fn(student), student, "student_dir"
    if not (onnx_dir / "export.json").exists():
        formats.export(student, work / "export", fmt=ONNX_INT8[0], quantize=ONNX_INT8[1])
    return serving_fn, str(source), fmt, onnx_dir


def _spacy_call(nlp) -> Callable:
    def call(batch):
        docs = [nlp(batch[0])] if len(batch) == 1 else nlp.pipe(list(batch), batch_size=len(batch))
        return [[(e.start_char, e.end_char, e.label_) for e in doc.ents] for doc in docs]
    return call


def measure(work_dir, settings: dict, max_minutes: float, queries: int, repeats: int, threads: int,
            overwrite: bool = False) -> dict:
    work = Path(work_dir)
    for step in ("data", "student"):
        if not (work / step / "step.json").exists():
            raise ConfigError(f"--work_dir={work_dir}: its {step} step is not done (bin/train makes it)")
    meta = read_config(work / "student")
    if meta.architecture != "bilstm" or meta.decoder == CLASSIFIER or not meta.scheme:
        raise ConfigError(f"--work_dir={work_dir}: bin/benchmark peers compares a BiLSTM NER student; its student is "
                          f"a {meta.architecture} {meta.decoder}")
    scheme = normalize_scheme(meta.scheme)
    test = read_jsonl(work / "data" / "test.jsonl")
    if not test or any(s.tags is None for s in test):
        raise ConfigError(f"--work_dir={work_dir}: its data/test.jsonl has no tagged sentences to score")
    check_exports(work)
    nlp, record, trained = spacy_pipeline(work, scheme, settings, max_minutes, overwrite)
    serving_fn, source, fmt, onnx_dir = _students(work)
    predictor = Predictor(onnx_dir, threads=threads)
    scores = score_systems(test, scheme, {
        "student": lambda texts: record_spans(predict(serving_fn, texts)),
        "student_onnx_int8": lambda texts: record_spans(predictor.predict(texts)),
        "spacy": lambda texts: spacy_spans(nlp, texts)},
        seen=scoring.train_entities(read_jsonl(work / "data" / "train.jsonl"), scheme))

    timed = test[:queries]
    texts = np.array([s.raw_text for s in timed], dtype=object)
    rows = [peers._row(SAVED_MODEL[:2] + (fmt,) + SAVED_MODEL[3:], lambda b, f=serving_fn: entities(f(text=tf.constant(list(b))), list(b)), texts,
                       repeats, peers.query_batches),
            peers._row(ONNX_ROW, lambda b: predictor.predict(list(b), batch_size=len(b)), texts, repeats,
                       peers.query_batches),
            peers._row(SPACY_ROW, _spacy_call(nlp), texts, repeats, peers.query_batches)]
    rows = peers.time_rows(rows)
    words = float(np.mean([len(s.tokens) for s in timed]))
    for row in rows:
        ms = row["latency_ms"]
        row["sentences_per_second_per_core"] = {b: 1000.0 / v / threads for b, v in ms.items()}
        row["words_per_second_per_core"] = {b: 1000.0 * words / v / threads for b, v in ms.items()}
    return {"scores": scores, "rows": rows, "threads": threads, "rounds": peers.ROUNDS, "repeats": repeats,
            "timed_sentences": len(timed), "words_per_sentence": words, "test_sentences": len(test),
            "scheme": scheme, "student": {"saved_model": source, "onnx_int8": str(onnx_dir),
                                          "parameters": predictor.meta.get("parameters")},
            "spacy": {**copy.deepcopy(record), "pipeline": str(work / "peers" / "spacy"), "trained_now": trained},
            "machine": machine(), "work_dir": str(work_dir)}


SYSTEMS = (("student", "student (SavedModel)"), ("student_onnx_int8", "student (ONNX int8, predict.py)"),
           ("spacy", "spaCy efficiency NER"))
LABELS = {"saved_model": "student SavedModel serving_default", "student_dir": "student (student dir, in memory)",
          "onnx": "student int8 ONNX predict.py", "efficiency_ner": "spaCy nlp(text) / nlp.pipe(b=32)"}


def format_lines(result: dict) -> List[str]:
    spacy, training = result["spacy"], result["spacy"]["training"]
    fp = spacy["fingerprint"]
    lines = [f"spaCy {fp['spacy']} efficiency NER ({spacy['parameters'] / 1e6:.2f}M parameters) "
             + ("trained" if spacy["trained_now"] else f"reused from {spacy['pipeline']}, trained")
             + f" on {training['train_sentences']:,} train sentences in {training['seconds']:.0f} s: "
             f"{training['steps']:,} steps, {training['epochs']} epoch(s), stopped by {training['stopped']}; "
             f"best dev F1 {training['dev_f1']:.4f} (step {training['best_step']}, spaCy's own scorer)",
             f"span F1 on the raw text of {result['test_sentences']:,} test sentences, each system through its own "
             "tokenizer, one scorer (data/scoring.span_scores: exact entity character spans):",
             f"  {'system':<34}{'P':>8}{'R':>8}{'F1':>8}   per type F1"]
    served = {"student_dir": "student (student dir, in memory)"}.get(result["rows"][0]["format"])
    for name, label in SYSTEMS:
        label = served if name == "student" and served else label
        a = result["scores"][name]["all"]
        types = " ".join(f"{kind} {s['f1']:.4f}" for kind, s in a["types"].items())
        lines.append(f"  {label:<34}{a['precision']:>8.4f}{a['recall']:>8.4f}{a['f1']:>8.4f}   {types}")
    seen = {label: result["scores"][name].get("seen_unseen") for name, label in SYSTEMS}
    for kind, gold, *cells in scoring.seen_unseen_rows(seen):   # none in a result from before they were scored
        lines.append(f"  {kind} names ({gold} gold entities), recall / precision: "
                     + ", ".join(f"{label} {cell}" for label, cell in zip(seen, cells)))
    cpu = result["machine"].get("cpu_model") or result["machine"]["processor"]
    lines += [f"speed: {result['timed_sentences']:,} test sentences ({result['words_per_sentence']:.1f} words each), "
              f"raw text in, entities out; {result['threads']} thread(s) each, rows interleaved in "
              f"{result['rounds']} rounds ({cpu}):",
              f"  {'system':<38}{'b1 ms':>9}{'b32 ms':>9}{'b1 words/s/core':>17}{'b32 words/s/core':>18}"]
    for row in result["rows"]:
        ms, rate = row["latency_ms"], row["words_per_second_per_core"]
        lines.append(f"  {LABELS[row['format']]:<38}{ms['batch1']:>9.3f}{ms['batch32']:>9.3f}"
                     f"{rate['batch1']:>17,.0f}{rate['batch32']:>18,.0f}")
    return lines


def run(repeats: int) -> List[str]:
    define_flags()
    require_spacy()   # before any work
    if not FLAGS.work_dir:
        raise ConfigError("--work_dir is required: a bin/train work dir with a BiLSTM NER student")
    if FLAGS.peers_threads < 1 or FLAGS.queries < 1 or FLAGS.spacy_max_minutes < 0 or FLAGS.spacy_max_steps < 0 \
            or FLAGS.spacy_patience < 0 or FLAGS.spacy_eval_frequency < 1:
        raise ConfigError(f"--peers_threads={FLAGS.peers_threads} --queries={FLAGS.queries} --spacy_max_minutes="
                          f"{FLAGS.spacy_max_minutes} --spacy_max_steps={FLAGS.spacy_max_steps} --spacy_patience="
                          f"{FLAGS.spacy_patience} --spacy_eval_frequency={FLAGS.spacy_eval_frequency}: expected "
                          "threads, queries and eval frequency >= 1, the rest >= 0")
    output = FLAGS.output_json or str(Path(FLAGS.work_dir) / RESULT)
    check_output_file(output, f"--output_json={FLAGS.output_json}" if FLAGS.output_json else output)
    threads = peers.set_tensorflow_threads(FLAGS.peers_threads)
    passes = repeats if FLAGS["repeats"].present else DEFAULT_REPEATS
    settings = {"lang": FLAGS.spacy_lang, "seed": FLAGS.spacy_seed, "max_steps": FLAGS.spacy_max_steps,
                "patience": FLAGS.spacy_patience, "eval_frequency": FLAGS.spacy_eval_frequency}
    result = measure(FLAGS.work_dir, settings, FLAGS.spacy_max_minutes, FLAGS.queries, passes, threads,
                     FLAGS.overwrite)
    atomic_write_json(output, result)
    return format_lines(result) + [f"results written to {output}"]
