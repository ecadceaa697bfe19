"""Mapping a fine-tuned checkpoint's own labels (`config.id2label`) onto the data's labels.

Pure functions; `teachers/pretrained.py` applies them to logits and predictions.

Entity types are matched by a normalised name: case-insensitive, with the synonyms PER/PERSON,
LOC/LOCATION, ORG/ORGANIZATION/ORGANISATION and MISC/MISCELLANEOUS, so `B-PER`, `B-person` and an
IO label `PERSON` all name the data's `PER`. The checkpoint's scheme is read from its prefixes:
no prefixes is IO (every entity word is `I-` under IOB1 decoding), B-/I- is IOB2 (IOB1 reads the
same spans under lenient decoding), E-/S- is BIOES, M- is BMES.

Two outputs per mapping:
- the **column map** (`TokenLabelMap.sources`): for each data label, the checkpoint columns whose
  log-sum-exp is its logit (the softmax over the data columns is then the checkpoint's
  probability summed over those columns). A data prefix takes the checkpoint's same prefix (M
  and I count as one), plus any checkpoint prefix of its family (begin: B, S; inside: I, M, E)
  that the data scheme lacks; a data prefix with neither borrows its family's checkpoint
  columns (BIOES data from an IOB2 checkpoint: S- reads B-, E- reads I-), and an IO checkpoint's
  one column feeds every prefix of its type. "O" reads "O" and every column of an extra
  checkpoint type.
- the **word decoding** (`TokenLabelMap.word_labels`, `to_data_scheme`): the checkpoint's argmax label of each word,
  with its type renamed to the data's, as a sequence in the checkpoint's scheme converted to the
  data's scheme through spans (data/schemes.py). Word predictions are thus the checkpoint's own
  argmax whatever the two schemes are.

A data entity type that no checkpoint label produces is an error naming both label sets: the
teacher could never predict it. A checkpoint type with no data type (MISC of a CoNLL checkpoint
on PER/LOC/ORG data) reads as O, and the mapping lists it in `dropped` so that the caller logs it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from xtremedistil_tf.data.schemes import BIOES, BMES, IOB1, IOB2, OUTSIDE, convert_tags, normalize_scheme
from xtremedistil_tf.errors import ConfigError

IO = "IO"
PREFIXES = ("B", "I", "M", "E", "S")
SYNONYMS = {"PERSON": "PER", "PERS": "PER", "LOCATION": "LOC", "ORGANIZATION": "ORG", "ORGANISATION": "ORG",
            "MISCELLANEOUS": "MISC"}
_FAMILY = {"B": "begin", "S": "begin", "I": "inside", "E": "inside"}


def canonical_type(name: str) -> str:
    """The name entity types are matched by: upper case, synonyms folded (person -> PER)."""
    key = name.strip().upper().replace("_", "-")
    return SYNONYMS.get(key, key)


def split_label(label: str) -> Tuple[str, Optional[str]]:
    """("O", None) for the outside label (any case), (prefix, type) for a prefixed label, and
    ("", type) for an IO label without a prefix (`PER`, `person`, `geo-loc`)."""
    if label.strip().upper() == OUTSIDE:
        return OUTSIDE, None
    prefix, sep, etype = label.partition("-")
    if sep and etype and prefix.upper() in PREFIXES:
        return prefix.upper(), etype
    return "", label


def detect_scheme(labels: Sequence[str]) -> str:
    """The tag scheme a checkpoint's labels are in: IO, IOB2, BIOES or BMES."""
    prefixes = {split_label(label)[0] for label in labels} - {OUTSIDE}
    if "M" in prefixes:
        return BMES
    if prefixes & {"E", "S"}:
        return BIOES
    if prefixes & {"B", "I"}:
        return IOB2
    return IO


def _mixed_prefixes(labels: Sequence[str]) -> List[str]:
    """Labels without a prefix in a label set that also has prefixed ones (unreadable as a scheme)."""
    parts = [split_label(label) for label in labels]
    if any(p not in ("", OUTSIDE) for p, _ in parts):
        return [label for label, (p, _) in zip(labels, parts) if p == ""]
    return []


def _inside(prefix: str) -> str:
    return "I" if prefix == "M" else prefix


def _sources_of_prefix(data_prefix: str, data_prefixes: set, checkpoint_prefixes: set) -> set:
    """The checkpoint prefixes (M folded into I) whose columns feed a data prefix (see module doc)."""
    p = _inside(data_prefix)
    family = _FAMILY[p]
    chosen = {p} & checkpoint_prefixes
    chosen |= {q for q in checkpoint_prefixes - data_prefixes if _FAMILY.get(q) == family}
    if not chosen:
        chosen = {q for q in checkpoint_prefixes if _FAMILY.get(q) == family} or set(checkpoint_prefixes)
    return chosen


@dataclass
class TokenLabelMap:
    """How a token-classification checkpoint's columns read as the data's labels."""

    checkpoint_labels: List[str]
    data_labels: List[str]
    data_scheme: str
    checkpoint_scheme: str          # IO, IOB2, BIOES or BMES
    sources: List[List[int]]        # per data label: the checkpoint columns it reads
    word_labels: List[str]          # per checkpoint column: its tag in decoding_scheme, data type names
    dropped: List[str]              # checkpoint types with no data type (read as O)

    @property
    def decoding_scheme(self) -> str:
        """The scheme `word_labels` are in (an IO checkpoint's `I-` tags decode as IOB1)."""
        return IOB1 if self.checkpoint_scheme == IO else self.checkpoint_scheme

    def to_data_scheme(self, tags: Sequence[str]) -> List[str]:
        """One sentence's tags from `word_labels` (decoding_scheme) re-encoded in the data's scheme."""
        tags = list(tags)
        return tags if self.decoding_scheme == self.data_scheme else \
            convert_tags(tags, self.decoding_scheme, self.data_scheme)

    def describe(self) -> str:
        return (f"checkpoint labels {self.checkpoint_labels} ({self.checkpoint_scheme}) -> data labels "
                f"{self.data_labels} ({self.data_scheme})")


