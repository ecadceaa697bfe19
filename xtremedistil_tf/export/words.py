"""The word split of the training tokenizer, as character classes the serving graph can use.

Training reads words with Hugging Face `tokenizers`' BERT normalizer and pre-tokenizer (the
student's `BertTokenizerFast`, and `tokenizer.json` of ONNX/TFLite exports): control, format,
private-use and unassigned characters, NUL and U+FFFD are removed (and, with lower casing, the
combining marks that stripping accents removes), whitespace separates words, each punctuation and
CJK character is a word of its own. `compute_char_classes` reads those sets from the installed
`tokenizers` itself (so the graph follows the tokenizer, not a copy of its rules) as RE2 character
classes; `WordSplit` splits text into words with them in the graph, and its subclasses give each word's pieces:
`WordPieces` (WordPiece students) and `SentencePieces` (students of SentencePiece Unigram teachers whose normalizer
is the model's own: XLM-R, CamemBERT) (export.serving; docs/serving.md, Offsets).

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
from typing import Dict, Iterable, List, Sequence, Tuple

import tensorflow as tf
import tensorflow_text as tf_text
# The op under tf_text.regex_split_with_offsets, whose wrapper validates its three ragged outputs
# (about 90 assertion ops a call); the splits the op returns are well formed by construction.
from tensorflow_text.python.ops.regex_split_ops import gen_regex_split_ops
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

from xtremedistil_tf.data.alignment import word_pieces
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.shapes import CAPITALIZED, DIGIT, LOWER, MIXED, OTHER, UPPER
from xtremedistil_tf.data.wordsplit import split_words
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.students.artifact import special_pieces

# The characters tested: every code point but the surrogates (not valid in UTF-8).
_CODE_POINTS = [c for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000]


def _re2_class(code_points: Iterable[int]) -> str:
    """A RE2 character class of the code points, as ranges (of none: a class that matches nothing; RE2 reads "[]" as
    an error)."""
    ranges, points = [], sorted(code_points)
    if not points:
        return "[^\\x{0}-\\x{10ffff}]"
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


class WordSplit:
    """The served word split: UTF-8 text -> words, split as the training tokenizer splits them
    (bert_char_classes), with their byte offsets. `tokenize` gives each word's pieces by the subclass's
    `pieces`: WordPiece (`WordPieces`) or SentencePiece (`SentencePieces`)."""

    def __init__(self, lower_case: bool):
        classes = bert_char_classes(lower_case)
        self.lower_case = lower_case
        self._vanish = classes["vanish"]
        self._delimiter = _union(classes["space"], classes["punct"], classes["cjk"])
        self._word_of_its_own = _union(classes["punct"], classes["cjk"])

    def words(self, text):
        """Words of valid UTF-8 texts [B]: (words [B, (W)] string, start [B, (W)], end [B, (W)] int64 bytes,
        end exclusive). Characters that vanish are left out at a word's edges; a word of nothing else
        is dropped, as the training tokenizer drops it. A NUL inside a word reads as U+0001 (it vanishes as that does
        under the BERT normalizer; SentencePieces reads the words from the text instead)."""
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

    # The tf.Modules holding resources that a SavedModel of the tokenizer must track.
    modules: Sequence[tf.Module] = ()

    def piece_input(self, text, words, start, end):
        """What `pieces` reads of the `words` [B, (W)] of texts [B] (start and end bytes [B, (W)]): the words [W]."""
        return words.flat_values

    def pieces(self, words):
        """Piece ids [W, (P)] int32 of `piece_input`'s words [W], at least one per word."""
        raise NotImplementedError

    def tokenize(self, text, shapes: bool = False):
        """(pieces [B, (W), (P)] int32, start [B, (W)], end [B, (W)] int64 bytes) of valid UTF-8 texts [B]; with
        `shapes`, also each piece's word shape [B, (W), (P)] int32 (`word_shapes` of the word as the text has it)."""
        words, start, end = self.words(text)
        pieces = self.pieces(self.piece_input(text, words, start, end))
        pieces = tf.RaggedTensor.from_row_splits(pieces, words.row_splits, validate=False)
        if not shapes:
            return pieces, start, end
        case = tf.repeat(word_shapes(words.flat_values), pieces.values.row_lengths())
        return pieces, start, end, pieces.with_flat_values(case)


