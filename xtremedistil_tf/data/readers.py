"""Readers for the NER file formats the toolkit trains on; each returns list[Sentence].

Files are streamed line by line and decoded as strict UTF-8 one line at a
time, so a bad byte is reported with its line number. Every problem raises a
single DataFormatError naming the file, the 1-based line and what was
expected. See docs/data.md for the formats.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

from xtremedistil_tf.data import schemes
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.wordsplit import split_words
from xtremedistil_tf.errors import ConfigError, DataFormatError
from xtremedistil_tf.textfile import TextError, text_lines

PathLike = Union[str, Path]
_Block = list[tuple[int, str]]  # (line number, line text) for one sentence

_DOCSTART = "-DOCSTART-"
# WikiAnn prefixes are Wikipedia language codes: "en", "zh-yue", "be-x-old", "simple".
_LANG_CODE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_MISMATCH_POLICIES = ("error", "truncate", "skip")


# ---------------------------------------------------------------- line level

def _open_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Yield (line number, text without line ending): textfile.text_lines, every command's reader of text
    (UTF-8, or UTF-16/32 with a byte-order mark; a binary file or a line past its limit refused; read a line at a
    time), strict: invalid bytes are an error naming the line. A "\\r" inside a line is refused here."""
    path = Path(path)
    if not path.exists():
        raise DataFormatError(path, None, "file does not exist")
    if path.is_dir():
        raise DataFormatError(path, None, "is a directory; expected a data file")
    with open(path, "rb") as handle:
        try:
            for lineno, text in text_lines(handle, path, strict=True):
                if "\r" in text:  # CR-only (old Mac) endings: the whole file would read as one line
                    column = text.index("\r") + 1
                    raise DataFormatError(path, lineno, f"carriage return inside the line (column {column}); "
                                                        "expected \\n or \\r\\n line endings, not \\r alone")
                yield lineno, text
        except TextError as error:
            raise DataFormatError(path, error.line, error.problem) from None


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


# ---------------------------------------------------------------- JSON lines

def _json_record(path: PathLike, lineno: int, line: str) -> dict:
    """One JSON object of a JSON lines file, or a DataFormatError naming the line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataFormatError(path, lineno, f"not JSON ({error.msg} at column {error.colno}); expected one JSON "
                                            "object a line") from None
    if not isinstance(record, dict):
        raise DataFormatError(path, lineno, f"a JSON {type(record).__name__}, not an object; expected one JSON "
                                            "object a line")
    return record


def _json_lines(path: PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSON lines file, read by _open_lines."""
    for lineno, line in _open_lines(path):
        if line.strip():
            yield lineno, _json_record(path, lineno, line)


def _record_lang(record: dict, lang: Optional[str]) -> Optional[str]:
    """A record's language: its `lang` string, the first of its `langs` (Hugging Face wikiann's per-token column),
    else `lang`."""
    found = record.get("lang")
    if found is None and isinstance(record.get("langs"), list) and record["langs"]:
        found = record["langs"][0]
    return found if isinstance(found, str) and found else lang


# ---------------------------------------------------------------- Hugging Face datasets

HF_TOKEN_COLUMNS = ("tokens", "words")
HF_TAG_COLUMNS = ("ner_tags", "tags", "ner", "labels")
# The names a DatasetDict gives our splits (Hugging Face: validation).
HF_SPLITS = {"train": ("train",), "dev": ("validation", "dev", "valid"), "test": ("test",)}
_HF_EXPECTED = ("expected a folder saved by datasets' save_to_disk, a parquet file or a JSON lines file with a "
                f"tokens column ({' or '.join(HF_TOKEN_COLUMNS)}) and a tag column ({', '.join(HF_TAG_COLUMNS)})")


