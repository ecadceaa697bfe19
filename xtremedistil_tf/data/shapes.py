"""Word shapes: the casing of a word in the raw text, which a lower-casing tokenizer takes away.

A student of a lower-casing teacher (all-MiniLM-L6-v2, all-mpnet-base-v2, uncased BERT) never sees a capital
letter; with `--student_case_dim` it reads each piece's word shape beside the piece (students/models.py). The
shape of a word is one of SHAPES, from the Unicode categories of its characters (Lu and Lt are upper case, Ll
lower case, Nd digits); every piece of a word gets its word's shape, and [CLS], [SEP] and padding get `PAD` (0).

The same rule runs where words come from raw text: in training (data/alignment.py, from the data's words), in the
SavedModel's graph (export/words.py, RE2's `\\p{..}` classes) and in the shipped predict.py (export/portable.py,
imports this file). Only the standard library is used here, so predict.py can ship it as it is.
"""
from __future__ import annotations

import unicodedata

SHAPES = ("pad", "lower", "capitalized", "upper", "mixed", "digit", "other")
PAD, LOWER, CAPITALIZED, UPPER, MIXED, DIGIT, OTHER = range(len(SHAPES))
_UPPER, _LOWER = frozenset(("Lu", "Lt")), frozenset(("Ll",))


def word_shape(word: str) -> int:
    """The shape id of `word`: its cased letters all lower case (LOWER); the first upper case and the rest lower
    (CAPITALIZED: "Paris", "A"); two or more, all upper case (UPPER: "NATO"); any other mix (MIXED: "iPhone",
    "McDonald"); no cased letter but a decimal digit (DIGIT: "1968", "3-2"); neither (OTHER: ",", "東京")."""
    cased = [c for c in word if unicodedata.category(c) in _UPPER or unicodedata.category(c) in _LOWER]
    if not cased:
        return DIGIT if any(unicodedata.category(c) == "Nd" for c in word) else OTHER
    upper = [unicodedata.category(c) in _UPPER for c in cased]
    if not any(upper):
        return LOWER
    if all(upper):
        return UPPER if len(cased) > 1 else CAPITALIZED
    return CAPITALIZED if upper[0] and not any(upper[1:]) else MIXED
