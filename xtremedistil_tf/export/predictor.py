"""Entities from an exported model directory or a saved student, through the serving signature.

A saved student of a tokenizer family other than WordPiece (teachers/families.py: RoBERTa's byte-level BPE,
XLM-R's SentencePiece; their exports: docs/serving.md) is run by `TextTagger` instead: the same word
splitting (whitespace and punctuation, as BERT's pre-tokenizer), the teacher's own tokenizer in
Python, the same student graph (`NerServing.ids`), the same word decoding (crf/decoding.py) and
the same entity outputs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers FastBertNormalize etc., which the SavedModel uses)

from xtremedistil_tf.damage import REEXPORT, RETRAIN, reading
from xtremedistil_tf.data.alignment import TagVocab, length_batches
from xtremedistil_tf.data.schemes import tags_to_spans
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.wordsplit import split_words
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export.serving import EXPORT_META, STUDENT_IDENTITY, NerServing
from xtremedistil_tf.methods.student_run import load_student, served_windows
from xtremedistil_tf.io import read_json
from xtremedistil_tf.students.artifact import read_config, student_identity
from xtremedistil_tf.teachers.families import WORDPIECE


def saved_model_dir(path: Path) -> Path:
    """`path` itself when it holds saved_model.pb, else its highest numeric version (as TF Serving picks)."""
    if (path / "saved_model.pb").exists():
        return path
    versions = sorted((int(p.name), p) for p in path.glob("*") if p.is_dir() and p.name.isdigit())
    if not versions or not (versions[-1][1] / "saved_model.pb").exists():
        raise ConfigError(f"{path} is neither a saved student (student.json), a SavedModel nor a directory "
                          "of numeric SavedModel versions")
    return versions[-1][1]


def exported_student(export_dir) -> Optional[str]:
    """The `student_identity` of the student an export was made from (a SavedModel export <name>[/<version>], or an
    ONNX / TFLite export folder); None for an export written before exports recorded it."""
    export_dir = Path(export_dir)
    meta = export_dir / "export.json" if (export_dir / "export.json").exists() else \
        saved_model_dir(export_dir) / "assets.extra" / EXPORT_META
    return read_json(meta).get(STUDENT_IDENTITY) if meta.exists() else None


def check_exported_from(export_dir, student_dir) -> None:
    """Refuse, in one line, an export made from another student than `student_dir` (one trained since); an export
    that does not record its student passes."""
    made_from = exported_student(export_dir)
    if made_from is not None and made_from != student_identity(student_dir):
        raise ConfigError(f"{export_dir} was exported from another student than {student_dir} (trained since); "
                          f"export it again: bin/export ... --overwrite, or remove {export_dir}")


def load_serving_fn(path) -> Callable:
    """The `serving_default` function of `path`: fn(text=tf.string [B]) -> dict of tensors.

    A saved student dir is wrapped in memory (the same graph bin/export writes); an export
    dir <export_dir>/<name> or <export_dir>/<name>/<version> is loaded as a SavedModel.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if (path / "student.json").exists():
        with reading(path, RETRAIN):
            if read_config(path).tokenizer_family != WORDPIECE:
                return TextTagger(path)
            module = NerServing.from_student_dir(path)
        # A bound tf.function holds its module weakly: the closure keeps the module alive.
        return lambda text: module.serve(text)
    directory = saved_model_dir(path)
    with reading(directory, REEXPORT):
        return tf.saved_model.load(str(directory)).signatures["serving_default"]