def read_hf(
    path: PathLike,
    scheme: str = "IOB2",
    strict_tags: bool = False,
    labels: Optional[Iterable[str]] = None,
    split: Optional[str] = None,
    lang: Optional[str] = None,
) -> list[Sentence]:
    """A Hugging Face token-classification dataset: a folder written by `Dataset.save_to_disk` (a `DatasetDict`'s
    folder too: the split named `split`, train / dev (validation) / test), a parquet file (`Dataset.to_parquet`),
    or a JSON lines file of objects. Tokens come from the `tokens` (or `words`) column, tags from `ner_tags` (or
    `tags`, `ner`, `labels`): ids named by the column's `ClassLabel` feature, or tag strings. The language from a
    `lang` column or the first of `langs` (wikiann's).

    Tags in another scheme than `scheme` (BIOES names in an IOB2 run) are detected from the tag names and
    converted; tags no scheme reads are an error. Lines are rows (1-based) for a folder or a parquet file."""
    path = Path(path)
    if not path.exists():
        raise DataFormatError(path, None, f"does not exist; {_HF_EXPECTED}")
    if path.is_dir() or _is_parquet(path):
        names, rows = _hf_arrow_rows(path, split)
    else:
        names, rows = None, _json_lines(path)
    found, columns = [], None
    for lineno, record in rows:
        if columns is None:   # the columns of the first row (a folder's or parquet file's: of every row)
            columns = (_column(path, lineno, record, HF_TOKEN_COLUMNS, "tokens"),
                       _column(path, lineno, record, HF_TAG_COLUMNS, "tag"))
        tokens_key, tags_key = columns
        for key in columns:
            if key not in record:
                raise DataFormatError(path, lineno, f"no {key!r} column (this line has {', '.join(record) or 'none'}); "
                                                    f"expected {key!r} as on the first line")
        tokens = _hf_tokens(path, lineno, record[tokens_key], tokens_key)
        tags = _hf_tags(path, lineno, record[tags_key], tags_key, names)
        if len(tags) != len(tokens):
            raise DataFormatError(path, lineno, f"{len(tokens)} {tokens_key} but {len(tags)} {tags_key}; expected "
                                                "one tag per token")
        found.append((lineno, tokens, tags, _record_lang(record, lang)))
    if not found:
        raise DataFormatError(path, None, f"empty: no rows; {_HF_EXPECTED}")
    source = _hf_scheme(path, names or sorted({t for _, _, tags, _ in found for t in tags}), scheme, found)
    checker = _TagChecker(path, source, None, strict_tags)
    closed = _TagChecker(path, scheme, labels, False) if labels is not None else None
    sentences = []
    for lineno, tokens, tags, sentence_lang in found:
        checker.check_sentence(tags, [lineno] * len(tags))
        if source != schemes.normalize_scheme(scheme):
            tags = schemes.convert_tags(tags, source, scheme)
        if closed:
            closed.check_sentence(tags, [lineno] * len(tags))
        sentences.append(Sentence(tokens, tags, sentence_lang))
    return sentences


