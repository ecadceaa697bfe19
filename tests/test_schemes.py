"""Tag schemes: known encodings, round trips through spans, validation."""
import random

import pytest

from xtremedistil_tf.data import schemes
from xtremedistil_tf.data.schemes import (
    TagIssue,
    convert_tags,
    entity_types,
    label_set,
    spans_to_tags,
    tags_to_spans,
    to_iob2,
    validate_tags,
)

# One sentence, four encodings: PER(0,2), adjacent PER(2,3), O, LOC(4,5), ORG(5,8).
SPANS = [("PER", 0, 2), ("PER", 2, 3), ("LOC", 4, 5), ("ORG", 5, 8)]
ENCODED = {
    "IOB2": ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG", "I-ORG", "I-ORG"],
    "IOB1": ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG", "I-ORG"],
    "BIOES": ["B-PER", "E-PER", "S-PER", "O", "S-LOC", "B-ORG", "I-ORG", "E-ORG"],
    "BMES": ["B-PER", "E-PER", "S-PER", "O", "S-LOC", "B-ORG", "M-ORG", "E-ORG"],
}


@pytest.mark.parametrize("scheme", schemes.SCHEMES)
def test_known_encoding_both_ways(scheme):
    assert spans_to_tags(SPANS, 8, scheme) == ENCODED[scheme]
    assert tags_to_spans(ENCODED[scheme], scheme) == SPANS
    assert validate_tags(ENCODED[scheme], scheme) is None


@pytest.mark.parametrize("source", schemes.SCHEMES)
@pytest.mark.parametrize("target", schemes.SCHEMES)
def test_convert_known_example(source, target):
    assert convert_tags(ENCODED[source], source, target) == ENCODED[target]


def test_msra_style_bmes_to_iob2():
    tags = ["B-NT", "M-NT", "M-NT", "E-NT", "O", "S-NR", "B-NS", "E-NS"]
    assert to_iob2(tags, "BMES") == ["B-NT", "I-NT", "I-NT", "I-NT", "O", "B-NR", "B-NS", "I-NS"]


def _random_spans(rng: random.Random, length: int, types) -> list:
    """Non-overlapping spans, often adjacent and often of the same type (IOB1's hard case)."""
    spans, position = [], 0
    while position < length:
        position += rng.choice([0, 0, 1, 2])
        if position >= length:
            break
        end = min(length, position + rng.choice([1, 1, 2, 3, 5]))
        spans.append((rng.choice(types), position, end))
        position = end
    return spans


def test_round_trip_property_on_random_spans():
    rng = random.Random(20240601)
    cycle = ["IOB2", "BIOES", "BMES", "IOB1", "IOB2"]
    checked = 0
    for _ in range(2000):
        length = rng.randint(0, 15)
        spans = _random_spans(rng, length, ["PER", "LOC", "geo-loc"])
        for scheme in schemes.SCHEMES:
            tags = spans_to_tags(spans, length, scheme)
            assert len(tags) == length
            assert validate_tags(tags, scheme) is None, (scheme, tags)
            assert tags_to_spans(tags, scheme) == spans
        tags = spans_to_tags(spans, length, cycle[0])
        for source, target in zip(cycle, cycle[1:]):
            tags = convert_tags(tags, source, target)
            assert tags_to_spans(tags, target) == spans
        assert tags == spans_to_tags(spans, length, "IOB2")
        checked += bool(spans)
    assert checked > 1500  # the generator really produced entities


def test_lenient_decoding_of_invalid_predictions():
    # conlleval-style: an I- after O (or after another type) starts an entity.
    assert tags_to_spans(["O", "I-PER", "I-PER", "I-LOC"], "IOB2") == [("PER", 1, 3), ("LOC", 3, 4)]
    assert tags_to_spans(["B-PER", "O", "E-PER"], "BIOES") == [("PER", 0, 1), ("PER", 2, 3)]
    assert tags_to_spans(["B-ORG", "M-ORG"], "BMES") == [("ORG", 0, 2)]
    # After E- the entity is closed, so an inside tag starts a new one.
    assert tags_to_spans(["B-ORG", "E-ORG", "M-ORG"], "BMES") == [("ORG", 0, 2), ("ORG", 2, 3)]


