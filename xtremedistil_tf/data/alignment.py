"""Words to WordPieces and back, with sliding windows for long sentences.

The first piece of a word carries the word's label; continuation pieces get `X`;
the CLS, SEP and PAD positions get their own markers. With 7 IOB2 labels this is
the XtremeDistil papers' 11 tags. Evaluation reads the prediction at each word's
first piece, so scores are over words, never pieces.

Sentences longer than `max_seq_length` pieces (MSRA test has 1,475 characters)
become several overlapping windows cut at word boundaries; each word is scored by
the window in which it has the most context on both sides (the usual "max context"
rule of extractive QA), so predictions stitch back to exactly one tag per word.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.shapes import PAD, word_shape
from xtremedistil_tf.errors import ConfigError

X_TAG = "X"
CLS_TAG = "[CLS]"
SEP_TAG = "[SEP]"
PAD_TAG = "[PAD]"
SPECIAL_TAGS = (X_TAG, CLS_TAG, SEP_TAG, PAD_TAG)


class TagVocab:
    """Piece-level tag ids: the word labels followed by the `markers` X, [CLS], [SEP], [PAD]."""

    markers = SPECIAL_TAGS
    DUPLICATE = "duplicate labels in {}"
    UNKNOWN = "tag {!r} is not one of the model's labels {}"

    def __init__(self, labels: Sequence[str]):
        clash = [t for t in self.markers if t in labels]
        if clash:
            raise ConfigError(f"labels {clash} are reserved for word-piece markers; rename them in the data")
        if len(set(labels)) != len(labels):
            raise ConfigError(self.DUPLICATE.format(list(labels)))
        self.labels = list(labels)
        self.tags = self.labels + list(self.markers)
        self._index = {t: i for i, t in enumerate(self.tags)}

    def __len__(self) -> int:
        return len(self.tags)

    def id(self, tag: str) -> int:
        try:
            return self._index[tag]
        except KeyError:
            raise ConfigError(self.UNKNOWN.format(tag, self.labels)) from None

    @property
    def x_id(self) -> int:
        return self._index[X_TAG]

    @property
    def pad_id(self) -> int:
        return self._index[PAD_TAG]

    def word_label(self, tag_id: int, default: str = "O") -> str:
        """The word label of a predicted tag; a marker predicted at a word start reads as `default`."""
        return self.labels[tag_id] if tag_id < len(self.labels) else default


@dataclass
class Windows:
    """Encoded windows of a list of sentences, as padded numpy arrays.

    input_ids, attention_mask, label_ids, word_index: [W, L]. `word_index[w, t]` is the
    index within its sentence of the word whose first piece sits at t, and -1 elsewhere.
    `owner[w, t]` is True where window w is the one that scores that word.
    sentence_index: [W], the sentence each window came from. case_ids: [W, L], the shape
    (data/shapes.py) of the word each piece belongs to, every piece of it; PAD at [CLS], [SEP] and padding.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    label_ids: np.ndarray
    word_index: np.ndarray
    owner: np.ndarray
    sentence_index: np.ndarray
    sentence_lengths: np.ndarray
    case_ids: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def word_pieces(tokenizer, sentences: Sequence[Sentence]) -> List[List[List[int]]]:
    """Piece ids per word per sentence. A word the tokenizer drops (e.g. a control character)
    becomes [UNK] so that every word keeps a first piece and a prediction."""
    if not sentences:
        return []
    # verbose=False: the "longer than the maximum sequence length" warning does not apply,
    # since long sentences are windowed.
    encoded = tokenizer([list(s.tokens) for s in sentences], is_split_into_words=True,
                        add_special_tokens=False, verbose=False)
    result = []
    for i, sentence in enumerate(sentences):
        per_word: List[List[int]] = [[] for _ in sentence.tokens]
        for piece, word in zip(encoded["input_ids"][i], encoded.word_ids(i)):
            if word is not None:
                per_word[word].append(piece)
        result.append([p if p else [tokenizer.unk_token_id] for p in per_word])
    return result


def plan_windows(piece_counts: Sequence[int], budget: int, stride: int) -> List[tuple]:
    """Split a sentence's words into windows of at most `budget` pieces, cut at word boundaries.

    Returns (first_word, end_word) pairs. Consecutive windows start about `stride` pieces
    apart so each word away from the sentence ends is seen with context on both sides.
    A single word longer than `budget` gets a window of its own (its pieces are truncated).
    """
    n = len(piece_counts)
    if n == 0:
        return [(0, 0)]
    starts = np.concatenate([[0], np.cumsum(piece_counts)])
    windows = []
    first = 0
    while True:
        end = first + 1
        while end < n and starts[end + 1] - starts[first] <= budget:
            end += 1
        windows.append((first, end))
        if end == n:
            return windows
        nxt = first + 1
        while nxt < end and starts[nxt] - starts[first] < stride:
            nxt += 1
        first = nxt


