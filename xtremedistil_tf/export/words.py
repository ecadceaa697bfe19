"""The word split of the training tokenizer, as character classes the serving graph can use.

Training reads words with Hugging Face `tokenizers`' BERT normalizer and pre-tokenizer (the
student's `BertTokenizerFast`, and `tokenizer.json` of ONNX/TFLite exports): control, format,
private-use and unassigned characters, NUL and U+FFFD are removed (and, with lower casing, the
combining marks that stripping accents removes), whitespace separates words, each punctuation and
CJK character is a word of its own. `compute_char_classes` reads those sets from the installed
`tokenizers` itself (so the graph follows the tokenizer, not a copy of its rules) as RE2 character
classes; `WordPieces` splits text with them in the graph (export.serving; docs/serving.md, Offsets).

Reading them takes seconds (every code point goes through the normalizer), so they are stored in
bert_chars.json (`python -m xtremedistil_tf.export.words` writes it) and
tests/test_serving_offsets.py checks the file against the installed `tokenizers`.
"""
from __future__ import annotations

import functools
import json
import sys
import unicodedata
from pathlib import Path
from typing import Dict, Iterable, Sequence

import tensorflow as tf
import tensorflow_text as tf_text
# The op under tf_text.regex_split_with_offsets, whose wrapper validates its three ragged outputs
# (about 90 assertion ops a call); the splits the op returns are well formed by construction.
from tensorflow_text.python.ops.regex_split_ops import gen_regex_split_ops
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

# The characters tested: every code point but the surrogates (not valid in UTF-8).
_CODE_POINTS = [c for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000]


def _re2_class(code_points: Iterable[int]) -> str:
    """A RE2 character class of the code points, as ranges."""
    ranges, points = [], sorted(code_points)
    for point in points:
        if ranges and ranges[-1][1] == point - 1:
            ranges[-1][1] = point
        else:
            ranges.append([point, point])
    return "[" + "".join(f"\\x{{{a:x}}}" + (f"-\\x{{{b:x}}}" if b > a else "") for a, b in ranges) + "]"


def compute_char_classes(lower_case: bool) -> Dict[str, str]:
    """RE2 classes of the characters the BERT normalizer (clean_text, CJK padding, accents stripped
    and lower case when `lower_case`) and pre-tokenizer treat specially:
    "vanish": removed by normalization; "space": separate words; "punct", "cjk": words of their own.
    The sets are disjoint."""
    chars = [chr(c) for c in _CODE_POINTS]
    clean = BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    # Whitespace is Z* or a control character (\t, \n, \r); clean_text maps it to " ".
    space = {c for c in chars if unicodedata.category(c) in ("Zs", "Zl", "Zp", "Cc") and clean.normalize_str(c) == " "}
    rest = [c for c in chars if c not in space]
    full = BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=lower_case, lowercase=lower_case)
    normalized = full.normalize_str(" ".join(rest)).split(" ")   # no character of `rest` becomes a space
    assert len(normalized) == len(rest)
    vanish = {c for c, n in zip(rest, normalized) if not n}
    kept = [(c, n) for c, n in zip(rest, normalized) if n]
    # CJK characters come out of handle_chinese_chars as " c ": "", c, "" between the separators.
    fields = BertNormalizer(clean_text=False, handle_chinese_chars=True, strip_accents=False,
                            lowercase=False).normalize_str(" ".join(c for c, _ in kept)).split(" ")
    cjk, i = set(), 0
    for c, _ in kept:
        if fields[i] == c:
            i += 1
        else:
            cjk.add(c)
            i += 3
    # Punctuation, judged on the normalized character (stripping accents may leave one, U+1FEF -> "`"):
    # the pre-tokenizer makes it a word of its own between two letters.
    candidates = {n for _, n in kept if len(n) == 1 and (unicodedata.category(n)[0] in "PS" or n.isascii())}
    punct_chars = {n for n in candidates if len(BertPreTokenizer().pre_tokenize_str(f"x{n}x")) == 3}
    punct = {c for c, n in kept if c not in cjk and any(ch in punct_chars for ch in n)}
    return {name: _re2_class(ord(c) for c in members)
            for name, members in (("vanish", vanish), ("space", space), ("punct", punct), ("cjk", cjk))}


CLASSES_FILE = Path(__file__).with_name("bert_chars.json")


@functools.lru_cache(maxsize=None)
def bert_char_classes(lower_case: bool) -> Dict[str, str]:
    """compute_char_classes(lower_case) as stored in bert_chars.json."""
    return json.loads(CLASSES_FILE.read_text(encoding="utf-8"))["lower_case" if lower_case else "cased"]


def write_classes_file(path: Path = CLASSES_FILE) -> None:
    classes = {"lower_case": compute_char_classes(True), "cased": compute_char_classes(False)}
    path.write_text(json.dumps(classes, indent=1) + "\n", encoding="utf-8")


def _union(*classes: str) -> str:
    """One RE2 class of the members of `classes` (each "[...]")."""
    return "[" + "".join(c[1:-1] for c in classes) + "]"