def word_shapes(words):
    """data/shapes.word_shape of each of words [W] (UTF-8 strings), in the graph: [W] int32. The same rule on
    the same Unicode categories (RE2's \\p{Lu}, \\p{Lt}, \\p{Ll}, \\p{Nd}; tests/test_case.py compares the two)."""
    def has(pattern):
        return tf.strings.regex_full_match(words, f"(?s){pattern}")

    upper_class = "[\\p{Lu}\\p{Lt}]"
    upper, lower, digit = has(f".*{upper_class}.*"), has(".*\\p{Ll}.*"), has(".*\\p{Nd}.*")
    two_upper = has(f".*{upper_class}.*{upper_class}.*")
    first_upper = has(f"[^\\p{{Lu}}\\p{{Lt}}\\p{{Ll}}]*{upper_class}.*")
    shape = tf.where(first_upper & ~two_upper, CAPITALIZED, MIXED)
    shape = tf.where(~lower, tf.where(two_upper, UPPER, CAPITALIZED), shape)
    shape = tf.where(~upper, LOWER, shape)
    return tf.where(~upper & ~lower, tf.where(digit, DIGIT, OTHER), shape)


def at_least_one(pieces, unk_id: int):
    """Piece ids [W, (P)] with one `unk_id` for each word of no pieces, as the training alignment gives it
    (data/alignment.word_pieces)."""
    # The pieces move right by the [UNK]s before them (a scatter, a handful of ops where a ragged concat and
    # mask take dozens).
    splits = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(tf.maximum(pieces.row_lengths(), 1))], axis=0)
    rows = row_ids(pieces)
    moved = tf.range(tf.size(rows, out_type=tf.int64)) + tf.gather(splits[:-1] - pieces.row_splits[:-1], rows)
    values = tf.tensor_scatter_nd_update(tf.fill([splits[-1]], tf.constant(unk_id, tf.int32)), moved[:, None],
                                         pieces.flat_values)
    return tf.RaggedTensor.from_row_splits(values, splits, validate=False)


class WordPieces(WordSplit):
    """The served tokenizer of a WordPiece student: `WordSplit`'s words -> WordPiece ids of each word
    (tensorflow-text's FastWordpieceTokenizer on the word normalized as the BERT normalizer does: characters
    that vanish removed; with `lower_case`, NFD, combining marks (Mn) removed, lower case). Every word has at
    least one piece ([UNK] if the WordPiece tokenizer gives none)."""

    def __init__(self, vocab: Sequence[str], lower_case: bool):
        super().__init__(lower_case)
        vocab = list(vocab)
        special = special_pieces(vocab)   # BERT's [CLS] [SEP] [PAD] [UNK], or MPNet's <s> </s> <pad> [UNK]
        self._unk = vocab.index(special["unk"])
        self.cls_id, self.sep_id, self.pad_id = (vocab.index(special[k]) for k in ("cls", "sep", "pad"))
        # Each word is one WordPiece input: no splitting of its own (its punctuation tables may differ).
        self.wordpiece = tf_text.FastWordpieceTokenizer(vocab, token_out_type=tf.int32, unknown_token=special["unk"],
                                                        no_pretokenization=True)

    def normalize(self, words):
        """Words [W] as the BERT normalizer leaves them."""
        words = tf.strings.regex_replace(words, self._vanish, "")
        if self.lower_case:
            words = tf.strings.regex_replace(tf_text.normalize_utf8(words, "NFD"), r"\p{Mn}", "")
            words = tf.strings.lower(words, encoding="utf-8")
        return words

    def pieces(self, words):
        """WordPiece ids [W, (P)] int32 of words [W], at least one per word."""
        return at_least_one(self.wordpiece.tokenize(self.normalize(words)), self._unk)