def _is_parquet(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == b"PAR1"


def _column(path: PathLike, lineno: int, record: dict, candidates: Sequence[str], what: str) -> str:
    for name in candidates:
        if name in record:
            return name
    raise DataFormatError(path, lineno, f"no {what} column (columns: {', '.join(record) or 'none'}); expected one of "
                                        f"{', '.join(candidates)}")


def _hf_arrow_rows(path: Path, split: Optional[str]):
    """(tag names or None, (row number, {column: value}) of each row) of a save_to_disk folder or a parquet file,
    read with the `datasets` library (local files only)."""
    try:
        import datasets
        import pyarrow.parquet as pq
    except ImportError:
        raise DataFormatError(path, None, "reading a Hugging Face dataset needs the `datasets` package: pip install "
                                          "'xtremedistil_tf[hf]' (or the datasets version in requirements.txt)") from None
    if path.is_dir():
        if (path / "dataset_dict.json").exists():
            have = sorted(p.name for p in path.iterdir() if p.is_dir())
            name = next((n for n in HF_SPLITS.get(split or "", (split,)) if n in have), None) if split else None
            if name is None:
                raise DataFormatError(path, None, f"a DatasetDict (splits: {', '.join(have)}) and no split of it was "
                                                  f"named{f' for {split}' if split else ''}; name the split's folder, "
                                                  f"e.g. {path / (have[0] if have else 'train')}")
            path = path / name
        if not (path / "state.json").exists():
            raise DataFormatError(path, None, f"a folder without state.json, so not one datasets' save_to_disk wrote; "
                                              f"{_HF_EXPECTED}")
        try:
            dataset = datasets.load_from_disk(str(path))
        except Exception as error:  # noqa: BLE001  (datasets and pyarrow raise several types for a damaged folder)
            raise DataFormatError(path, None, f"datasets could not load it ({type(error).__name__}: "
                                              f"{' '.join(str(error).split())[:200]})") from None
        features, table = dataset.features, dataset.with_format("arrow")[:]
    else:
        try:
            table = pq.read_table(path)
        except Exception as error:  # noqa: BLE001  (pyarrow's ArrowInvalid, OSError)
            raise DataFormatError(path, None, f"not a readable parquet file ({' '.join(str(error).split())[:200]})") \
                from None
        features = datasets.Features.from_arrow_schema(table.schema)
    tag_key = next((name for name in HF_TAG_COLUMNS if name in features), None)
    tag_feature = getattr(features[tag_key], "feature", None) if tag_key else None
    names = list(tag_feature.names) if isinstance(tag_feature, datasets.ClassLabel) else None
    for what, candidates in (("tokens", HF_TOKEN_COLUMNS), ("tag", HF_TAG_COLUMNS)):
        if not any(c in table.column_names for c in candidates):
            raise DataFormatError(path, None, f"no {what} column (columns: {', '.join(table.column_names)}); "
                                              f"expected one of {', '.join(candidates)}")
    wanted = [c for c in (*HF_TOKEN_COLUMNS, *HF_TAG_COLUMNS, "lang", "langs") if c in table.column_names]
    values = {column: table.column(column).to_pylist() for column in wanted}
    rows = ((row + 1, {column: values[column][row] for column in wanted}) for row in range(table.num_rows))
    return names, rows


def _hf_tokens(path: PathLike, lineno: int, tokens, key: str) -> list[str]:
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise DataFormatError(path, lineno, f"{key} is {json.dumps(tokens)[:80]}; expected a list of strings")
    if not tokens:
        raise DataFormatError(path, lineno, f"no tokens (an empty {key} list); expected a sentence's tokens")
    for index, token in enumerate(tokens):
        if not token.strip():
            raise DataFormatError(path, lineno, f"token {index + 1} is {token!r}; expected a word")
    return tokens


def _hf_tags(path: PathLike, lineno: int, tags, key: str, names: Optional[list[str]]) -> list[str]:
    if not isinstance(tags, list):
        raise DataFormatError(path, lineno, f"{key} is {json.dumps(tags)[:80]}; expected a list of tags")
    out = []
    for tag in tags:
        if isinstance(tag, str):
            out.append(tag)
        elif isinstance(tag, int) and not isinstance(tag, bool):
            if names is None:
                raise DataFormatError(path, lineno, f"tag id {tag} but no tag names: a JSON lines file (or a dataset "
                                                    "without a ClassLabel feature) must give tags as strings such as "
                                                    "'B-PER'; a folder saved by save_to_disk or a parquet file names "
                                                    "its ids in the ClassLabel feature")
            if not 0 <= tag < len(names):
                ignored = " (-100 marks word pieces a tokenized dataset ignores: give the words' tags)" \
                    if tag == -100 else ""
                raise DataFormatError(path, lineno, f"unknown tag id {tag}{ignored}; the ClassLabel feature of "
                                                    f"{key} names {len(names)} tags, ids 0 to {len(names) - 1}")
            out.append(names[tag])
        else:
            raise DataFormatError(path, lineno, f"tag {json.dumps(tag)} in {key}; expected a tag string or a "
                                                "ClassLabel id")
    return out


def _hf_scheme(path: PathLike, tag_names: Sequence[str], scheme: str, found: list) -> str:
    """The scheme the data's tags are in: the run's when they fit it, else the first of IOB2, BIOES, BMES they all
    fit (converted to the run's then); the run's when none does (its checker reports the first tag that breaks it)."""
    scheme = schemes.normalize_scheme(scheme)
    for candidate in (scheme, schemes.IOB2, schemes.BIOES, schemes.BMES):
        if all(schemes.tag_shape_error(tag, candidate) is None for tag in tag_names):
            return candidate
    return scheme


# ---------------------------------------------------------------- text with character spans

SPAN_KEYS = ("entities", "spans", "label")
SPAN_ALIGNMENTS = ("refuse", "snap")
_SPAN_FORM = "[start, end, label] or {\"start\": .., \"end\": .., \"label\": ..}"
_SNAP_NOTES = 10   # snapped spans named one a line; more are counted


def read_spans_jsonl(
    path: PathLike,
    scheme: str = "IOB2",
    strict_tags: bool = False,
    labels: Optional[Iterable[str]] = None,
    span_alignment: str = "refuse",
    lang: Optional[str] = None,
) -> list[Sentence]:
    """Raw text with character-offset entity spans, a JSON object a line, as annotation tools export it: `text` and
    one of `entities` (spaCy), `spans` (Prodigy, spaCy) or `label` (doccano), a list of `[start, end, label]` or of
    objects with `start`/`end` (`start_offset`/`end_offset`) and `label`; end exclusive, in characters.

    The words are the served word split of the text (wordsplit.split_words: what an exported model makes of it),
    tagged in `scheme`. A span whose ends cut a word is refused with its line, or with span_alignment="snap"
    widened to the words it touches (each named on stderr); overlapping spans, a span past the text's end, an
    empty text, a Prodigy example whose `answer` is not "accept" are refused with their line. `lang` (or a
    record's `lang`) is the sentences' language."""
    if span_alignment not in SPAN_ALIGNMENTS:
        raise ConfigError(f"span_alignment={span_alignment!r}; expected one of {', '.join(SPAN_ALIGNMENTS)}")
    checker = _TagChecker(path, scheme, labels, strict_tags)
    rows = []
    for lineno, record in _json_lines(path):
        text = record.get("text")
        if "text" not in record:
            raise DataFormatError(path, lineno, f"no 'text' (keys: {', '.join(record) or 'none'}); expected "
                                                f"{{\"text\": ..., \"entities\": [{_SPAN_FORM}, ...]}}")
        if not isinstance(text, str) or not text.strip():
            raise DataFormatError(path, lineno, f"text is {json.dumps(text)[:40]}; expected a non-empty string")
        answer = record.get("answer", "accept")
        if answer != "accept":
            raise DataFormatError(path, lineno, f"answer {answer!r}: an example the annotator did not accept; "
                                                "expected accepted examples only (export them alone)")
        keys = [key for key in SPAN_KEYS if key in record]
        if len(keys) != 1:
            found = f"both {keys[0]!r} and {keys[1]!r}" if keys else "no 'entities', 'spans' or 'label'"
            raise DataFormatError(path, lineno, f"{found}; expected one of them: a list of {_SPAN_FORM} ([] for a "
                                                "text without entities)")
        spans = record[keys[0]]
        if not isinstance(spans, list):
            raise DataFormatError(path, lineno, f"{keys[0]} is {json.dumps(spans)[:60]}; expected a list of "
                                                f"{_SPAN_FORM}")
        rows.append((lineno, text, [_char_span(path, lineno, item, text) for item in spans],
                     _record_lang(record, lang)))
    if not rows:
        raise DataFormatError(path, None, "empty file: expected JSON lines of {\"text\": ..., \"entities\": [...]}")
    sentences, snapped = [], []
    for start in range(0, len(rows), 1024):   # the word split a batch at a time
        batch = rows[start:start + 1024]
        for (lineno, text, spans, sentence_lang), words in zip(batch, split_words([row[1] for row in batch])):
            if not words:
                raise DataFormatError(path, lineno, f"text {text[:40]!r} has no words (only characters the word "
                                                    "split drops); expected a non-empty text")
            word_spans = _word_spans(path, lineno, text, spans, words, span_alignment, snapped)
            tokens = [text[a:b] for a, b in words]
            tags = schemes.spans_to_tags(word_spans, len(tokens), scheme)
            checker.check_sentence(tags, [lineno] * len(tags))
            sentences.append(Sentence(tokens, tags, sentence_lang, text=None if " ".join(tokens) == text else text))
    for lineno, message in snapped[:_SNAP_NOTES]:
        print(f"note: {path}:{lineno}: {message}", file=sys.stderr, flush=True)
    if len(snapped) > _SNAP_NOTES:
        print(f"note: {path}: {len(snapped) - _SNAP_NOTES} more spans snapped to word boundaries", file=sys.stderr,
              flush=True)
    return sentences


def _char_span(path: PathLike, lineno: int, item, text: str) -> tuple[int, int, str]:
    """(start, end, label) of one span in either form, checked against the text."""
    if isinstance(item, dict):
        start, end = item.get("start", item.get("start_offset")), item.get("end", item.get("end_offset"))
        label = item.get("label")
        if label is None and isinstance(item.get("labels"), list) and len(item["labels"]) == 1:
            label = item["labels"][0]   # Label Studio's value
    elif isinstance(item, list) and len(item) == 3:
        start, end, label = item
    else:
        raise DataFormatError(path, lineno, f"span {json.dumps(item)[:60]}; expected {_SPAN_FORM}")
    shown = json.dumps([start, end, label], ensure_ascii=False)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)):
        raise DataFormatError(path, lineno, f"span {shown}: start and end must be integers (character offsets); "
                                            f"expected {_SPAN_FORM}")
    if not isinstance(label, str) or not label or any(c.isspace() for c in label):
        raise DataFormatError(path, lineno, f"span {shown}: label {json.dumps(label, ensure_ascii=False)}; expected "
                                            "an entity type such as 'PER' (no whitespace)")
    if end > len(text):
        raise DataFormatError(path, lineno, f"span {shown} ends past the text's end ({len(text)} characters)")
    if not 0 <= start < end:
        raise DataFormatError(path, lineno, f"span {shown} is empty or starts before the text; expected "
                                            "0 <= start < end (end exclusive)")
    return start, end, label