class TextTagger:
    """`serving_default`'s entity outputs (num_entities, entity_start/end/type/text/confidence) of a saved
    student, computed with its tokenizer in Python: texts are split into words by the served word split
    (data/wordsplit.py; offsets in characters), the words encoded in the windows the export runs
    (student_run.served_windows), the windows run by `NerServing.ids` and each word's tag read at its first piece
    (softmax students: the module's WordDecoder, `decode`; CRF students: the CRF's Viterbi); spans are
    decoded leniently (schemes.tags_to_spans) with the mean tag probability of their words as
    confidence, as the exported graph does."""

    def __init__(self, student_dir, batch_size: int = 64, decode: str = "constrained"):
        model, self.config, self.tokenizer = load_student(student_dir)
        self.module = NerServing(model, self.config, vocab=None, decode=decode)
        self.tag_vocab = TagVocab(self.config.labels)
        self.batch_size = batch_size

    def __call__(self, text) -> Dict[str, tf.Tensor]:
        texts = [t.decode("utf-8", errors="replace") for t in np.asarray(text).reshape(-1).tolist()]
        words, labels, confidence = self.tag_words(texts)
        return _padded_entities([self._spans(*args) for args in zip(texts, words, labels, confidence)])

    def tag_words(self, texts: Sequence[str]):
        """Per text: its words [(word, (start, end))], one label per word, and each label's probability."""
        # The served word split (data/wordsplit.py) and windows (a BiLSTM reads each text whole), as the export.
        words = [[(t[a:b], (a, b)) for a, b in offsets] for t, offsets in zip(texts, split_words(texts))]
        windows = served_windows([Sentence([w for w, _ in ws]) for ws in words], self.tokenizer, self.tag_vocab,
                                 self.config.max_seq_length, self.config.architecture != "transformer")
        tags = np.zeros(windows.input_ids.shape, np.int32)
        probs = np.zeros(windows.input_ids.shape, np.float32)
        all_probs = np.zeros(windows.input_ids.shape + (len(self.config.tags),), np.float32)
        for idx, batch in length_batches(windows.input_ids, windows.attention_mask, self.batch_size, min_length=2,
                                         case_ids=windows.case_ids if self.module.case else None):
            out = self.module.ids(*batch.values())
            tags[idx, :out["tag_ids"].shape[1]] = out["tag_ids"].numpy()
            probs[idx, :out["tag_ids"].shape[1]] = out["tag_probs"].numpy()
            all_probs[idx, :out["tag_ids"].shape[1]] = out["probs"].numpy()
        if self.module.word_decoder is not None:
            labels, confidence = self.module.word_decoder.decode_windows(windows, all_probs)
            return words, labels, confidence
        labels = [["O"] * len(ws) for ws in words]
        confidence = [[0.0] * len(ws) for ws in words]
        for r, c in zip(*np.nonzero(windows.owner)):
            sentence, word = windows.sentence_index[r], windows.word_index[r, c]
            labels[sentence][word] = self.tag_vocab.word_label(int(tags[r, c]))
            confidence[sentence][word] = float(probs[r, c])
        return words, labels, confidence

    def _spans(self, text: str, words, labels, confidence) -> List[tuple]:
        """(start, end, type, text, confidence) of each entity of one text; `words`: (word, (start, end))."""
        spans = []
        for etype, first, end in tags_to_spans(labels, self.config.scheme):
            start, stop = words[first][1][0], words[end - 1][1][1]
            spans.append((start, stop, etype, text[start:stop], float(np.mean(confidence[first:end]))))
        return spans


def _padded_entities(found: List[List[tuple]]) -> Dict[str, tf.Tensor]:
    """Per text a list of (start, end, type, text, confidence) -> the padded outputs `entities` reads."""
    width = max([len(f) for f in found] + [0])

    def column(i, pad, dtype):
        rows = [[e[i] for e in f] + [pad] * (width - len(f)) for f in found]
        return tf.reshape(tf.constant(rows, dtype), [len(found), width])

    return {"num_entities": tf.constant([len(f) for f in found], tf.int32),
            "entity_start": column(0, -1, tf.int32), "entity_end": column(1, -1, tf.int32),
            "entity_type": column(2, "", tf.string), "entity_text": column(3, "", tf.string),
            "entity_confidence": column(4, 0.0, tf.float32)}


def entities(outputs: Dict[str, tf.Tensor], texts: Sequence[str]) -> List[dict]:
    """One {"text", "entities": [{"start", "end", "type", "text", "confidence"}]} per text.

    start/end are character offsets (Python str indices, end exclusive).
    """
    values = {k: v.numpy() for k, v in outputs.items()}
    records = []
    for i, text in enumerate(texts):
        found = []
        for j in range(int(values["num_entities"][i])):
            found.append({"start": int(values["entity_start"][i, j]), "end": int(values["entity_end"][i, j]),
                          "type": values["entity_type"][i, j].decode("utf-8"),
                          "text": values["entity_text"][i, j].decode("utf-8", errors="replace"),
                          "confidence": round(float(values["entity_confidence"][i, j]), 6)})
        records.append({"text": text, "entities": found})
    return records


def predict(serving_fn: Callable, texts: Sequence[str], batch_size: int = 64) -> List[dict]:
    """Entities of `texts`, `batch_size` texts per call."""
    records = []
    for start in range(0, len(texts), batch_size):
        batch = list(texts[start:start + batch_size])
        records.extend(entities(serving_fn(text=tf.constant(batch, tf.string)), batch))
    return records


def as_text(record: dict) -> str:
    """A record for reading: the text, then `  TYPE  entity text  (confidence)` per entity."""
    entities = [f"  {e['type']:<12s} {e['text']}  ({e['confidence']:.2f})" for e in record["entities"]]
    return "\n".join([record["text"]] + (entities or ["  (no entities)"]))