def row_ids(ragged: tf.RaggedTensor):
    """ragged.value_rowids() [V] from its row splits in a few ops, where tf.ragged's takes about twenty
    (the serving graph runs at batch 1 too, where each op's dispatch counts)."""
    splits = ragged.row_splits
    return tf.searchsorted(splits[1:], tf.range(splits[-1]), side="right", out_type=splits.dtype)


class WordPieces:
    """The served tokenizer: UTF-8 text -> words, split as the training tokenizer splits them
    (bert_char_classes), with their byte offsets -> WordPiece ids of each word (tensorflow-text's
    FastWordpieceTokenizer on the word normalized as the BERT normalizer does: characters that vanish
    removed; with `lower_case`, NFD, combining marks (Mn) removed, lower case). Every word has at
    least one piece ([UNK] if the WordPiece tokenizer gives none)."""

    def __init__(self, vocab: Sequence[str], lower_case: bool):
        classes = bert_char_classes(lower_case)
        self.lower_case = lower_case
        self._vanish = classes["vanish"]
        self._delimiter = _union(classes["space"], classes["punct"], classes["cjk"])
        self._word_of_its_own = _union(classes["punct"], classes["cjk"])
        self._unk = list(vocab).index("[UNK]")
        # Each word is one WordPiece input: no splitting of its own (its punctuation tables may differ).
        self.wordpiece = tf_text.FastWordpieceTokenizer(list(vocab), token_out_type=tf.int32, unknown_token="[UNK]",
                                                        no_pretokenization=True)

    def words(self, text):
        """Words of valid UTF-8 texts [B]: (words [B, (W)] string, start [B, (W)], end [B, (W)] int64 bytes,
        end exclusive). Characters that vanish are left out at a word's edges; a word of nothing else
        is dropped, as the training tokenizer drops it."""
        # regex_split_with_offsets ends a text at NUL; \x01 vanishes as NUL does and has its length.
        text = tf.strings.regex_replace(text, "\\x00", "\x01")
        words, start, end, splits = gen_regex_split_ops.regex_split_with_offsets(
            text, f"({self._delimiter})", f"({self._word_of_its_own})")
        words, start, end = (tf.RaggedTensor.from_row_splits(values, splits, validate=False)
                             for values in (words, start, end))
        flat = words.flat_values
        length = tf.strings.length(flat)
        lead = length - tf.strings.length(tf.strings.regex_replace(flat, f"^{self._vanish}+", ""))
        trail = length - tf.strings.length(tf.strings.regex_replace(flat, f"{self._vanish}+$", ""))
        keep = lead < length
        start_byte = tf.cast(start.flat_values, tf.int64) + tf.cast(lead, tf.int64)
        end_byte = tf.cast(end.flat_values, tf.int64) - tf.cast(trail, tf.int64)
        rows = tf.boolean_mask(row_ids(words), keep)
        # The serving graph runs at batch 1 too, where each op's dispatch counts: no validation ops.
        ragged = lambda values: tf.RaggedTensor.from_value_rowids(tf.boolean_mask(values, keep), rows,
                                                                 nrows=words.nrows(), validate=False)
        trimmed = tf.strings.substr(flat, lead, length - lead - trail)
        return ragged(trimmed), ragged(start_byte), ragged(end_byte)

    def normalize(self, words):
        """Words [W] as the BERT normalizer leaves them."""
        words = tf.strings.regex_replace(words, self._vanish, "")
        if self.lower_case:
            words = tf.strings.regex_replace(tf_text.normalize_utf8(words, "NFD"), r"\p{Mn}", "")
            words = tf.strings.lower(words, encoding="utf-8")
        return words

    def pieces(self, words):
        """WordPiece ids [W, (P)] int32 of words [W], at least one per word."""
        pieces = self.wordpiece.tokenize(self.normalize(words))
        # A word of no pieces gets one [UNK]: the pieces move right by the [UNK]s before them
        # (a scatter, a handful of ops where a ragged concat and mask take dozens).
        splits = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(tf.maximum(pieces.row_lengths(), 1))], axis=0)
        rows = row_ids(pieces)
        moved = tf.range(tf.size(rows, out_type=tf.int64)) + tf.gather(splits[:-1] - pieces.row_splits[:-1], rows)
        values = tf.tensor_scatter_nd_update(tf.fill([splits[-1]], tf.constant(self._unk, tf.int32)), moved[:, None],
                                             pieces.flat_values)
        return tf.RaggedTensor.from_row_splits(values, splits, validate=False)

    def tokenize(self, text):
        """(pieces [B, (W), (P)] int32, start [B, (W)], end [B, (W)] int64 bytes) of valid UTF-8 texts [B]."""
        words, start, end = self.words(text)
        return tf.RaggedTensor.from_row_splits(self.pieces(words.flat_values), words.row_splits, validate=False), start, end


if __name__ == "__main__":
    write_classes_file()
