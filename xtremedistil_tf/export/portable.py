"""Entities from an ONNX or TFLite student export (`bin/export --format=onnx|tflite`).

Shipped beside the model as `predict.py`; it needs only numpy, `tokenizers` and the runtime:
onnxruntime for `model.onnx`, ai-edge-litert for `model.tflite` (tf.lite.Interpreter if LiteRT is
absent). Nothing of xtremedistil_tf or TensorFlow is imported.

    python predict.py <export dir> < lines.txt        # one JSON line per input line
    from predict import load; load("<export dir>").predict(["john lives in paris"])

It reproduces the SavedModel's `serving_default` (docs/serving.md): WordPiece pieces with character
offsets (`tokenizer.json`, the student's served vocabulary; for a student of a RoBERTa or XLM-R teacher,
`words.json` splits the text into words and the teacher's `tokenizer.json` encodes each word alone), windows wrapped in [CLS]/[SEP], the
model on the windows, a word's tag read at its first piece, lenient span decoding, and the same
{"start", "end", "type", "text", "confidence"} records as `bin/predict` (offsets are Python str
indices, end exclusive; `main` reads bytes and replaces invalid UTF-8 as `read_lines` says, so the
offsets index the same text as the SavedModel's). `export.json` holds the tag tables, the window lengths and, for CRF
students, the transitions: their graph returns the CRF potentials and `viterbi`/`marginals` below
decode them in NumPy. Softmax students' word tags are decoded from the probabilities at the words'
first pieces by `decode_words` (export.json "decode": "constrained", the best sequence the tag
scheme allows, or "argmax"), the steps of xtremedistil_tf/crf/decoding.py in NumPy. A student that reads word
shapes (export.json "case") gets each piece's word shape from the text by `shapes.py`, shipped beside this file.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import itertools
import json
import operator
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
from tokenizers import Tokenizer, normalizers, pre_tokenizers


def _module_file(name: str, in_package: str):
    """A standard-library module of the package read as a file: `name` beside this one, where export.formats ships it
    with predict.py, else the package's `in_package` (a path under xtremedistil_tf/); None if neither is there. Not
    imported through the package, whose import loads TensorFlow."""
    here = Path(__file__).resolve()
    for path in (here.with_name(name), here.parent.parent / in_package):
        if path.is_file():
            spec = importlib.util.spec_from_file_location(f"_xtremedistil_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


# Word shapes (data/shapes.py), shipped for a student that reads them; the text reader (textfile.py), for `main`.
_SHAPES = _module_file("shapes.py", "data/shapes.py")
_TEXTFILE = _module_file("textfile.py", "textfile.py")
PAD_SHAPE, word_shape = (_SHAPES.PAD, _SHAPES.word_shape) if _SHAPES else (None, None)

# Prefix codes of the word labels in export.json "prefixes" (I- and M- are both "inside").
OUTSIDE, BEGIN, INSIDE, END, SINGLE = 0, 1, 2, 3, 4
# The score of a forbidden move or boundary tag (xtremedistil_tf/crf/ops.py FORBIDDEN).
FORBIDDEN = -1e4


def viterbi(potentials: np.ndarray, transitions: np.ndarray) -> np.ndarray:
    """The best tag sequence [n] of one window's CRF potentials [n, N] under transitions [N, N]
    (transitions[i, j]: score of tag i followed by tag j); ties go to the lower tag id."""
    if len(potentials) == 0:
        return np.zeros(0, np.int64)
    score, backpointers, best = potentials[0], [], np.maximum.reduce
    for emission in potentials[1:]:
        candidates = score[:, None] + transitions
        backpointers.append(candidates.argmax(0))
        score = best(candidates, 0) + emission
    path = [int(score.argmax())]
    for pointers in reversed(np.array(backpointers).tolist()):
        path.append(pointers[path[-1]])
    return np.array(path[::-1])


def viterbi_batch(potentials: np.ndarray, lengths: np.ndarray, transitions: np.ndarray) -> np.ndarray:
    """`viterbi` of many sequences at once: potentials [B, T, N] of which row b's first lengths[b] are its sequence;
    the paths [B, T] (each row's path in its first lengths[b]; the rest is to be ignored). The same sums and
    tie-breaking as `viterbi`, row by row: a row past its length keeps its score and points each tag to itself."""
    count, steps, _ = potentials.shape
    paths = np.zeros((count, max(steps, 1)), np.int64)
    if count == 0 or steps == 0:
        return paths[:, :steps]
    lengths = np.asarray(lengths)
    score, keep = potentials[:, 0], np.arange(transitions.shape[0])
    backpointers = np.empty((steps - 1, count, transitions.shape[0]), np.int64)
    shortest = int(lengths.min())
    for t in range(1, steps):
        candidates = score[:, :, None] + transitions
        if t < shortest:   # every row is still in its sequence
            backpointers[t - 1] = candidates.argmax(1)
            score = np.maximum.reduce(candidates, 1) + potentials[:, t]
            continue
        live = (t < lengths)[:, None]
        backpointers[t - 1] = np.where(live, candidates.argmax(1), keep)
        score = np.where(live, np.maximum.reduce(candidates, 1) + potentials[:, t], score)
    paths[:, -1] = score.argmax(1)
    rows = np.arange(count)
    for t in range(steps - 1, 0, -1):
        paths[:, t - 1] = backpointers[t - 1][rows, paths[:, t]]
    return paths


def decode_words(probs: np.ndarray, meta: dict):
    """Word labels [n] and their scores [n] from the probabilities [n, tags] at n words' first pieces,
    as xtremedistil_tf/crf/decoding.py's WordDecoder: each label scores the highest probability
    among the tags that read as it (export.json "label_of_tag"; markers read as O); "constrained"
    takes the Viterbi path over their logs under "word_transitions" (0 or -1e4) with the tags that
    may not start ("word_start") or end ("word_end") a text forbidden (the argmax where it is already
    valid), "argmax" each word's best."""
    return decode_batch(probs, np.array([len(probs)]), meta)


def decode_batch(probs: np.ndarray, lengths: Sequence[int], meta: dict):
    """`decode_words` of many texts at once: probs [W, tags] of all their words in order, lengths [K] words per text
    (0 for a text without words); labels [W] and scores [W] (`WordDecoding`)."""
    return WordDecoding(meta)(probs, lengths)


class WordDecoding:
    """`decode_batch` with export.json's tables read once. The greedy path is checked for all texts together, and
    where it breaks the scheme the Viterbi path is found (`_repair`), all texts at once."""

    # Words before a broken move searched with it (`_repair`): the stretch's first label must follow the word before
    # it, which fails more often the closer the stretch starts to the move (then the whole text is searched).
    LOOKBACK = 2

    def __init__(self, meta: dict):
        num_labels = len(meta["word_start"])
        # Each label's tags (-1 in label_of_tag: a tag of no label): its first tag's column (a label of no tag reads
        # a column of zeros, `num_tags`), then its other tags (IOB2's markers all read as O).
        label_of_tag = np.array(meta["label_of_tag"])
        self.num_tags = len(label_of_tag)
        tags_of = [np.flatnonzero(label_of_tag == label) for label in range(num_labels)]
        self.first_tag = np.array([tags[0] if len(tags) else self.num_tags for tags in tags_of])
        self.more_tags = [(label, tags[1:]) for label, tags in enumerate(tags_of) if len(tags) > 1]
        self.argmax = meta["decode"] == "argmax"
        self.not_start = np.flatnonzero(~np.array(meta["word_start"]))[None, :]
        self.not_end = np.flatnonzero(~np.array(meta["word_end"]))[None, :]
        self.transitions = np.array(meta["word_transitions"], np.float32)
        # Labels that may follow any label (IOB2's O and B-): a stretch to search ends at one (`_repair`). The
        # moves allowed, with a last row for a text's start (any label: the start's own are forbidden potentials).
        self.free_labels = (self.transitions == 0).all(0)
        self.may_follow = np.vstack([self.transitions == 0, np.ones(num_labels, bool)])
        self.any_label = num_labels
        self.tiny = np.finfo(np.float32).tiny

    def __call__(self, probs: np.ndarray, lengths: Sequence[int]):
        lengths = np.asarray(lengths, np.int64)
        probs = np.asarray(probs, np.float32).reshape(len(probs), self.num_tags)
        scores = self.label_scores(probs)
        if self.argmax or len(scores) == 0:
            labels = scores.argmax(1)
            return labels, scores[np.arange(len(labels)), labels]
        bounds = np.cumsum(lengths)
        firsts = bounds - lengths
        nonempty = lengths > 0
        ends = bounds[nonempty] - 1
        potentials = np.log(np.maximum(scores, self.tiny))
        potentials[firsts[nonempty, None], self.not_start] = FORBIDDEN
        potentials[ends[:, None], self.not_end] = FORBIDDEN
        labels = potentials.argmax(1)
        # A valid argmax path is the best path (no transition scores above 0), as WordDecoder.best_valid.
        broken = self.transitions[labels[:-1], labels[1:]] != 0
        broken[ends[:-1]] = False   # the move from a text's last word to the next text's first
        if broken.any():
            self._repair(labels, potentials, broken, lengths, firsts)
        return labels, scores[np.arange(len(labels)), labels]

    def _repair(self, labels: np.ndarray, potentials: np.ndarray, broken: np.ndarray, lengths: np.ndarray,
                firsts: np.ndarray) -> None:
        """Set the Viterbi path in `labels` (the greedy path, in place) of each text with a `broken` move.

        Only stretches around the broken moves are searched. The transitions are 0 or forbidden, so the greedy
        path, which takes each word's best label, is the best path wherever it is valid. Each broken move (words k
        and k + 1) gets the stretch from LOOKBACK words before k to the first word after k + 1 whose greedy label may
        follow any label (`free_labels`; or the text's end), stretches that overlap or touch joined. The greedy path
        with each stretch replaced by its own Viterbi path (free at both ends) scores at least as much as any valid
        path: each stretch and each greedy part is the best of its words. It is valid where each stretch's first
        label may follow the greedy word before it (the move out of a stretch always is): then it is the Viterbi
        path, ties aside. A text where that fails is searched whole."""
        text_of_word = np.repeat(np.arange(len(lengths)), lengths)
        moves = np.flatnonzero(broken)
        text_start = firsts[text_of_word[moves]]
        text_end = text_start + lengths[text_of_word[moves]]
        # The first word at or after each word whose greedy label may follow any label.
        after = np.where(self.free_labels[labels], np.arange(len(labels)), len(labels))
        after = np.minimum.accumulate(after[::-1])[::-1]
        start = np.maximum(moves - self.LOOKBACK, text_start)
        stop = np.minimum(after[moves + 1], text_end)   # a broken move's second word is in its text
        # `stop` never falls from one move to the next: a stretch joins the one before where it starts inside it or
        # right after it (its search may change the word after the one before, which that one's check assumed).
        joins = np.flatnonzero(np.append(True, start[1:] > stop[:-1]))
        start, stop = start[joins], np.append(stop[joins[1:] - 1], stop[-1])
        paths = self._viterbi_stretches(potentials, start, stop - start)
        entered = np.where(start > firsts[text_of_word[start]], labels[start - 1], self.any_label)
        fits = self.may_follow[entered, paths[:, 0]]
        self._place(labels, paths, start, stop - start)
        if not fits.all():
            texts = np.unique(text_of_word[start[~fits]])
            first, n = firsts[texts], lengths[texts]
            self._place(labels, self._viterbi_stretches(potentials, first, n), first, n)

    @staticmethod
    def _place(labels: np.ndarray, paths: np.ndarray, start: np.ndarray, length: np.ndarray) -> None:
        """Write each row of `paths` (its first `length` entries) into `labels` from `start`."""
        if len(start):
            inside = np.arange(paths.shape[1]) < length[:, None]
            labels[(start[:, None] + np.arange(paths.shape[1]))[inside]] = paths[inside]

    def _viterbi_stretches(self, potentials: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
        """The Viterbi paths [K, max length] of the K stretches of `potentials` [W, labels], each `length` words
        from `start` (each row's first `length` entries are its path)."""
        if len(start) == 1:   # one stretch: the plain loop is quicker
            return viterbi(potentials[start[0]:start[0] + length[0]], self.transitions)[None]
        index = start[:, None] + np.minimum(np.arange(length.max()), length[:, None] - 1)
        return viterbi_batch(potentials[index], length, self.transitions)

    def label_scores(self, probs: np.ndarray) -> np.ndarray:
        """[W, labels]: each label's highest probability among its tags (0 for a label of no tag), from probs
        [W, tags]; the same floats as (probs[:, :, None] * fold).max(1), without its [W, tags, labels] product."""
        if (self.first_tag == self.num_tags).any():
            probs = np.concatenate([probs, np.zeros((len(probs), 1), np.float32)], 1)
        scores = probs[:, self.first_tag]
        for label, tags in self.more_tags:
            scores[:, label] = np.maximum(scores[:, label], probs[:, tags].max(1))
        return scores


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = x.max(axis=axis, keepdims=True)
    return np.squeeze(top, axis) + np.log(np.exp(x - top).sum(axis=axis))


def marginals(potentials: np.ndarray, transitions: np.ndarray) -> np.ndarray:
    """P(tag j at position t) [n, N] under the CRF (forward-backward in log space)."""
    n = len(potentials)
    if n == 0:
        return np.zeros_like(potentials)
    alpha, beta = np.empty_like(potentials), np.zeros_like(potentials)
    alpha[0] = potentials[0]
    for t in range(1, n):
        alpha[t] = _logsumexp(alpha[t - 1][:, None] + transitions, 0) + potentials[t]
    for t in range(n - 2, -1, -1):
        beta[t] = _logsumexp(transitions + (potentials[t + 1] + beta[t + 1])[None, :], 1)
    log_z = _logsumexp(alpha[-1], 0)
    return np.exp(alpha + beta - log_z)


class DamagedModel(Exception):
    """The export's model file is missing, differs from what export.json recorded of it, or its runtime cannot
    load it (a copy cut short, a full disk): `str()` is "<file>: <what is wrong>"; the caller says what to do."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def sha256_of(path) -> str:
    # io.file_sha256's twin: this file ships alone as predict.py and imports nothing of the package.
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_file_problem(path: Path, record: Optional[dict]) -> Optional[str]:
    """What is wrong with the model file against export.json's record of it ({"bytes", "sha256"}, written with
    it; exports older than the record are not checked), or None. A runtime handed a file cut short can crash the
    process (TFLite's interpreter), so this runs first."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if record is None:
        return "empty (0 bytes)" if size == 0 else None
    if size != record["bytes"]:
        return f"cut short or damaged ({size} bytes; export.json records {record['bytes']})"
    if sha256_of(path) != record["sha256"]:
        return f"damaged (its SHA-256 differs from the one export.json records; {size} bytes)"
    return None


def check_model_file(path: Path, record: Optional[dict]) -> None:
    problem = model_file_problem(path, record)
    if problem is not None:
        raise DamagedModel(path, problem)


# The files only an ONNX or TFLite export folder has: a folder with one of them but no export.json is a damaged export.
PORTABLE_FILES = ("model.onnx", "model.tflite", "predict.py")


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def read_meta(directory) -> dict:
    """export.json of an export folder; DamagedModel when it is missing, cut short or not an export's record."""
    path = Path(directory) / "export.json"
    if not path.is_file():
        raise DamagedModel(path, "missing")
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as error:   # JSONDecodeError and UnicodeDecodeError both are
        raise DamagedModel(path, f"damaged or cut short ({_first_line(error)})") from None
    if not isinstance(meta, dict) or "format" not in meta:
        raise DamagedModel(path, "damaged (not an export's record: no format)")
    return meta


def read_tokenizer(path: Path) -> Tokenizer:
    """A tokenizer.json (or words.json) of the export; DamagedModel when it is missing or does not load."""
    if not path.is_file():
        raise DamagedModel(path, "missing")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # noqa: BLE001  (the tokenizers library's own error for a file it cannot parse)
        raise DamagedModel(path, f"damaged or cut short ({_first_line(error)})") from None


class _OnnxRunner:
    def __init__(self, path: Path, threads: Optional[int]):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.names = [output.name for output in self.session.get_outputs()]

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 case_ids: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if case_ids is not None:
            inputs["case_ids"] = case_ids
        return dict(zip(self.names, self.session.run(None, inputs)))


class _TfliteRunner:
    """One signature `ids_<L>` per fixed window length L: a batch runs at the shortest L that holds it."""

    def __init__(self, path: Path, lengths: Sequence[int], threads: Optional[int]):
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:  # LiteRT not installed: TensorFlow's own interpreter reads the same file
            import tensorflow as tf  # noqa: PLC0415  (this file ships alone as predict.py; TensorFlow is optional)

            Interpreter = tf.lite.Interpreter
        self.interpreter = Interpreter(model_path=str(path), num_threads=threads or os.cpu_count())
        self.lengths = sorted(lengths)
        self.runners = {n: self.interpreter.get_signature_runner(f"ids_{n}") for n in self.lengths}

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 case_ids: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
        width = input_ids.shape[1]
        length = next(n for n in self.lengths if n >= width)
        pad = [(0, 0), (0, length - width)]
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if case_ids is not None:
            inputs["case_ids"] = case_ids
        outputs = self.runners[length](**{name: np.pad(value, pad) for name, value in inputs.items()})
        return {name: value[:, :width] for name, value in outputs.items()}


class Tokenization:
    """The pieces predict.py gives text: an export directory's tokenizer.json (and words.json) as export.json's `meta`
    names them."""

    def __init__(self, directory, meta: dict):
        directory = Path(directory)
        self.tokenizer = read_tokenizer(directory / "tokenizer.json")
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        vocab = self.tokenizer.get_vocab()
        # A student of a teacher without WordPiece (RoBERTa, XLM-R): words.json splits text into words, which the
        # teacher's tokenizer.json encodes one by one, as the student was trained.
        self.words = read_tokenizer(directory / meta["words"]) if meta.get("words") else None
        if self.words is not None:
            special = meta["special_ids"]
            self.cls, self.sep, self.pad, self.unk = (special[k] for k in ("cls", "sep", "pad", "unk"))
        else:
            self.continuation = np.zeros(len(vocab), bool)
            for piece, index in vocab.items():
                self.continuation[index] = piece.startswith("##")
            # export.json names the specials' ids (BERT's [CLS]..., MPNet's <s>...); older exports: BERT's names.
            special = meta.get("special_ids") or {k: vocab[p] for k, p in (("cls", "[CLS]"), ("sep", "[SEP]"),
                                                                            ("pad", "[PAD]"))}
            self.cls, self.sep, self.pad = (special[k] for k in ("cls", "sep", "pad"))
        # Each space-separated chunk's pieces, remembered (`encode`), where that gives the whole text's; with
        # `chunk_shapes` (a student that reads word shapes), each piece's word shape too.
        self._chunks: Optional[Dict[str, tuple]] = {} if self.words is None and splits_at_spaces(
            self.tokenizer) else None
        self.chunk_shapes = False

    def encode(self, texts: Sequence[str]):
        """The WordPieces of `texts`: pieces per text [K], all their ids in order [P] and each one's character
        offsets [P, 2] (start, end in its text), int64, as the tokenizer's `encode_batch` gives them, and with
        `chunk_shapes` each piece's word shape [P] (`piece_shapes`; else None). Where that is the same
        (`splits_at_spaces`), each chunk of a text between single spaces is encoded once and remembered (at most
        2**16 chunks of at most 64 characters): news text repeats most of its words, and the tokenizer cost more
        than the student."""
        cache = self._chunks
        if cache is None:
            encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
            ids = [e.ids for e in encodings]
            counts = np.fromiter(map(len, ids), np.int64, len(ids))
            flat_ids = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(counts.sum()))
            offsets = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(
                e.offsets for e in encodings)), np.int64, 2 * len(flat_ids)).reshape(-1, 2)
            return counts, flat_ids, offsets, None
        splits = [text.split(" ") for text in texts]
        chunks = list(itertools.chain.from_iterable(splits))
        entries = list(map(cache.get, chunks))
        if None in entries:
            if len(cache) > 1 << 16:
                cache.clear()
            missing = list(set(chunks).difference(cache))
            new = {chunk: (len(e.ids), e.ids, tuple(itertools.chain.from_iterable(e.offsets)),
                           self._chunk_shapes(chunk, e) if self.chunk_shapes else ())
                   for chunk, e in zip(missing, self.tokenizer.encode_batch(missing, add_special_tokens=False))}
            # Words, not whole texts of a script without spaces: those are encoded each time.
            cache.update((chunk, entry) for chunk, entry in new.items() if len(chunk) <= 64)
            entries = [cache.get(chunk) or new[chunk] for chunk in chunks]
        per_chunk = np.fromiter(map(operator.itemgetter(0), entries), np.int64, len(entries))
        total = int(per_chunk.sum())
        flat_ids = np.fromiter(itertools.chain.from_iterable(map(operator.itemgetter(1), entries)), np.int64, total)
        offsets = np.fromiter(itertools.chain.from_iterable(map(operator.itemgetter(2), entries)), np.int64,
                              2 * total).reshape(-1, 2)
        # A chunk starts one character after the one before it ends; every text has at least one chunk ("").
        widths = np.fromiter(map(len, chunks), np.int64, len(chunks)) + 1
        starts = np.cumsum(widths) - widths
        chunks_per_text = np.fromiter(map(len, splits), np.int64, len(splits))
        first_chunks = np.cumsum(chunks_per_text) - chunks_per_text
        starts -= np.repeat(starts[first_chunks], chunks_per_text)
        offsets += np.repeat(starts, per_chunk)[:, None]
        counts = np.add.reduceat(per_chunk, first_chunks) if len(texts) else np.zeros(0, np.int64)
        shapes = np.fromiter(itertools.chain.from_iterable(map(operator.itemgetter(3), entries)), np.int32,
                             total) if self.chunk_shapes else None
        return counts, flat_ids, offsets, shapes

    def _chunk_shapes(self, chunk: str, encoding) -> tuple:
        """The word shape of each piece of `chunk` (`encoding`, its pieces): a chunk's words are its text's."""
        words = word_spans(encoding.ids, encoding.offsets, self.continuation)
        return tuple(piece_shapes(chunk, words, len(encoding.ids)))

    def pieces(self, texts: Sequence[str]) -> List[tuple]:
        """Per text: its piece ids and its words, (first piece, start char, end char) each."""
        if self.words is None:
            encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
            return [(e.ids, word_spans(e.ids, e.offsets, self.continuation)) for e in encodings]
        found = []
        for text, split in zip(texts, self.words.encode_batch(list(texts), add_special_tokens=False)):
            words = [text[start:end] for start, end in split.offsets]
            per_word = [[] for _ in words]
            if words:
                encoding = self.tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False)
                for piece, word in zip(encoding.ids, encoding.word_ids):
                    per_word[word].append(piece)
            ids, spans = [], []
            for pieces, (start, end) in zip(per_word, split.offsets):
                spans.append((len(ids), start, end))
                ids.extend(pieces or [self.unk])  # a word of no pieces is one unknown, as in training
            found.append((ids, spans))
        return found