# The graphemes the `tokenizers` SentencePiece normalizer rewrites whole (`grapheme_rule`): under 6 bytes, probed with
# these combining marks (2 bytes each).
_GRAPHEME_BYTES = 6
_PROBE_MARKS = ("\u0301", "\u0308")


@functools.lru_cache(maxsize=None)
def _extenders() -> frozenset:
    """Code points that continue a grapheme in any case: combining marks, ZWNJ/ZWJ, emoji modifiers, tags."""
    marks = {c for c in _CODE_POINTS if unicodedata.category(chr(c)) in ("Mn", "Me", "Mc")}
    return frozenset(marks | {0x200C, 0x200D} | set(range(0x1F3FB, 0x1F400)) | set(range(0xE0020, 0xE0080)))


def grapheme_rules(normalize) -> Dict[str, str]:
    """RE2 rewrites that make SentencePiece's own normalizer give what Hugging Face `tokenizers`' Precompiled
    normalizer (`normalize`: its normalize_str) gives: {"short": pattern (replacement `GRAPHEME_REPLACEMENT`),
    "separator": a character the map removes, "apart": the characters it goes before, "whole": pattern where it
    is taken out again (replacement r"\\1\\2\\3")}.

    The two read the same precompiled character map, but SentencePiece replaces the longest key at each
    character, across graphemes, while `tokenizers` looks up each grapheme: one of under 6 bytes that begins with
    a key is replaced whole by the shortest such key's value, the marks after it dropped (e.g. "e\\u0323\\u0302",
    Vietnamese in NFD, becomes "ẹ", SentencePiece's "ệ"); any other a character at a time (decomposed Hangul
    "\\u1100\\u1161" stays two jamo and "\\u03b1\\u0301\\u0940" three characters, where SentencePiece composes "가"
    and "ά"). The student reads `tokenizers`' pieces, so the served graph rewrites each word first: "short" drops
    what follows a key in a grapheme of under 6 bytes (a 2-byte key and a 2- or 3-byte extender, a 3-byte key and
    a 2-byte one, an ASCII letter with a 2-byte mark that together are a key and a 2-byte one); then the separator
    goes before each character that continues a grapheme, so that SentencePiece composes nothing, and "whole" takes
    it out of a two-character key that is a whole grapheme under 6 bytes. Keys and extenders are read from
    `normalize` itself: a key is what swallows a following combining mark; two-character keys are found among the
    Unicode decompositions. No rules ({}) where `normalize` is None or has no key (a model without a character map,
    normalization_rule_name=identity); only "short" where the map removes no control character to separate with.
    Graphemes are told by the characters that continue one (marks, ZWNJ/ZWJ, emoji modifiers, Hangul vowels and
    finals), not by every rule of Unicode's segmentation: tests/test_sentencepiece_export.py holds the fuzz set on
    which the served pieces equal `tokenizers`'."""
    if normalize is None:   # the tokenizer normalizes nothing (backend_tokenizer.normalizer is None)
        return {}
    first, second = _PROBE_MARKS
    bmp = [c for c in _CODE_POINTS if 0x80 <= c < 0x10000]
    keys = [c for c in bmp if normalize(chr(c) + first) == normalize(chr(c)) != chr(c) + first]
    probe = next((chr(c) for c in keys if len(chr(c).encode()) == 2), None)
    if probe is None:   # no character map (normalization_rule_name=identity): nothing is read a grapheme at a time
        return {}
    attach = {c for c in bmp if normalize(probe + chr(c)) == normalize(probe) and normalize(chr(c)) != ""}
    two = {c for c in attach if c < 0x800}
    extender = _re2_class(attach | _extenders())
    # Two-character keys: the first two characters of each character's decompositions, where `normalize` reads
    # them as one (it drops a mark after them).
    candidates = {unicodedata.normalize(form, chr(c))[:2] for c in bmp for form in ("NFD", "NFKD")}
    # ... and with a mark that decomposes to the second character (U+0341 is U+0301)
    singletons = {}
    for c in bmp:
        singletons.setdefault(unicodedata.normalize("NFD", chr(c)), []).append(chr(c))
    candidates |= {p[0] + mark for p in list(candidates) if len(p) == 2 for mark in singletons.get(p[1], ())}
    pairs = sorted(p for p in candidates if len(p) == 2 and len(p.encode()) < _GRAPHEME_BYTES and p[0] != p[1]
                   and ord(p[1]) in attach and normalize(p) != p
                   and normalize(p + (second if p[1] == first else first)) == normalize(p))
    # A separator the map removes goes before each character that continues a grapheme (marks, Hangul vowels and
    # finals), so that SentencePiece composes no two characters that `tokenizers` reads one at a time; it is taken
    # out again between the two characters of a key that is a whole grapheme under 6 bytes (`tokenizers` reads that
    # one whole).
    jamo = set(range(0x1160, 0x1200)) | set(range(0xD7B0, 0xD800))
    single = set(keys)
    whole = sorted(p for p in candidates if len(p) == 2 and len(p.encode()) < _GRAPHEME_BYTES
                   and ord(p[0]) not in single and ord(p[1]) in attach
                   and normalize(p) != normalize(p[0]) + normalize(p[1]))

    extending_chars = attach | _extenders()

    def key_class(members):
        """Keys that extend a grapheme begin one only at the word's start."""
        starts = [c for c in members if c not in extending_chars]
        extending = [c for c in members if c in extending_chars]
        return "(?:" + "|".join(([_re2_class(starts)] if starts else []) +
                                ([f"^{_re2_class(extending)}"] if extending else [])) + ")"

    def alternatives(strings, between=""):
        return "|".join(between.join(f"\\x{{{ord(ch):x}}}" for ch in p) for p in strings) or "[^\\x{0}-\\x{10ffff}]"

    key2, key3 = [c for c in keys if c < 0x800], [c for c in keys if c >= 0x800]
    short_pairs = [p for p in pairs if len(p.encode()) + 2 < _GRAPHEME_BYTES]
    end = f"([^{extender[1:-1]}]|$)"
    short = (f"(?:({key_class(key2)}){_re2_class(attach)}|({key_class(key3)}){_re2_class(two)}|"
             f"({alternatives(short_pairs)}){_re2_class(two)}){end}")
    separator = next((chr(c) for c in range(1, 0x20) if normalize(f"a{chr(c)}b") == "ab"), None)
    if separator is None:   # no control character the map removes: only "short" (the export's probe checks the rest)
        return {"short": short}

    return {"short": short,
            "separator": separator,
            "apart": f"({_re2_class(attach | _extenders() | jamo)})",
            "whole": f"({alternatives([p[0] for p in whole])})\\x{{{ord(separator):x}}}"
                     f"({alternatives(sorted({p[1] for p in whole}))})"
                     # the grapheme ends: no character continues it (a separator before a Hangul vowel or final, which
                     # continue only Hangul, does not)
                     f"([^{extender[1:-1]}\\x{{{ord(separator):x}}}]|\\x{{{ord(separator):x}}}{_re2_class(jamo)}|$)"}


