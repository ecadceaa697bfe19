"""Readers for the NER file formats the toolkit trains on; each returns list[Sentence].

Files are streamed line by line and decoded as strict UTF-8 one line at a
time, so a bad byte is reported with its line number. Every problem raises a
single DataFormatError naming the file, the 1-based line and what was
expected. See docs/data.md for the formats.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

from xtremedistil_tf.data import schemes
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError, DataFormatError

PathLike = Union[str, Path]
_Block = list[tuple[int, str]]  # (line number, line text) for one sentence

_DOCSTART = "-DOCSTART-"
# WikiAnn prefixes are Wikipedia language codes: "en", "zh-yue", "be-x-old", "simple".
_LANG_CODE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_MISMATCH_POLICIES = ("error", "truncate", "skip")
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


# ---------------------------------------------------------------- line level

def _open_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Yield (line number, text without line ending), decoding each line strictly."""
    path = Path(path)
    if not path.exists():
        raise DataFormatError(path, None, "file does not exist")
    if path.is_dir():
        raise DataFormatError(path, None, "is a directory; expected a data file")
    with open(path, "rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if lineno == 1 and raw[:2] in _UTF16_BOMS:
                    raise DataFormatError(path, 1, "starts with a UTF-16 byte-order mark; expected UTF-8 "
                                                   "(save the file as UTF-8)") from None
                raise DataFormatError(
                    path, lineno,
                    f"invalid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); expected a UTF-8 text file",
                ) from None
            if lineno == 1:
                text = text.lstrip("\ufeff")  # editors on Windows add a byte-order mark
            text = text.rstrip("\r\n")
            if "\r" in text:  # CR-only (old Mac) endings: the whole file would read as one line
                column = text.index("\r") + 1
                raise DataFormatError(path, lineno, f"carriage return inside the line (column {column}); expected "
                                                    "\\n or \\r\\n line endings, not \\r alone")
            yield lineno, text


def _blocks(path: PathLike, skip_docstart: bool = False) -> Iterator[_Block]:
    """Group non-blank lines into blank-line-separated sentences.

    A whitespace-only line counts as blank (the WNUT demo file separates
    tweets with a lone tab). A -DOCSTART- line ends the current sentence and
    is dropped, so the blank line that follows it yields nothing.
    """
    block: _Block = []
    for lineno, line in _open_lines(path):
        if not line.strip() or (skip_docstart and line.startswith(_DOCSTART)):
            if block:
                yield block
                block = []
            continue
        block.append((lineno, line))
    if block:
        yield block


def _require_sentences(path: PathLike, sentences: list[Sentence], what: str) -> list[Sentence]:
    if not sentences:
        raise DataFormatError(path, None, f"empty file: expected {what}")
    return sentences


# ---------------------------------------------------------------- tag checks

class _TagChecker:
    """Checks tags against a scheme's shape, an optional label set and, when strict, its transitions."""

    def __init__(self, path: PathLike, scheme: str, labels: Optional[Iterable[str]], strict: bool):
        self.path = path
        self.scheme = schemes.normalize_scheme(scheme)
        self.labels = None if labels is None else list(labels)
        self._label_lookup = None if labels is None else set(self.labels)
        self.strict = strict
        self._known_good: set[str] = set()  # a file has few distinct tags; check each once

    def check_tag(self, tag: str, lineno: int) -> None:
        if tag in self._known_good:
            return
        problem = schemes.tag_shape_error(tag, self.scheme)
        if problem:
            raise DataFormatError(self.path, lineno, f"{problem} (tag scheme {self.scheme})")
        if self._label_lookup is not None and tag not in self._label_lookup:
            raise DataFormatError(self.path, lineno, f"unknown tag {tag!r}; expected one of {', '.join(self.labels)}")
        self._known_good.add(tag)

    def check_sentence(self, tags: Sequence[str], linenos: Sequence[int]) -> None:
        for tag, lineno in zip(tags, linenos):
            self.check_tag(tag, lineno)
        if self.strict:
            issue = schemes.validate_tags(tags, self.scheme)
            if issue:
                # An unclosed entity is reported at the sentence's last line.
                lineno = linenos[min(issue.position, len(linenos) - 1)]
                raise DataFormatError(self.path, lineno, f"{issue.reason} (strict {self.scheme} check)")


# ---------------------------------------------------------------- readers

def read_conll(
    path: PathLike,
    tag_column: Optional[int] = -1,
    token_column: int = 0,
    scheme: str = "IOB2",
    strict_tags: bool = False,
    labels: Optional[Iterable[str]] = None,
    lang: Optional[str] = None,
) -> list[Sentence]:
    """CoNLL-style column files: whitespace-separated columns, one token per line.

    A blank line ends a sentence; -DOCSTART- lines are skipped. Every token
    line must have as many columns as the first one. `tag_column=None` reads
    tokens only (unlabeled). `labels`, when given, is the closed tag set;
    `strict_tags` also rejects invalid transitions (I- after O in IOB2).
    """
    checker = _TagChecker(path, scheme, labels, strict_tags)
    expected_columns: Optional[tuple[int, int]] = None  # (count, line it was set on)
    sentences = []
    for block in _blocks(path, skip_docstart=True):
        tokens, tags, linenos = [], [], []
        for lineno, line in block:
            columns = line.split()
            if expected_columns is None:
                expected_columns = (len(columns), lineno)
                _check_column_index(path, lineno, columns, token_column, "token_column")
                if tag_column is not None:
                    if len(columns) < 2:
                        raise DataFormatError(
                            path, lineno, f"found 1 column ({columns[0]!r}); a labeled CoNLL file needs "
                            "the token and its tag on each line (unlabeled text goes to --transfer_file)",
                        )
                    _check_column_index(path, lineno, columns, tag_column, "tag_column")
            elif len(columns) != expected_columns[0]:
                raise DataFormatError(
                    path, lineno,
                    f"expected {expected_columns[0]} whitespace-separated columns "
                    f"(as on line {expected_columns[1]}), found {len(columns)}",
                )
            tokens.append(columns[token_column])
            linenos.append(lineno)
            if tag_column is not None:
                tags.append(columns[tag_column])
        if tag_column is not None:
            checker.check_sentence(tags, linenos)
        sentences.append(Sentence(tokens, tags if tag_column is not None else None, lang))
    return _require_sentences(path, sentences, "token lines in CoNLL column format")


def _check_column_index(path: PathLike, lineno: int, columns: list[str], index: int, name: str) -> None:
    if not -len(columns) <= index < len(columns):
        raise DataFormatError(path, lineno, f"{name}={index} but the line has only {len(columns)} columns")


def read_char_bmes(
    path: PathLike,
    scheme: str = "BMES",
    strict_tags: bool = False,
    labels: Optional[Iterable[str]] = None,
    lang: Optional[str] = "zh",
) -> list[Sentence]:
    """Character-level files such as MSRA: `CHAR TAG` per line, blank line between sentences.

    Tokens are the characters. The scheme defaults to BMES (MSRA); char-level
    BIO files work with scheme="IOB2".
    """
    checker = _TagChecker(path, scheme, labels, strict_tags)
    sentences = []
    for block in _blocks(path):
        tokens, tags, linenos = [], [], []
        for lineno, line in block:
            columns = line.split()
            if len(columns) != 2:
                raise DataFormatError(path, lineno, f"expected 'CHAR TAG' (2 columns), found {len(columns)} columns")
            tokens.append(columns[0])
            tags.append(columns[1])
            linenos.append(lineno)
        checker.check_sentence(tags, linenos)
        sentences.append(Sentence(tokens, tags, lang))
    return _require_sentences(path, sentences, "'CHAR TAG' lines")


def read_wikiann(
    path: PathLike,
    scheme: str = "IOB2",
    strict_tags: bool = False,
    labels: Optional[Iterable[str]] = None,
    lang: Optional[str] = None,
) -> list[Sentence]:
    """WikiAnn (Rahimi et al. split): `LANG:TOKEN<TAB>TAG` per line.

    The prefix is stripped from tokens and kept as Sentence.lang; all tokens
    of a sentence must share it, and when `lang` is given it must equal it.
    """
    checker = _TagChecker(path, scheme, labels, strict_tags)
    sentences = []
    for block in _blocks(path):
        tokens, tags, linenos = [], [], []
        sentence_lang = None
        for lineno, line in block:
            fields = line.split("\t")
            if len(fields) != 2:
                raise DataFormatError(
                    path, lineno, f"expected 'LANG:TOKEN<TAB>TAG' (2 tab-separated fields), found {len(fields)}"
                )
            token_lang, token = _split_lang_prefix(path, lineno, fields[0])
            expected = sentence_lang or lang
            if expected is not None and token_lang != expected:
                raise DataFormatError(
                    path, lineno, f"language prefix {token_lang!r} differs from {expected!r} expected for this sentence"
                )
            sentence_lang = token_lang
            tokens.append(token)
            tags.append(fields[1].strip())
            linenos.append(lineno)
        checker.check_sentence(tags, linenos)
        sentences.append(Sentence(tokens, tags, sentence_lang))
    return _require_sentences(path, sentences, "'LANG:TOKEN<TAB>TAG' lines")


def _split_lang_prefix(path: PathLike, lineno: int, field: str) -> tuple[str, str]:
    lang, sep, token = field.partition(":")
    if not sep or not _LANG_CODE.fullmatch(lang):
        raise DataFormatError(path, lineno, f"missing language prefix in {field!r}; expected 'LANG:TOKEN' such as 'en:Paris'")
    if not token:
        raise DataFormatError(path, lineno, f"empty token after language prefix {lang!r}")
    return lang, token


def read_wikiann_dirs(root: PathLike, langs: Sequence[str], split: str = "train", **kwargs) -> list[Sentence]:
    """Read `root/<lang>/<split>` for each language into one list, in the order of `langs`.

    Each file's prefixes must match its folder's language. Extra keyword
    arguments go to read_wikiann.
    """
    sentences = []
    for lang in langs:
        sentences.extend(read_wikiann(Path(root) / lang / split, lang=lang, **kwargs))
    return sentences


def read_xtremedistil_tsv(
    path: PathLike,
    scheme: str = "IOB2",
    strict_tags: bool = False,
    labels: Optional[Iterable[str]] = None,
    on_mismatch: str = "error",
) -> list[Sentence]:
    """XtremeDistil TSV: `space-separated tokens<TAB>space-separated LANG:TAG`, one sentence per line.

    Tokens and tags are split on single spaces as in the authors' code, so
    a double space makes an empty token; empty tokens are dropped with their
    tags (the authors' tokenizer gives them no word pieces, so their tags
    vanish too). The LANG: prefix is optional (lang None without it) but
    must be the same for every tag of a line.

    on_mismatch decides what a line with different token and tag counts
    does: "error" (default), "truncate" to the shorter (what the authors'
    code does, silently; their own train_small.tsv has two such lines), or
    "skip" the line.
    """
    if on_mismatch not in _MISMATCH_POLICIES:
        raise ConfigError(f"on_mismatch={on_mismatch!r}; expected one of {', '.join(_MISMATCH_POLICIES)}")
    checker = _TagChecker(path, scheme, labels, strict_tags)
    sentences = []
    for lineno, line in _open_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataFormatError(path, lineno, f"expected 'TOKENS<TAB>TAGS' (2 tab-separated fields), found {len(fields)}")
        tokens, prefixed_tags = fields[0].split(" "), fields[1].split(" ")
        if len(tokens) != len(prefixed_tags):
            if on_mismatch == "skip":
                continue
            if on_mismatch == "error":
                raise DataFormatError(
                    path, lineno,
                    f"{len(tokens)} tokens but {len(prefixed_tags)} tags; expected one LANG:TAG per space-separated token "
                    "(on_mismatch='truncate' keeps the shorter length as the XtremeDistil code does, 'skip' drops the line)",
                )
            keep = min(len(tokens), len(prefixed_tags))
            tokens, prefixed_tags = tokens[:keep], prefixed_tags[:keep]
        lang, tags = _strip_tag_prefixes(path, lineno, prefixed_tags)
        kept = [i for i, token in enumerate(tokens) if token]
        tokens, tags = [tokens[i] for i in kept], [tags[i] for i in kept]
        if not tokens:
            raise DataFormatError(path, lineno, "no tokens before the tab; expected space-separated tokens")
        checker.check_sentence(tags, [lineno] * len(tags))
        sentences.append(Sentence(tokens, tags, lang))
    return _require_sentences(path, sentences, "'TOKENS<TAB>TAGS' lines")


def _strip_tag_prefixes(path: PathLike, lineno: int, prefixed_tags: list[str]) -> tuple[Optional[str], list[str]]:
    """(language, tags) from LANG:TAG strings; every tag must carry the same prefix or none."""
    first_lang = prefixed_tags[0].rpartition(":")[0] or None
    tags = []
    for item in prefixed_tags:
        lang, _, tag = item.rpartition(":")
        if (lang or None) != first_lang:
            raise DataFormatError(
                path, lineno, f"tag {item!r} has language prefix {lang!r}; expected {first_lang!r} like the line's first tag"
            )
        tags.append(tag)
    return first_lang, tags


def read_unlabeled(path: PathLike, char_level: bool = False, lang: Optional[str] = None) -> list[Sentence]:
    """Plain-text transfer data, one sentence per line; blank lines are skipped.

    Tokens are whitespace-separated words, or with char_level=True the
    non-whitespace characters (Chinese text, whose spaces carry no meaning).
    """
    sentences, tagged = [], []
    for lineno, line in _open_lines(path):
        tokens = [c for c in line if not c.isspace()] if char_level else line.split()
        if tokens:
            sentences.append(Sentence(tokens, None, lang))
            if len(tagged) < _LABELED_PROBE:
                tagged.append((lineno, line) if len(line.split()) >= 2 and _TAG.match(line.split()[-1]) else None)
    _refuse_labeled(path, tagged)
    return _require_sentences(path, sentences, "one sentence per line")


# Labeled CoNLL given as unlabeled text: its first lines (up to this many) all end in a tag column.
_LABELED_PROBE = 20
_TAG = re.compile(r"^(?:O|[BIMES]-\S+)$")


def _refuse_labeled(path: PathLike, tagged: list) -> None:
    """A DataFormatError at the first line when every one of the first non-blank lines (two or more)
    is a token and a tag, as in CoNLL columns (`John B-PER`, `en:John<TAB>B-PER`): the file is labeled data."""
    if len(tagged) >= 2 and all(tagged):
        lineno, line = tagged[0]
        raise DataFormatError(path, lineno, f"{line.strip()!r} is a token and its tag {line.split()[-1]!r}, as are "
                                            f"the next {len(tagged) - 1} lines: this is labeled CoNLL data; expected "
                                            "unlabeled text, one sentence per line")


def read_label_tsv(path: PathLike, lang: Optional[str] = None, **_token_options) -> list[Sentence]:
    """Sentence classification: `LABEL<TAB>text` per line (the paper's section 6.6 data); blank
    lines are skipped. The text is split into words on whitespace; the label is kept as written.

    Token-tagging options (scheme, strict_tags) do not apply and are ignored.
    """
    sentences = []
    for lineno, line in _open_lines(path):
        if not line.strip():
            continue
        label, tab, text = line.partition("\t")
        if not tab:
            raise DataFormatError(path, lineno, "no tab; expected 'LABEL<TAB>text'")
        if not label.strip():
            raise DataFormatError(path, lineno, "empty label before the tab; expected 'LABEL<TAB>text'")
        tokens = text.split()
        if not tokens:
            raise DataFormatError(path, lineno, f"label {label!r} has no text after the tab; expected 'LABEL<TAB>text'")
        sentences.append(Sentence(tokens, None, lang, label.strip()))
    return _require_sentences(path, sentences, "'LABEL<TAB>text' lines")


READERS: dict[str, Callable[..., list[Sentence]]] = {
    "conll": read_conll,
    "char_bmes": read_char_bmes,
    "wikiann": read_wikiann,
    "xtremedistil_tsv": read_xtremedistil_tsv,
    "unlabeled": read_unlabeled,
    "label_tsv": read_label_tsv,
}


def read_dataset(fmt: str, path: PathLike, **kwargs) -> list[Sentence]:
    """Read `path` with the reader registered under `fmt` (a --data_format flag value)."""
    try:
        reader = READERS[fmt]
    except KeyError:
        raise ConfigError(f"unknown data format {fmt!r}; expected one of {', '.join(READERS)}") from None
    return reader(path, **kwargs)