def _word_spans(path: PathLike, lineno: int, text: str, spans: list, words: list, alignment: str,
                snapped: list) -> list[schemes.Span]:
    """The spans as (label, first word, last word + 1), in text order; misaligned and overlapping spans refused (or,
    misaligned, snapped and noted in `snapped`)."""
    out, previous = [], None
    for start, end, label in sorted(spans):
        shown = json.dumps([start, end, label], ensure_ascii=False)
        if previous and start < previous[1]:
            raise DataFormatError(path, lineno, f"spans {json.dumps(list(previous), ensure_ascii=False)} and {shown} "
                                                "overlap; expected non-overlapping entities")
        previous = (start, end, label)
        touched = [i for i, (a, b) in enumerate(words) if a < end and b > start]
        if not touched:
            raise DataFormatError(path, lineno, f"span {shown} ({text[start:end]!r}) covers no word; expected a span "
                                                "over words")
        first, last = words[touched[0]][0], words[touched[-1]][1]
        if first < start or last > end:
            cut = (f"span {shown} ({text[start:end]!r}) cuts a word: its words are {text[first:last]!r} "
                   f"[{first}, {last}]")
            if alignment == "refuse":
                raise DataFormatError(path, lineno, f"{cut}; fix its offsets, or --span_alignment=snap widens it to "
                                                    "them")
            snapped.append((lineno, f"{cut}, snapped to them"))
        if out and touched[0] < out[-1][2]:
            raise DataFormatError(path, lineno, f"span {shown} shares a word with the span before it once snapped to "
                                                "word boundaries; expected non-overlapping entities")
        out.append((label, touched[0], touched[-1] + 1))
    return out