def assign_owners(windows: Sequence[tuple], piece_counts: Sequence[int]) -> List[int]:
    """For each word, the window in which it has the most context (min of left and right pieces)."""
    starts = np.concatenate([[0], np.cumsum(piece_counts)])
    best = [-1] * len(piece_counts)
    best_context = [-1] * len(piece_counts)
    for w, (first, end) in enumerate(windows):
        for word in range(first, end):
            context = min(starts[word] - starts[first], starts[end] - starts[word + 1])
            if context > best_context[word]:
                best[word], best_context[word] = w, context
    return best


def encode(sentences: Sequence[Sentence], tokenizer, tag_vocab: TagVocab,
           max_seq_length: int = 128, stride: Optional[int] = None) -> Windows:
    """Encode sentences into fixed-length windows of pieces with piece-level tag ids.

    Unlabeled sentences get PAD tag ids everywhere (they are never trained on those).
    `stride` (pieces between window starts) defaults to half the piece budget.
    """
    budget = max_seq_length - 2
    if budget < 1:
        raise ConfigError(f"max_seq_length must be at least 3 (CLS, one piece, SEP), got {max_seq_length}")
    stride = max(1, stride or budget // 2)
    rows = []
    for s_index, (sentence, pieces) in enumerate(zip(sentences, word_pieces(tokenizer, sentences))):
        counts = [min(len(p), budget) for p in pieces]
        windows = plan_windows(counts, budget, stride)
        owners = assign_owners(windows, counts)
        for w, (first, end) in enumerate(windows):
            rows.append(_encode_window(sentence, pieces, first, end, budget, owners, w, s_index,
                                       tokenizer, tag_vocab))
    return _stack(rows, max_seq_length, tokenizer.pad_token_id, tag_vocab.pad_id,
                  np.array([len(s.tokens) for s in sentences], dtype=np.int32))


def encode_consecutive(sentences: Sequence[Sentence], tokenizer, tag_vocab: TagVocab,
                       max_seq_length: int = 128) -> Windows:
    """Windows as an export cuts text (export/serving.windows_of): each sentence's pieces in consecutive,
    non-overlapping windows of `max_seq_length - 2` pieces, cut wherever the budget ends (inside a word too; a
    sentence of no pieces gets one window). A word is scored in the window of its first piece; its other pieces
    are tagged X wherever they fall."""
    budget = max_seq_length - 2
    if budget < 1:
        raise ConfigError(f"max_seq_length must be at least 3 (CLS, one piece, SEP), got {max_seq_length}")
    rows = []
    for s_index, (sentence, pieces) in enumerate(zip(sentences, word_pieces(tokenizer, sentences))):
        shapes = [word_shape(token) for token in sentence.tokens]
        flat = [(piece, word, k == 0) for word, ids in enumerate(pieces) for k, piece in enumerate(ids)]
        for start in range(0, max(len(flat), 1), budget):
            chunk = flat[start:start + budget]
            labels = [tag_vocab.id(sentence.tags[word]) if first else tag_vocab.x_id for _, word, first in chunk]
            tags = [tag_vocab.id(CLS_TAG)] + labels + [tag_vocab.id(SEP_TAG)]
            rows.append(([tokenizer.cls_token_id] + [p for p, _, _ in chunk] + [tokenizer.sep_token_id],
                         tags if sentence.tags is not None else [tag_vocab.pad_id] * len(tags),
                         [-1] + [word if first else -1 for _, word, first in chunk] + [-1],
                         [False] + [first for _, _, first in chunk] + [False], s_index,
                         [PAD] + [shapes[word] for _, word, _ in chunk] + [PAD]))
    return _stack(rows, max_seq_length, tokenizer.pad_token_id, tag_vocab.pad_id,
                  np.array([len(s.tokens) for s in sentences], dtype=np.int32))


def _encode_window(sentence, pieces, first, end, budget, owners, w, s_index, tokenizer, tag_vocab):
    ids = [tokenizer.cls_token_id]
    tags = [tag_vocab.id(CLS_TAG)]
    words = [-1]
    own = [False]
    cases = [PAD]
    for word in range(first, end):
        word_ids = pieces[word][:budget]
        label = tag_vocab.id(sentence.tags[word]) if sentence.tags is not None else tag_vocab.pad_id
        ids.extend(word_ids)
        tags.extend([label] + [tag_vocab.x_id] * (len(word_ids) - 1))
        words.extend([word] + [-1] * (len(word_ids) - 1))
        own.extend([owners[word] == w] + [False] * (len(word_ids) - 1))
        cases.extend([word_shape(sentence.tokens[word])] * len(word_ids))
    ids.append(tokenizer.sep_token_id)
    tags.append(tag_vocab.id(SEP_TAG))
    words.append(-1)
    own.append(False)
    cases.append(PAD)
    if sentence.tags is None:
        tags = [tag_vocab.pad_id] * len(tags)
    return ids, tags, words, own, s_index, cases


def _stack(rows, length, pad_piece, pad_tag, sentence_lengths) -> Windows:
    w = len(rows)
    input_ids = np.full((w, length), pad_piece, dtype=np.int32)
    mask = np.zeros((w, length), dtype=np.int32)
    labels = np.full((w, length), pad_tag, dtype=np.int32)
    word_index = np.full((w, length), -1, dtype=np.int32)
    owner = np.zeros((w, length), dtype=bool)
    sentence_index = np.zeros((w,), dtype=np.int32)
    case_ids = np.full((w, length), PAD, dtype=np.int32)
    for r, (ids, tags, words, own, s_index, cases) in enumerate(rows):
        n = len(ids)
        input_ids[r, :n] = ids
        mask[r, :n] = 1
        labels[r, :n] = tags
        word_index[r, :n] = words
        owner[r, :n] = own
        sentence_index[r] = s_index
        case_ids[r, :n] = cases
    return Windows(input_ids, mask, labels, word_index, owner, sentence_index, sentence_lengths, case_ids)


def length_batches(input_ids: np.ndarray, attention_mask: np.ndarray, batch_size: int, min_length: int = 1,
                   case_ids: Optional[np.ndarray] = None):
    """Yields (row indices, {"input_ids", "attention_mask"} of those rows, and "case_ids" when given) over the rows
    in order of length, each batch cut to its longest row (at least `min_length` columns): sentences are mostly
    far shorter than the padded width."""
    lengths = attention_mask.sum(1)
    order = np.argsort(lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        length = max(min_length, int(lengths[idx].max()))
        batch = {"input_ids": input_ids[idx, :length], "attention_mask": attention_mask[idx, :length]}
        if case_ids is not None:
            batch["case_ids"] = case_ids[idx, :length]
        yield idx, batch


class CompiledPerStudent:
    """`make(student, *key)` (a compiled predict function) cached per key for the latest student:
    an evaluate_fn called after every epoch or step traces once per student, not once per call."""

    def __init__(self, make):
        self._make, self._student, self._fns = make, None, {}

    def __call__(self, student, *key):
        if student is not self._student:
            self._student, self._fns = student, {}
        if key not in self._fns:
            self._fns[key] = self._make(student, *key)
        return self._fns[key]


def predict_by_length(windows: Windows, tags_fn, batch_size: int = 64, case: bool = False) -> np.ndarray:
    """Tag ids [W, L] from `tags_fn({"input_ids", "attention_mask"} [B, T]) -> [B, T]` (or any
    per-piece values [B, T, ...], e.g. probabilities, in their dtype), batched by length
    (`length_batches`); positions past a window's length are 0. Batches have at least 2 columns:
    CRF decoding needs a time step to scan. With `case`, the batches also hold the windows' "case_ids".
    """
    out = None
    for idx, batch in length_batches(windows.input_ids, windows.attention_mask, batch_size, min_length=2,
                                     case_ids=windows.case_ids if case else None):
        values = np.asarray(tags_fn(batch))
        if out is None:
            out = np.zeros(windows.input_ids.shape + values.shape[2:], dtype=values.dtype)
        out[idx, :batch["input_ids"].shape[1]] = values
    if out is None:  # no windows
        return np.zeros(windows.input_ids.shape, dtype=np.int32)
    real = np.arange(out.shape[1])[None, :] < windows.attention_mask.sum(1)[:, None]
    return out * real.reshape(real.shape + (1,) * (out.ndim - 2))


def decode(windows: Windows, piece_predictions: np.ndarray, tag_vocab: TagVocab) -> List[List[str]]:
    """Stitch piece-level tag ids [W, L] back to one word label per word per sentence."""
    predictions = [["O"] * int(n) for n in windows.sentence_lengths]
    rows, cols = np.nonzero(windows.owner)
    for r, c in zip(rows, cols):
        predictions[windows.sentence_index[r]][windows.word_index[r, c]] = \
            tag_vocab.word_label(int(piece_predictions[r, c]))
    return predictions