GRAPHEME_REPLACEMENT = r"\1\2\3\4"

# Texts on which `SentencePieces.check` compares the in-graph pieces with the training tokenizer's at export: mixed
# case, accents composed and decomposed, several scripts, full-width and compatibility characters, emoji with
# modifiers and joiners, the quotes some converters rewrite (ALBERT's and XLNet's `` and '').
PROBE_TEXTS = (
    "John Smith met MARY in Paris, then McDonald's; iPhone IBM NASA",
    "Café naïve Zürich Ångström Œuvre façade São Paulo Kraków Ærø",
    "Cafe\u0301 nai\u0308ve Vie\u0323\u0302t Nam Hà Nội Sài Gòn",
    "Москва Иван ПЁТР Ελλάδα ΑΘΗΝΑ Αθήνα ὈΔΥΣΣΕΎΣ İstanbul straße STRASSE",
    "東京は日本の首都です。北京也是首都。 서울은 한국의 수도 ｶﾀｶﾅ ＡＢＣ１２３ ①②",
    "مرحبا بالعالم، مُحَمَّد في القاهرة नमस्ते दुनिया, राम दिल्ली में ไทย",
    "😀 john 👍🏽 paris 🇫🇷 👨‍👩‍👧 ❤️ ﬁne ½ ™ ``quoted'' “curly” — …",
)