def reader_kwargs(fmt: str, scheme: str, strict_tags: bool, split: str, span_alignment: str = "refuse") -> dict:
    """What the data flags tell the reader of --data_format=`fmt` for `split` (train, dev, test): bin/train's,
    bin/evaluate's and the TFDS builders' one place for it. hf: the split's name picks it from a DatasetDict folder; spans_jsonl: how a
    span that cuts a word is read."""
    kwargs = {"scheme": scheme, "strict_tags": strict_tags}
    if fmt == "hf":
        kwargs["split"] = split
    if fmt == "spans_jsonl":
        kwargs["span_alignment"] = span_alignment
    return kwargs


READERS: dict[str, Callable[..., list[Sentence]]] = {
    "conll": read_conll,
    "char_bmes": read_char_bmes,
    "wikiann": read_wikiann,
    "xtremedistil_tsv": read_xtremedistil_tsv,
    "unlabeled": read_unlabeled,
    "label_tsv": read_label_tsv,
    "hf": read_hf,
    "spans_jsonl": read_spans_jsonl,
}


def read_dataset(fmt: str, path: PathLike, **kwargs) -> list[Sentence]:
    """Read `path` with the reader registered under `fmt` (a --data_format flag value)."""
    try:
        reader = READERS[fmt]
    except KeyError:
        raise ConfigError(f"unknown data format {fmt!r}; expected one of {', '.join(READERS)}") from None
    return reader(path, **kwargs)