def _unmappable(checkpoint_labels: Sequence[str], data_labels: Sequence[str], why: str) -> ConfigError:
    return ConfigError(f"the teacher checkpoint's labels {list(checkpoint_labels)} cannot be mapped onto the "
                       f"data's labels {list(data_labels)}: {why}")


def token_label_map(checkpoint_labels: Sequence[str], data_labels: Sequence[str], data_scheme: str) -> TokenLabelMap:
    """The column map and word decoding from a checkpoint's labels (id order) onto `data_labels`
    (tags of `data_scheme`); ConfigError naming both sets when they cannot be mapped."""
    data_scheme = normalize_scheme(data_scheme)
    checkpoint_labels = list(checkpoint_labels)
    mixed = _mixed_prefixes(checkpoint_labels)
    if mixed:
        raise _unmappable(checkpoint_labels, data_labels, f"{mixed} have no B-/I-/M-/E-/S- prefix while other "
                                                          "labels do")
    parts = [split_label(label) for label in checkpoint_labels]
    outside = [i for i, (p, _) in enumerate(parts) if p == OUTSIDE]
    if len(outside) != 1:
        raise _unmappable(checkpoint_labels, data_labels, "it needs exactly one outside label 'O'")
    scheme = detect_scheme(checkpoint_labels)

    data_types: Dict[str, str] = {}
    for label in data_labels:
        if label != OUTSIDE:
            etype = label.partition("-")[2]
            data_types.setdefault(canonical_type(etype), etype)
    checkpoint_types = {canonical_type(t) for p, t in parts if p != OUTSIDE}
    missing = [t for key, t in data_types.items() if key not in checkpoint_types]
    if missing:
        raise _unmappable(checkpoint_labels, data_labels, f"no checkpoint label produces the data's entity "
                                                          f"type(s) {missing}")
    dropped = sorted({t for p, t in parts if p != OUTSIDE and canonical_type(t) not in data_types})

    # Checkpoint columns by (folded prefix, canonical type); IO labels count as I-.
    columns: Dict[Tuple[str, str], List[int]] = {}
    for i, (p, t) in enumerate(parts):
        if p != OUTSIDE and canonical_type(t) in data_types:
            columns.setdefault((_inside(p or "I"), canonical_type(t)), []).append(i)
    prefixes_of: Dict[str, set] = {}
    for (p, key) in columns:
        prefixes_of.setdefault(key, set()).add(p)
    data_prefixes = {_inside(label.partition("-")[0]) for label in data_labels if label != OUTSIDE}

    sources: List[List[int]] = []
    for label in data_labels:
        if label == OUTSIDE:
            sources.append(outside + [i for i, (p, t) in enumerate(parts)
                                      if p != OUTSIDE and canonical_type(t) not in data_types])
            continue
        prefix, _, etype = label.partition("-")
        key = canonical_type(etype)
        chosen = _sources_of_prefix(prefix, data_prefixes, prefixes_of[key])
        sources.append(sorted(i for q in chosen for i in columns[(q, key)]))

    decoding = IOB1 if scheme == IO else scheme
    word_labels = []
    for p, t in parts:
        if p == OUTSIDE or canonical_type(t) not in data_types:
            word_labels.append(OUTSIDE)
        else:
            word_labels.append(f"{p or 'I'}-{data_types[canonical_type(t)]}")
    if decoding == BMES:  # BMES has no I-: an odd checkpoint mixing I- and M- reads I- as M-
        word_labels = [f"M-{w[2:]}" if w.startswith("I-") else w for w in word_labels]
    elif decoding in (IOB1, IOB2, BIOES):
        word_labels = [f"I-{w[2:]}" if w.startswith("M-") else w for w in word_labels]
    return TokenLabelMap(checkpoint_labels, list(data_labels), data_scheme, scheme, sources, word_labels, dropped)


def class_label_map(checkpoint_labels: Sequence[str], data_labels: Sequence[str]) -> Tuple[List[int], List[str]]:
    """(the checkpoint column of each data class, the checkpoint classes no data class reads).

    Classes match by name, case-insensitively (`POSITIVE` is `positive`); a data class the
    checkpoint does not have is an error naming both sets."""
    index = {}
    for i, label in enumerate(checkpoint_labels):
        index.setdefault(label.strip().lower(), i)
    missing = [label for label in data_labels if label.strip().lower() not in index]
    if missing:
        raise _unmappable(checkpoint_labels, data_labels, f"the checkpoint has no class {missing}")
    columns = [index[label.strip().lower()] for label in data_labels]
    dropped = [label for i, label in enumerate(checkpoint_labels) if i not in columns]
    return columns, dropped


__all__ = ["IO", "IOB1", "IOB2", "BIOES", "BMES", "TokenLabelMap", "canonical_type", "class_label_map",
           "detect_scheme", "split_label", "token_label_map"]