class SentencePieces(WordSplit):
    """The served tokenizer of a student of a SentencePiece Unigram teacher whose fast tokenizer normalizes as its model
    does (XLM-R, CamemBERT; `check` refuses others, e.g. ALBERT's, XLNet's, DeBERTa-v2's): `WordSplit`'s words
    (as they are in the text) -> the ids of each word's pieces, by tensorflow-text's SentencepieceTokenizer on the
    teacher's SentencePiece model, as the teacher's fast tokenizer gives them for the word alone
    (`is_split_into_words`, data/alignment.word_pieces): "▁" before each word, the model's normalizer
    (after `grapheme_rules`), its Unigram Viterbi, the model's ids mapped to the tokenizer's (`piece_ids`: XLM-R's
    are fairseq's, shifted from the model's). Every word has at least one piece (`unk_id` if it has none)."""

    def __init__(self, model: bytes, piece_ids: Sequence[int], unk_id: int, cls_id: int, sep_id: int, pad_id: int,
                 graphemes: Dict[str, str]):
        super().__init__(lower_case=False)
        self.model = model
        self.sentencepiece = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)
        self._piece_ids = tf.constant(list(piece_ids), tf.int32)
        self._unk = unk_id
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id
        self._graphemes = graphemes
        self.modules = [self.sentencepiece]

    @classmethod
    def of_tokenizer(cls, tokenizer, model_file) -> "SentencePieces":
        """The served tokenizer of a transformers fast tokenizer of a SentencePiece Unigram model (`model_file`,
        the model it was made from: sentencepiece.bpe.model for XLM-R and CamemBERT). A ConfigError in one line when
        a piece the model can output (not a control piece) is not in the tokenizer's vocabulary. `check` tells
        refuses a tokenizer whose pieces the graph does not give."""
        import sentencepiece  # noqa: PLC0415  (the model's piece types; only an export of such a student needs it)

        model = Path(model_file).read_bytes()
        processor = sentencepiece.SentencePieceProcessor(model_proto=model)
        vocab = tokenizer.get_vocab()
        unk = tokenizer.unk_token_id
        # The model's control pieces (<s>, </s>) are never output, and its unknown piece is the tokenizer's unknown.
        pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
        output = [i for i in range(len(pieces)) if not (processor.is_control(i) or processor.is_unknown(i))]
        missing = [pieces[i] for i in output if pieces[i] not in vocab]
        if missing:
            raise ConfigError(f"{model_file}: {len(missing)} of its pieces are not in the tokenizer's vocabulary "
                              f"(e.g. {missing[:5]}), so its ids cannot be the tokenizer's: save the tokenizer and its "
                              "SentencePiece model together (tokenizer.save_pretrained) or export with --format=onnx")
        piece_ids = [vocab.get(piece, unk) for piece in pieces]
        normalizer = tokenizer.backend_tokenizer.normalizer
        return cls(model, piece_ids, unk, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id,
                   grapheme_rules(normalizer.normalize_str if normalizer is not None else None))

    def differences(self, tokenizer, texts: Sequence[str] = PROBE_TEXTS) -> List[Tuple[str, List[str], List[str]]]:
        """(word, the tokenizer's pieces, the served pieces) of each word of `texts` where the pieces this graph gives
        differ from those the student was trained on (`tokenizer` on the served word split: data/wordsplit.split_words,
        data/alignment.word_pieces); none for a tokenizer whose normalizer is the model's own (XLM-R, CamemBERT)."""
        texts = list(texts)
        served = tf.function(lambda t: self.tokenize(t)[0])(tf.constant(texts)).to_list()
        found = []
        for text, offsets, trained, mine in zip(texts, split_words(texts), training_pieces(tokenizer, texts), served):
            for (start, end), expected, got in zip(offsets, trained, mine):
                if expected != got:
                    found.append((text[start:end], tokenizer.convert_ids_to_tokens(expected),
                                  tokenizer.convert_ids_to_tokens(got)))
            if len(mine) != len(trained):
                found.append((text, [], []))
        return found

    def check(self, tokenizer, student_dir) -> None:
        """Refuse, in one line, a tokenizer whose pieces this graph does not give on PROBE_TEXTS (`differences`):
        a SentencePiece Unigram family whose fast tokenizer normalizes otherwise than its model (ALBERT's NFKD, accents
        stripped and lower case; XLNet's NFKD and accents; DeBERTa-v2's lower case)."""
        found = self.differences(tokenizer)
        if found:
            word, expected, got = found[0]
            raise ConfigError(
                f"{student_dir} reads the pieces of {type(tokenizer).__name__} (normalizer {normalizer_name(tokenizer)})"
                f", which the in-graph SentencePiece tokenizer does not give ({len(found)} of the probe words differ, "
                f"e.g. {word!r}: {expected} trained, {got} in the graph; only a normalizer that is the model's own, as "
                "XLM-R's and CamemBERT's, is served in a SavedModel): export it with --format=onnx or --format=tflite, "
                "whose predict.py runs the tokenizer's own normalizer (docs/serving.md)")

    def piece_input(self, text, words, start, end):
        """The words [W] as they are in the text (a NUL too, which SentencePiece reads)."""
        begin = start.to_tensor()
        return tf.RaggedTensor.from_tensor(tf.strings.substr(text[:, None], begin, end.to_tensor() - begin),
                                           lengths=start.row_lengths()).flat_values

    def pieces(self, words):
        """Piece ids [W, (P)] int32 of words [W], at least one per word."""
        rules = self._graphemes
        # Twice: a match reads the character after its grapheme, which may begin the next one.
        for _ in range(2 if "short" in rules else 0):
            words = tf.strings.regex_replace(words, rules["short"], GRAPHEME_REPLACEMENT)
        if "separator" in rules:
            words = tf.strings.regex_replace(words, rules["apart"], rules["separator"] + r"\1")
            for _ in range(2):
                words = tf.strings.regex_replace(words, rules["whole"], r"\1\2\3")
        pieces = self.sentencepiece.tokenize(words)
        pieces = pieces.with_flat_values(tf.gather(self._piece_ids, pieces.flat_values))
        return at_least_one(pieces, self._unk)


def training_pieces(tokenizer, texts: Sequence[str]) -> List[List[List[int]]]:
    """Per text, the ids of each word's pieces as a student of `tokenizer` trained on them: the served word split
    (data/wordsplit.split_words), each word encoded alone (data/alignment.word_pieces)."""
    sentences = [Sentence([text[a:b] for a, b in offsets]) for text, offsets in zip(texts, split_words(texts))]
    return word_pieces(tokenizer, sentences)


def normalizer_name(tokenizer) -> str:
    """The fast tokenizer's normalizer as the names of its steps, e.g. "Replace+NFKD+StripAccents+Lowercase"."""
    normalizer = json.loads(tokenizer.backend_tokenizer.to_str()).get("normalizer")
    if not normalizer:
        return "none"
    steps = normalizer.get("normalizers", [normalizer]) if normalizer["type"] == "Sequence" else [normalizer]
    names = []
    for step in steps:
        if not names or names[-1] != step["type"]:
            names.append(step["type"])
    return "+".join(names)


if __name__ == "__main__":
    write_classes_file()