def splits_at_spaces(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` encodes a text as the chunks between its spaces one by one, offsets shifted: BERT's
    normalizer (each character on its own) and pre-tokenizer (a word never spans a space), and no added token that
    holds a space or strips the spaces beside it (bin/export's tokenizer.json: export.formats.write_tokenizer)."""
    added = tokenizer.get_added_tokens_decoder().values()
    return (isinstance(tokenizer.normalizer, normalizers.BertNormalizer)
            and isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
            and not any(t.lstrip or t.rstrip or any(c.isspace() for c in t.content) for t in added))


class Predictor(Tokenization):
    """An export directory: model file, tokenizer.json, export.json."""

    def __init__(self, directory, threads: Optional[int] = None):
        directory = Path(directory)
        self.meta = meta = read_meta(directory)
        super().__init__(directory, meta)
        # Pieces per window without [CLS]/[SEP]; None: each text is one window, whatever its length.
        self.budget = meta["window"] - 2 if meta["window"] else None
        self.transitions = np.array(meta["transitions"], np.float32) if meta["transitions"] else None
        path = directory / meta["model"]
        if meta["format"] not in ("onnx", "tflite"):
            raise ValueError(f"{directory}/export.json: unknown format {meta['format']!r}")
        check_model_file(path, meta.get("model_file"))
        # Whether the student reads each piece's word shape (export.json "case"; exports before it: no).
        self.case = bool(meta.get("case"))
        self.chunk_shapes = self.case and self._chunks is not None
        self._shapes: Dict[str, int] = {}   # word_shapes' memory
        self.prefixes, self.type_ids = np.array(meta["prefixes"]), np.array(meta["type_ids"])
        # Softmax students decode words from all tags' probabilities (exports before decode_words: the piece tags).
        self.word_decoding = WordDecoding(meta) if self.transitions is None and "label_of_tag" in meta else None
        self.inside_or_end, self.begin_or_inside = (np.isin(self.prefixes, codes) for codes in ((INSIDE, END),
                                                                                               (BEGIN, INSIDE)))
        if self.case and word_shape is None:
            raise DamagedModel(directory / "shapes.py", "missing (the student reads word shapes by it); copy the whole "
                                                        "export folder")
        try:
            if meta["format"] == "onnx":
                self.run = _OnnxRunner(path, threads)
            else:
                self.run = _TfliteRunner(path, meta["lengths"], threads)
        except Exception as e:  # the runtime's own error for a model file it cannot read
            raise DamagedModel(path, f"{meta['format']} runtime cannot load it ({path.stat().st_size} bytes: "
                                     f"{_first_line(e)})") from e

    def _layout(self, texts: Sequence[str]) -> "_Batch":
        """`texts` as one model batch (`_Batch`): their pieces, words and windows, in NumPy."""
        texts = list(texts)
        if self.words is None:
            counts, flat_ids, offsets, shapes = self.encode(texts)
            piece_text = np.repeat(np.arange(len(texts)), counts)
            position = np.arange(len(flat_ids)) - (np.cumsum(counts) - counts)[piece_text]
            # word_spans' rule: a word starts at each piece that is not a "##" continuation (and at a text's first);
            # it ends where the latest-ending of its pieces ends.
            firsts = np.flatnonzero((position == 0) | ~self.continuation[flat_ids])
            starts = offsets[firsts, 0]
            ends = np.maximum.reduceat(offsets[:, 1], firsts) if len(firsts) else np.zeros(0, np.int64)
            words_per_text = np.bincount(piece_text[firsts], minlength=len(texts))
        else:   # words.json's words, each encoded alone
            found = self.pieces(texts)
            counts = np.array([len(i) for i, _ in found], np.int64)
            flat_ids = np.fromiter(itertools.chain.from_iterable(i for i, _ in found), np.int64, int(counts.sum()))
            words = np.array([w for _, ws in found for w in ws], np.int64).reshape(-1, 3)
            words_per_text = np.array([len(ws) for _, ws in found], np.int64)
            word_text = np.repeat(np.arange(len(found)), words_per_text)
            firsts = words[:, 0] + (np.cumsum(counts) - counts)[word_text]
            starts, ends = words[:, 1], words[:, 2]
            piece_text = np.repeat(np.arange(len(found)), counts)
            position = np.arange(len(flat_ids)) - (np.cumsum(counts) - counts)[piece_text]
            shapes = None
        return _Batch(self, texts, counts, flat_ids, firsts, starts, ends, words_per_text, piece_text, position,
                      shapes)

    def windows(self, texts: Sequence[str]):
        """(input_ids [C, L] int32, attention_mask [C, L] int32, per text: (pieces, words, first window), and for a
        student that reads them the pieces' word shapes [C, L] int32 (`word_shape` of each piece's word; else None))."""
        batch = self._layout(texts)
        piece_bounds = np.cumsum(batch.counts).tolist()
        word_bounds = np.cumsum(batch.words_per_text).tolist()
        in_text = batch.firsts - np.repeat(np.cumsum(batch.counts) - batch.counts, batch.words_per_text)
        words = list(zip(in_text.tolist(), batch.starts.tolist(), batch.ends.tolist()))
        pieces = [(batch.flat_ids[p0:p1], words[w0:w1], first) for p0, p1, w0, w1, first in
                  zip([0] + piece_bounds[:-1], piece_bounds, [0] + word_bounds[:-1], word_bounds,
                      batch.first_window.tolist())]
        return batch.input_ids, batch.attention_mask, pieces, batch.case_ids

    def ids(self, input_ids: np.ndarray, attention_mask: np.ndarray, case_ids: Optional[np.ndarray] = None):
        """Piece tags of windows [C, L] (with [CLS]/[SEP]; and their word shapes, for a student that reads them):
        (tag_ids int32, tag_probs float32), the SavedModel `ids` signature's; [PAD] and 0 where the mask is 0. CRF
        students: NumPy Viterbi, the probability is the CRF marginal of the chosen tag."""
        case_ids = None if case_ids is None else case_ids.astype(np.int32)
        return self._piece_tags(self.run(input_ids.astype(np.int32), attention_mask.astype(np.int32), case_ids),
                                attention_mask)

    def _piece_tags(self, outputs: Dict[str, np.ndarray], attention_mask: np.ndarray):
        """`ids` from the model's outputs."""
        if self.transitions is None:
            return outputs["tag_ids"], outputs["tag_probs"]
        tag_ids = np.full(attention_mask.shape, self.meta["pad_tag"], np.int32)
        tag_probs = np.zeros(attention_mask.shape, np.float32)
        lengths = attention_mask.sum(1)
        paths = viterbi_batch(outputs["potentials"], lengths, self.transitions)
        for row, (potentials, n) in enumerate(zip(outputs["potentials"], lengths)):
            tag_ids[row, :n] = paths[row, :n]
            tag_probs[row, :n] = marginals(potentials[:n], self.transitions)[np.arange(n), paths[row, :n]]
        return tag_ids, tag_probs

    def word_shapes(self, words: Sequence[str]) -> List[int]:
        """`word_shape` of each of `words`, remembered (a shape depends on the word alone; at most 2**16 of them)."""
        cache = self._shapes
        if len(cache) > 1 << 16:
            cache.clear()
        missing = [w for w in set(words) if w not in cache]
        cache.update(zip(missing, map(word_shape, missing)))
        return [cache[w] for w in words]

    def predict(self, texts: Sequence[str], batch_size: int = 64) -> List[dict]:
        """One {"text", "entities": [{"start", "end", "type", "text", "confidence"}]} per text; the texts run through
        the model `batch_size` at a time, in their order."""
        records = []
        for start in range(0, len(texts), batch_size):
            batch = self._layout(texts[start:start + batch_size])
            outputs = self.run(batch.input_ids, batch.attention_mask, batch.case_ids)
            records.extend(self._records(batch, outputs))
        return records

    def _records(self, batch: "_Batch", outputs: Dict[str, np.ndarray]) -> List[dict]:
        """The records of a batch's texts from the model's outputs: each word's tag is read at its first piece,
        decoded for all words of the batch at once (`decode_batch`; exports before decode_words: the piece tags),
        and spans of words as the lenient span decoding of docs/serving.md gives them."""
        meta = self.meta
        tag_ids, tag_probs = self._piece_tags(outputs, batch.attention_mask)
        rows, cols = batch.word_rows, batch.word_cols
        if self.word_decoding is not None:
            labels, probs = self.word_decoding(outputs["probs"][rows, cols], batch.words_per_text)
        else:
            labels, probs = tag_ids[rows, cols], tag_probs[rows, cols]
        probs = np.asarray(probs, np.float32)
        type_id = self.type_ids[labels]
        # Lenient spans: a word continues the span before it where it is inside or last (I-, E-) of the same type
        # after a first or inside word (B-, I-) of the same text; any other word not outside starts a span.
        continues = np.zeros(len(labels), bool)
        if len(labels) > 1:
            continues[1:] = (self.inside_or_end[labels[1:]] & self.begin_or_inside[labels[:-1]]
                             & (type_id[1:] == type_id[:-1]))
        continues[batch.text_first_words] = False
        begins = (self.prefixes[labels] != OUTSIDE) & ~continues
        ends_span = (begins | continues) & ~np.append(continues[1:], False)
        first, last = np.flatnonzero(begins), np.flatnonzero(ends_span)
        confidence = span_means(probs, first, last)
        records = [{"text": text, "entities": []} for text in batch.texts]
        types, starts, ends = meta["types"], batch.starts, batch.ends
        for text_index, start, end, type_index, mean in zip(batch.word_text[first].tolist(), starts[first].tolist(),
                                                            ends[last].tolist(), type_id[first].tolist(),
                                                            confidence.tolist()):
            text = batch.texts[text_index]
            records[text_index]["entities"].append({"start": start, "end": end, "type": types[type_index],
                                                    "text": text[start:end], "confidence": round(mean, 6)})
        return records


class _Batch:
    """Texts as one model batch: `counts` [K] pieces per text, `flat_ids` [P] all their pieces in order, per word
    (W in all, in order) the index in `flat_ids` of its first piece (`firsts`) and its start and end characters;
    `words_per_text` [K]. Built from them: the windows (input_ids, attention_mask, case_ids: `Predictor.windows`),
    `first_window` [K] of each text, and each word's text (`word_text`) and first piece's place in the windows
    (`word_rows`, `word_cols`); `text_first_words`: the first word of each text that has words."""

    def __init__(self, predictor: "Predictor", texts: List[str], counts, flat_ids, firsts, starts, ends,
                 words_per_text, piece_text, position, piece_shapes: Optional[np.ndarray] = None):
        self.texts, self.counts, self.flat_ids, self.firsts = texts, counts, flat_ids, firsts
        self.starts, self.ends, self.words_per_text = starts, ends, words_per_text
        # A text's windows: `budget` pieces each (one window, whatever its length, without a budget); an empty text
        # is one window of [CLS] [SEP].
        if predictor.budget:
            step = predictor.budget
            per_text = np.maximum(-(-counts // step), 1)
            self.first_window = np.cumsum(per_text) - per_text
            window_text = np.repeat(np.arange(len(texts)), per_text)
            window_index = np.arange(len(window_text)) - self.first_window[window_text]
            lengths = np.clip(counts[window_text] - window_index * step, 0, step) + 2
            piece_rows = self.first_window[piece_text] + position // step
            piece_cols = 1 + position % step
        else:
            self.first_window, lengths = np.arange(len(texts)), counts + 2
            piece_rows, piece_cols = piece_text, position + 1
        width = int(lengths.max()) if len(lengths) else 2
        self.input_ids = np.full((len(lengths), width), predictor.pad, np.int32)
        self.input_ids[:, 0] = predictor.cls
        self.input_ids[piece_rows, piece_cols] = flat_ids
        self.input_ids[np.arange(len(lengths)), lengths - 1] = predictor.sep
        self.attention_mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int32)
        self.word_text = np.repeat(np.arange(len(texts)), words_per_text)
        self.word_rows, self.word_cols = piece_rows[firsts], piece_cols[firsts]
        self.text_first_words = (np.cumsum(words_per_text) - words_per_text)[words_per_text > 0]
        self.case_ids = None
        if predictor.case:   # each piece gets its word's shape; [CLS], [SEP] and padding PAD_SHAPE
            if piece_shapes is None:   # not remembered with the pieces (`Tokenization.encode`)
                shapes = np.array(predictor.word_shapes([texts[k][s:e] for k, s, e in zip(
                    self.word_text.tolist(), starts.tolist(), ends.tolist())]), np.int32)
                is_first = np.zeros(len(flat_ids), bool)
                is_first[firsts] = True
                piece_shapes = shapes[np.cumsum(is_first) - 1]
            self.case_ids = np.full(self.input_ids.shape, PAD_SHAPE, np.int32)
            self.case_ids[piece_rows, piece_cols] = piece_shapes


def span_means(probs: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The float32 mean of `probs` [W] float32 over each span of words first..last (inclusive), exactly as
    np.mean of each span's own array: spans of one length are averaged together, one row each."""
    length = last - first + 1
    if len(length) and (length == 1).all():   # all one word: their own probability
        return probs[first]
    means = np.zeros(len(first), np.float32)
    for n in set(length.tolist()):
        which = np.flatnonzero(length == n)
        # np.mean's own sum and division, without its wrapper's per-call cost
        means[which] = np.add.reduce(probs[first[which, None] + np.arange(n)], axis=1) / n
    return means


def piece_shapes(text: str, words: Sequence[tuple], count: int) -> List[int]:
    """The word shape (shapes.word_shape) of each of a text's `count` pieces: that of the word it belongs to,
    `words` being (first piece, start char, end char) of each word in order."""
    shapes = []
    for index, (first, start, end) in enumerate(words):
        following = words[index + 1][0] if index + 1 < len(words) else count
        shapes.extend([word_shape(text[start:end])] * (following - first))
    return shapes


def word_spans(ids, offsets, continuation: np.ndarray) -> List[tuple]:
    """(first piece, start char, end char) of each word of one text's WordPiece `ids` and character
    `offsets`: a word starts at each piece that is not a "##" continuation, as the tokenizer's words do."""
    words = []
    for position, (piece, (start, end)) in enumerate(zip(ids, offsets)):
        if position == 0 or not continuation[piece]:
            words.append([position, start, end])
        else:
            words[-1][2] = max(words[-1][2], end)
    return [tuple(word) for word in words]


def read_lines(data: bytes, name: str) -> List[str]:
    """The texts of `data` as textfile.text_lines reads them (invalid UTF-8 replaced)."""
    return [text for _, text in _TEXTFILE.text_lines(io.BytesIO(data), name)]


def load(directory, threads: Optional[int] = None) -> Predictor:
    return Predictor(directory, threads)


def batches(lines, size: int):
    """Lists of up to `size` texts of `text_lines`' (number, text) pairs, as they are read."""
    batch = []
    for _, text in lines:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print(f"usage: python {Path(argv[0]).name} <export dir> < texts (one a line)", file=sys.stderr)
        return 2
    try:
        if _TEXTFILE is None:
            raise DamagedModel(Path(__file__).with_name("textfile.py"), "missing (this file reads its input by it); "
                                                                        "copy the whole export folder")
        predictor = load(argv[1])
        for batch in batches(_TEXTFILE.text_lines(sys.stdin.buffer, "<stdin>"), 64):
            for record in predictor.predict(batch):
                print(json.dumps(record, ensure_ascii=False), flush=True)
    except DamagedModel as e:
        print(f"error: {e}; export it again: bin/export with --overwrite", file=sys.stderr)
        return 2
    except ValueError as e:   # textfile.TextError: the input is not text, one a line
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
