"""One word split from data to serving: the data's tokens re-split into the words an exported model makes of text.

An exported model (SavedModel, ONNX, TFLite; docs/serving.md) receives raw text and splits it into words as BERT's
normalizer and pre-tokenizer do: whitespace separates words, each punctuation and CJK character is a word of its own,
control, format and private-use characters (and NUL, U+FFFD) vanish. A data set's own tokens are often coarser
(`O'Brien`, `St.`, `U.S.`, `''`), so a model trained on them is served on words it never saw. `resplit` divides each
token as that split divides it and gives each part a tag that keeps the token's entity, so the words a model is
trained on, scored on and served on are the same (docs/data.md, "One word split").

The split is read from Hugging Face `tokenizers` itself (its BertNormalizer and BertPreTokenizer: the code the
student's BertTokenizerFast and the exports' tokenizer.json run), not from a copy of its rules. It is the cased split;
a lower-casing tokenizer splits the same way except for words made only of combining marks (they vanish when accents
are stripped) and a few accented symbols that become punctuation (e.g. U+1FEF): docs/data.md counts them on the data.
"""
from __future__ import annotations

import functools
from typing import Iterable, List, Sequence, Tuple

from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordLevel

from xtremedistil_tf.data.schemes import OUTSIDE, normalize_scheme, spans_to_tags, split_tag, tags_to_spans
from xtremedistil_tf.data.sentence import Sentence

WORD_SPLITS = ("bert", "none")   # --word_split: BERT's pre-tokenizer (the served split), or the data's own tokens
DEFAULT_WORD_SPLIT = "bert"


@functools.lru_cache(maxsize=None)
def _splitter():
    # A one-entry WordLevel model makes each pre-tokenized word one [UNK] token whose offsets are the word's
    # characters in the original text (the normalizer's removals mapped back).
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                      strip_accents=False, lowercase=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer


def save_splitter(path) -> None:
    """The split as a `tokenizers` tokenizer.json (one [UNK] token per word, with the word's character offsets), which
    the predict.py of ONNX/TFLite exports of non-WordPiece students reads (export/portable.py)."""
    _splitter().save(str(path))


def split_words(texts: Sequence[str]) -> List[List[Tuple[int, int]]]:
    """For each text, the (start, end) character offsets (end exclusive) of its words under BERT's split."""
    encodings = _splitter().encode_batch(list(texts), add_special_tokens=False)
    return [[tuple(offset) for offset in encoding.offsets] for encoding in encodings]


def continue_tags(tag: str, parts: int, scheme: str) -> List[str]:
    """The tags of a token's `parts` words: the entity the token is in goes on through them. The first part keeps
    the token's tag (the last part an E-), the others continue it in `scheme`: IOB1/IOB2 `B-X` -> `B-X I-X ...`;
    BIOES/BMES `S-X` -> `B-X I-X ... E-X`, `B-X` -> `B-X I-X ...`, `E-X` -> `I-X ... E-X` (M for I in BMES)."""
    if parts == 1 or tag == OUTSIDE:
        return [tag] * parts
    scheme = normalize_scheme(scheme)
    prefix, etype = split_tag(tag, scheme)
    inside = "M" if scheme == "BMES" else "I"
    if scheme in ("IOB1", "IOB2"):
        return [tag] + [f"I-{etype}"] * (parts - 1)
    first = {"S": "B", "E": inside}.get(prefix, prefix)
    last = "E" if prefix in ("S", "E") else inside
    return [f"{first}-{etype}"] + [f"{inside}-{etype}"] * (parts - 2) + [f"{last}-{etype}"]


def resplit(sentences: Sequence[Sentence], scheme: str = "IOB2") -> List[Sentence]:
    """`sentences` in BERT's word split. A sentence none of whose tokens the split changes is returned as it is;
    another gets its words, their tags (`continue_tags`; a token that vanishes entirely goes with its tag, and
    the entities are encoded again where that left a sequence the scheme does not allow) and
    `text`: its tokens joined by single spaces, the raw text its words' character offsets index (`word_offsets`).
    Sentence labels (classification) and languages are kept."""
    out = []
    for sentence in sentences:
        # Each token split alone: the split never joins words across a space, so this is the split of the text.
        pieces = split_words(sentence.tokens) if sentence.tokens else []
        if all(len(p) == 1 and p[0] == (0, len(token)) for p, token in zip(pieces, sentence.tokens)):
            out.append(sentence)
            continue
        words, tags = [], [] if sentence.tags is not None else None
        for index, (token, parts) in enumerate(zip(sentence.tokens, pieces)):
            words += [token[start:end] for start, end in parts]
            if tags is not None and parts:
                tags += continue_tags(sentence.tags[index], len(parts), scheme)
        if tags is not None and not all(pieces):
            # A token that vanished took its tag: where that began or ended an entity, encode the entities again.
            tags = spans_to_tags(tags_to_spans(tags, scheme), len(tags), scheme)
        out.append(Sentence(words, tags, sentence.lang, sentence.label, text=" ".join(sentence.tokens)))
    return out


def word_offsets(sentence: Sentence) -> List[Tuple[int, int]]:
    """(start, end) character offsets of the sentence's tokens in `sentence.raw_text` (its `text`, or its tokens
    joined by single spaces): the words, in order, are substrings of it."""
    text, offsets, position = sentence.raw_text, [], 0
    for token in sentence.tokens:
        start = text.find(token, position)
        if start < 0:
            raise ValueError(f"word {token!r} is not in the sentence's text {text!r} after character {position}")
        offsets.append((start, start + len(token)))
        position = start + len(token)
    return offsets


def apply_word_split(sentences: Iterable[Sentence], word_split: str, scheme: str = "IOB2") -> List[Sentence]:
    """`resplit(sentences)` for --word_split=bert, the sentences as they are for none."""
    if word_split not in WORD_SPLITS:
        raise ValueError(f"word_split={word_split!r}; expected one of {', '.join(WORD_SPLITS)}")
    sentences = list(sentences)
    return resplit(sentences, scheme) if word_split == "bert" else sentences