@pytest.mark.parametrize(
    "tags, scheme, expected",
    [
        (["O", "I-PER"], "IOB2", TagIssue(1, "I-PER follows O; in IOB2 an entity must start with B-PER")),
        (["B-LOC", "I-PER"], "IOB2", TagIssue(1, "I-PER follows B-LOC; in IOB2 an entity must start with B-PER")),
        (["O", "B-LOC"], "IOB1",
         TagIssue(1, "B-LOC follows O; in IOB1 B- only separates two adjacent LOC entities (use I-LOC)")),
        (["M-NR"], "BMES", TagIssue(0, "M-NR follows O without a preceding B-NR")),
        (["B-NR", "O"], "BMES", TagIssue(1, "O follows B-NR; expected M-NR or E-NR to continue or close it")),
        (["B-NR", "M-NR"], "BMES", TagIssue(2, "entity NR is not closed with E-NR at the end of the sentence")),
        (["S-PER", "E-PER"], "BIOES", TagIssue(1, "E-PER follows S-PER without a preceding B-PER")),
        (["B-PER", "I-LOC", "E-LOC"], "BIOES",
         TagIssue(1, "I-LOC follows B-PER; expected I-PER or E-PER to continue or close it")),
    ],
)
def test_validate_transitions(tags, scheme, expected):
    assert validate_tags(tags, scheme) == expected


@pytest.mark.parametrize(
    "tag, scheme, fragment",
    [
        ("Z-PER", "IOB2", "prefix 'Z', not valid in IOB2"),
        ("B_PER", "IOB2", "not of the form"),
        ("B-", "IOB2", "not of the form"),
        ("M-PER", "BIOES", "prefix 'M', not valid in BIOES"),
        ("I-PER", "BMES", "prefix 'I', not valid in BMES"),
        ("E-PER", "IOB2", "prefix 'E', not valid in IOB2"),
    ],
)
def test_validate_tag_shapes(tag, scheme, fragment):
    issue = validate_tags(["O", tag], scheme)
    assert issue.position == 1 and fragment in issue.reason
    with pytest.raises(ValueError, match=fragment):
        tags_to_spans(["O", tag], scheme)


def test_valid_sequences_pass():
    assert validate_tags([], "IOB2") is None
    assert validate_tags(["I-PER", "I-PER", "B-PER", "O", "I-LOC"], "IOB1") is None
    assert validate_tags(["B-geo-loc", "I-geo-loc"], "IOB2") is None


def test_spans_to_tags_rejects_overlap_and_out_of_range():
    with pytest.raises(ValueError, match="overlaps"):
        spans_to_tags([("PER", 0, 2), ("LOC", 1, 3)], 4, "IOB2")
    with pytest.raises(ValueError, match="outside a sentence of length 3"):
        spans_to_tags([("PER", 2, 4)], 3, "IOB2")


def test_scheme_names_and_aliases():
    assert schemes.normalize_scheme("bio") == "IOB2"
    assert schemes.normalize_scheme("iobes") == "BIOES"
    with pytest.raises(ValueError, match="unknown tag scheme 'BILOU'"):
        schemes.normalize_scheme("BILOU")


def test_entity_types_and_label_sets():
    assert entity_types(["O", "S-NT", "B-NR", "E-NR", "M-NS", "I-geo-loc"]) == ["NR", "NS", "NT", "geo-loc"]
    with pytest.raises(ValueError, match="'X'"):
        entity_types(["O", "X"])
    assert label_set(["PER", "ORG", "LOC"], "IOB2") == ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
    # MSRA's 13 labels, as listed in its SOURCE.md.
    assert label_set(["NR", "NS", "NT"], "BMES") == [
        "O", "B-NR", "M-NR", "E-NR", "S-NR", "B-NS", "M-NS", "E-NS", "S-NS", "B-NT", "M-NT", "E-NT", "S-NT"]
    assert label_set(["PER", "PER"], "BIOES") == ["O", "B-PER", "I-PER", "E-PER", "S-PER"]


def test_to_iob2_matches_seqeval_entities():
    seqeval_sequence_labeling = pytest.importorskip("seqeval.metrics.sequence_labeling")
    tags = ENCODED["BMES"]
    entities = seqeval_sequence_labeling.get_entities(to_iob2(tags, "BMES"))
    # seqeval reports inclusive ends.
    assert [(t, s, e + 1) for t, s, e in entities] == SPANS
