"""Served-vocabulary pruning: keep only the word pieces a student's training data uses.

Most of a small student's parameters are its word embeddings: at (E, H) = (50, 200) with
mBERT's 119,547 pieces they are 5.98M of 6.4M. A student never updates the rows of pieces its
training and transfer data do not contain, so serving them buys little. Pruning keeps the pieces
seen in a corpus (at least `min_count` times), the special pieces and, by default, every
one-character piece, so an unseen word still splits into characters instead of becoming [UNK].

WordPiece is greedy longest-match-first, so a word whose pieces are all kept segments exactly as
before (no longer match can appear in a subset vocabulary): on the corpus the pruned model gives
the same outputs; elsewhere words may split into other kept pieces.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Sequence

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from xtremedistil_tf.errors import DataFormatError
from xtremedistil_tf.export.words import WordPieces
from xtremedistil_tf.students.artifact import Replacement, special_pieces

def corpus_texts(paths: Sequence[Path]) -> Iterator[str]:
    """Texts of `paths`: JSON lines with "tokens" (a work dir's data/*.jsonl), joined by spaces,
    or plain text, one text a line."""
    for path in map(Path, paths):
        if not path.is_file():
            raise DataFormatError(path, None, "vocabulary corpus not found")
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if path.suffix != ".jsonl":
                    yield line.rstrip("\n")
                    continue
                try:
                    tokens = json.loads(line)["tokens"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise DataFormatError(path, number, 'expected a JSON object with a "tokens" list') from None
                yield " ".join(tokens)


def piece_counts(texts: Iterable[str], vocab: List[str], lower_case: bool, batch_size: int = 1024) -> np.ndarray:
    """[len(vocab)] int64: how often each piece occurs when the served tokenizer (export.words.WordPieces,
    as in export.serving) splits `texts`."""
    tokenizer = WordPieces(vocab, lower_case)
    counts = np.zeros(len(vocab), np.int64)
    batch: List[str] = []

    def flush():
        if batch:
            ids = tokenizer.tokenize(tf.constant(batch))[0].flat_values.numpy()
            counts[:] += np.bincount(ids, minlength=len(vocab))
            batch.clear()

    for text in tqdm(texts, unit="text", desc="counting pieces", mininterval=2):
        batch.append(text)
        if len(batch) == batch_size:
            flush()
    flush()
    return counts


def kept_piece_ids(counts: np.ndarray, vocab: List[str], min_count: int = 1, keep_characters: bool = True) -> np.ndarray:
    """Sorted ids of the pieces to serve: seen >= min_count times, special, or (keep_characters)
    one character long once a leading "##" is dropped."""
    keep = counts >= min_count
    special = set(special_pieces(vocab).values())
    for index, piece in enumerate(vocab):
        bare = piece[2:] if piece.startswith("##") else piece
        if piece in special or (keep_characters and len(bare) == 1):
            keep[index] = True
    return np.flatnonzero(keep)


def pruned_embedding(keep_ids: np.ndarray) -> Dict[str, Replacement]:
    """The replacement (students.artifact.clone_replacing) of `word_embedding` by one holding only the
    rows `keep_ids`, in that order: piece keep_ids[i] becomes id i."""
    def make(old):
        return old.__class__.from_config({**old.get_config(), "input_dim": len(keep_ids)})

    def copy_weights(old, new):
        new.set_weights([old.get_weights()[0][keep_ids]])

    return {"word_embedding": (make, copy_weights)}
