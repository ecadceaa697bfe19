"""Tag schemes (IOB1, IOB2, BIOES, BMES) and lossless conversion between them.

Every scheme encodes the same thing, a set of non-overlapping typed entity
spans, so conversion goes through spans: `tags_to_spans` decodes, and
`spans_to_tags` encodes. A tag is either "O" or "<prefix>-<type>", the type
being everything after the first "-" (WNUT types such as "geo-loc" contain
dashes).

- IOB2 (BIO): every entity starts with B-, continues with I-.
- IOB1: entities are I- throughout; B- only starts an entity that directly
  follows another entity of the same type (CoNLL-2003's original encoding).
- BIOES: B- begin, I- inside, E- end, S- single-token entity.
- BMES: MSRA's encoding, BIOES with M- in place of I-.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple, Optional, Sequence

IOB1, IOB2, BIOES, BMES = "IOB1", "IOB2", "BIOES", "BMES"
SCHEMES = (IOB1, IOB2, BIOES, BMES)
OUTSIDE = "O"

_ALIASES = {"BIO": IOB2, "IOBES": BIOES}

# Prefixes each scheme may use, in the order label_set lists them.
_PREFIXES = {
    IOB1: ("B", "I"),
    IOB2: ("B", "I"),
    BIOES: ("B", "I", "E", "S"),
    BMES: ("B", "M", "E", "S"),
}
# The "inside" prefix is the only letter that differs between BIOES and BMES.
_INSIDE = {IOB1: "I", IOB2: "I", BIOES: "I", BMES: "M"}

Span = tuple[str, int, int]
"""(entity type, start, end_exclusive) in token positions."""


class TagIssue(NamedTuple):
    """Where a tag sequence first breaks its scheme, and why."""

    position: int
    reason: str


def normalize_scheme(scheme: str) -> str:
    """Canonical scheme name; accepts any case and the aliases BIO and IOBES."""
    name = str(scheme).upper()
    name = _ALIASES.get(name, name)
    if name not in SCHEMES:
        raise ValueError(f"unknown tag scheme {scheme!r}; expected one of {', '.join(SCHEMES)} (or BIO, IOBES)")
    return name


def tag_shape_error(tag: str, scheme: str) -> Optional[str]:
    """Why `tag` cannot occur under `scheme` (None when it can).

    Only the tag's own form is checked; its neighbours are validate_tags' job.
    """
    scheme = normalize_scheme(scheme)
    if tag == OUTSIDE:
        return None
    prefix, sep, etype = tag.partition("-")
    allowed = _PREFIXES[scheme]
    expected = f"'O' or one of {'/'.join(p + '-' for p in allowed)} followed by an entity type"
    if not sep or not etype or any(c.isspace() for c in etype):
        return f"tag {tag!r} is not of the form {expected}"
    if prefix not in allowed:
        return f"tag {tag!r} has prefix {prefix!r}, not valid in {scheme}; expected {expected}"
    return None


def split_tag(tag: str, scheme: str) -> tuple[str, Optional[str]]:
    """("O", None) or (prefix, type); ValueError when the tag does not fit the scheme."""
    problem = tag_shape_error(tag, scheme)
    if problem:
        raise ValueError(problem)
    if tag == OUTSIDE:
        return OUTSIDE, None
    prefix, _, etype = tag.partition("-")
    return prefix, etype


def tags_to_spans(tags: Sequence[str], scheme: str) -> list[Span]:
    """Decode a tag sequence into (type, start, end_exclusive) spans.

    Decoding is lenient in the conlleval way, so that model predictions that
    break the scheme still yield spans: an inside/end tag whose type differs
    from the open entity (or with nothing open) starts a new entity. Use
    validate_tags to reject such sequences instead. Tags whose prefix is not
    part of the scheme raise ValueError.
    """
    scheme = normalize_scheme(scheme)
    spans: list[Span] = []
    open_type: Optional[str] = None
    start = 0

    def close(end: int) -> None:
        nonlocal open_type
        if open_type is not None:
            spans.append((open_type, start, end))
            open_type = None

    for i, tag in enumerate(tags):
        prefix, etype = split_tag(tag, scheme)
        continues = open_type is not None and etype == open_type
        if prefix == OUTSIDE:
            close(i)
        elif prefix == "S":
            close(i)
            spans.append((etype, i, i + 1))
        elif prefix == "B" or not continues:
            close(i)
            open_type, start = etype, i
        if prefix == "E":
            close(i + 1)
        # An inside tag that continues the open entity just lets it grow.
    close(len(tags))
    return spans


def spans_to_tags(spans: Iterable[Span], length: int, scheme: str) -> list[str]:
    """Encode non-overlapping spans as `length` tags under `scheme`."""
    scheme = normalize_scheme(scheme)
    inside = _INSIDE[scheme]
    tags = [OUTSIDE] * length
    previous_end, previous_type = -1, None
    for etype, start, end in sorted(spans, key=lambda s: (s[1], s[2])):
        if not 0 <= start < end <= length:
            raise ValueError(f"span {(etype, start, end)} is empty or outside a sentence of length {length}")
        if start < previous_end:
            raise ValueError(f"span {(etype, start, end)} overlaps the previous span ending at {previous_end}")
        if scheme == IOB2:
            tags[start:end] = ["B-" + etype] + ["I-" + etype] * (end - start - 1)
        elif scheme == IOB1:
            # B- only where it is needed to separate two adjacent same-type entities.
            first = "B" if (start == previous_end and etype == previous_type) else "I"
            tags[start:end] = [f"{first}-{etype}"] + ["I-" + etype] * (end - start - 1)
        elif end - start == 1:
            tags[start] = "S-" + etype
        else:
            tags[start:end] = ["B-" + etype] + [f"{inside}-{etype}"] * (end - start - 2) + ["E-" + etype]
        previous_end, previous_type = end, etype
    return tags


def convert_tags(tags: Sequence[str], source: str, target: str) -> list[str]:
    """Re-encode `tags` from scheme `source` to scheme `target` (via spans)."""
    return spans_to_tags(tags_to_spans(tags, source), len(tags), target)


def to_iob2(tags: Sequence[str], scheme: str) -> list[str]:
    """IOB2 tags for seqeval, whose default mode reads IOB2 (BMES is unknown to it)."""
    return convert_tags(tags, scheme, IOB2)


def validate_tags(tags: Sequence[str], scheme: str) -> Optional[TagIssue]:
    """The first position where `tags` break `scheme`, or None when valid.

    Checks each tag's form, then the transitions: IOB2 forbids I-X unless
    after B-X/I-X; IOB1 forbids B-X unless after I-X/B-X; BIOES/BMES require
    every B-X/inside-X to be continued by inside-X or closed by E-X, and E-X
    or inside-X only inside an open X entity.
    """
    scheme = normalize_scheme(scheme)
    inside = _INSIDE[scheme]
    previous_prefix, previous_type = OUTSIDE, None
    parsed: dict[str, tuple[str, Optional[str]]] = {}  # few distinct tags; parse each once
    for i, tag in enumerate(tags):
        if tag not in parsed:
            problem = tag_shape_error(tag, scheme)
            if problem:
                return TagIssue(i, problem)
            parsed[tag] = split_tag(tag, scheme)
        prefix, etype = parsed[tag]
        reason = _transition_error(scheme, inside, previous_prefix, previous_type, prefix, etype, tag)
        if reason:
            return TagIssue(i, reason)
        previous_prefix, previous_type = prefix, etype
    if scheme in (BIOES, BMES) and previous_prefix in ("B", inside):
        return TagIssue(len(tags), f"entity {previous_type} is not closed with E-{previous_type} at the end of the sentence")
    return None


def _transition_error(scheme, inside, prev_prefix, prev_type, prefix, etype, tag) -> Optional[str]:
    """Why `tag` cannot follow a tag with (prev_prefix, prev_type), or None."""
    if scheme in (IOB1, IOB2):
        restricted = "I" if scheme == IOB2 else "B"
        if prefix == restricted and not (prev_prefix in ("B", "I") and prev_type == etype):
            rule = (f"an entity must start with B-{etype}" if scheme == IOB2
                    else f"B- only separates two adjacent {etype} entities (use I-{etype})")
            return f"{tag} follows {_join(prev_prefix, prev_type)}; in {scheme} {rule}"
        return None
    entity_open = prev_prefix in ("B", inside)
    if entity_open and not (prefix in (inside, "E") and etype == prev_type):
        return (f"{tag} follows {_join(prev_prefix, prev_type)}; expected {inside}-{prev_type} "
                f"or E-{prev_type} to continue or close it")
    if not entity_open and prefix in (inside, "E"):
        return f"{tag} follows {_join(prev_prefix, prev_type)} without a preceding B-{etype}"
    return None


def _join(prefix: str, etype: Optional[str]) -> str:
    return OUTSIDE if prefix == OUTSIDE else f"{prefix}-{etype}"


def entity_types(labels: Iterable[str]) -> list[str]:
    """The sorted entity types named by tags of any scheme (O is ignored).

    Sorted so that a label set built from a file does not depend on which
    type happens to occur first in it.
    """
    types = set()
    for label in labels:
        if label == OUTSIDE:
            continue
        prefix, sep, etype = label.partition("-")
        if not sep or not etype or prefix not in ("B", "I", "M", "E", "S"):
            raise ValueError(f"label {label!r} is not 'O' or B-/I-/M-/E-/S- followed by a type")
        types.add(etype)
    return sorted(types)


def label_set(types: Iterable[str], scheme: str) -> list[str]:
    """["O"] then each type's tags in the scheme's prefix order, types kept in the order given.

    E.g. label_set(["PER", "LOC"], "IOB2") == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"].
    """
    scheme = normalize_scheme(scheme)
    labels = [OUTSIDE]
    for etype in dict.fromkeys(types):
        labels.extend(f"{prefix}-{etype}" for prefix in _PREFIXES[scheme])
    return labels
