"""Seen and unseen names (issue 50): the rule of data/scoring.entity_keys, and the scores every surface reports.

A gold or predicted entity is seen when its type and its words on the served word split equal those of an entity of
the labeled train split: whole entities, case and type counting. The expected kinds below are what that rule gives;
the wrong rules a split could slip into (ignoring case, ignoring the type, a partial match) each get one wrong, and
the last test checks that they do, so these tests would catch them."""
import json

import pytest

from xtremedistil_tf.cli.evaluate import format_scores, read_train_entities
from xtremedistil_tf.data import scoring
from xtremedistil_tf.data.loading import write_jsonl
from xtremedistil_tf.data.scoring import char_spans, seen_scores, seen_unseen_rows, tag_scores, train_entities
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError

TRAIN = [
    Sentence(["Apple", "hired", "John", "Smith", "in", "New", "York", "."],
             ["B-ORG", "O", "B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"]),
    Sentence(["Washington", "met", "the", "U.S.", "envoy", "in", "Rome"], ["B-PER", "O", "O", "B-LOC", "O", "O", "B-LOC"]),
    Sentence(["nothing", "here"], ["O", "O"]),
]

# (test sentence, the kind of each of its gold entities in order, and why)
TEST = [
    (Sentence(["Apple", "sued", "APPLE", "and", "apple"], ["B-ORG", "O", "B-ORG", "O", "B-ORG"]),
     ["seen", "unseen", "unseen"]),                      # case counts
    (Sentence(["Washington", "is", "far", "from", "Washington"], ["B-PER", "O", "O", "O", "B-LOC"]),
     ["seen", "unseen"]),                                # the type counts
    (Sentence(["New", "York", "City", "and", "York", "and", "New", "York"],
              ["B-LOC", "I-LOC", "I-LOC", "O", "B-LOC", "O", "B-LOC", "I-LOC"]),
     ["unseen", "unseen", "seen"]),                      # whole entities only: no partial match either way
    (Sentence(["Romeo", "left", "Rome", "for", "John"], ["B-LOC", "O", "B-LOC", "O", "B-PER"]),
     ["unseen", "seen", "unseen"]),                      # no substring of a word, no part of a name
    (Sentence(["the", "U.", "S.", "again"], ["O", "B-LOC", "I-LOC", "O"]),
     ["seen"]),                                          # spacing does not count: U . S . on the served split
]


def gold_kinds(sentences):
    """The kind of each gold entity of `sentences`, in order, as seen_scores decides it (one sentence at a time)."""
    seen = train_entities(TRAIN)
    kinds = []
    for sentence in sentences:
        for span in sorted(char_spans(sentence, sentence.tags)):
            scores = seen_scores([sentence], [{span}], [set()], seen)
            kinds.append("seen" if scores["seen"]["support"] else "unseen")
    return kinds


def test_the_rule_is_whole_entities_of_the_same_type_and_case():
    assert gold_kinds([s for s, _ in TEST]) == [kind for _, kinds in TEST for kind in kinds]
    assert train_entities(TRAIN) == {("ORG", ("Apple",)), ("PER", ("John", "Smith")), ("LOC", ("New", "York")),
                                     ("PER", ("Washington",)), ("LOC", ("U", ".", "S", ".")), ("LOC", ("Rome",))}


def lowercased(keys):
    return [{span: (kind, tuple(w.lower() for w in words)) for span, (kind, words) in k.items()} for k in keys]


def without_type(keys):
    return [{span: ("", words) for span, (kind, words) in k.items()} for k in keys]


def by_first_word(keys):   # a partial match: entities that share a word
    return [{span: (kind, words[:1]) for span, (kind, words) in k.items()} for k in keys]


@pytest.mark.parametrize("wrong", [lowercased, without_type, by_first_word])
def test_a_wrong_rule_fails_the_rule_test(monkeypatch, wrong):
    right = scoring.entity_keys
    monkeypatch.setattr(scoring, "entity_keys", lambda texts, spans: wrong(right(texts, spans)))
    with pytest.raises(AssertionError):
        test_the_rule_is_whole_entities_of_the_same_type_and_case()


def test_recall_on_gold_and_precision_on_predictions_of_each_kind():
    seen = train_entities(TRAIN)
    sentence = Sentence(["Apple", "and", "Google", "met", "John", "Smith", "in", "Paris", "and", "Rome"],
                        ["B-ORG", "O", "B-ORG", "O", "B-PER", "I-PER", "O", "B-LOC", "O", "B-LOC"])
    # Gold: Apple (seen), Google (unseen), John Smith (seen), Paris (unseen), Rome (seen).
    # Predicted: Apple right (seen), Google right (unseen), "Smith" PER wrong (unseen), Paris as PER wrong (unseen),
    # Rome right (seen): seen precision 2 of 2, recall 2 of 3; unseen precision 1 of 3, recall 1 of 2.
    predicted = ["B-ORG", "O", "B-ORG", "O", "O", "B-PER", "O", "B-PER", "O", "B-LOC"]
    scores = tag_scores([sentence], [predicted], seen=seen)["seen_unseen"]
    assert scores["train_entities"] == 6
    assert scores["seen"] == {"precision": 1.0, "recall": pytest.approx(2 / 3), "f1": pytest.approx(0.8),
                              "support": 3, "predicted": 2}
    assert scores["unseen"] == {"precision": pytest.approx(1 / 3), "recall": 0.5, "f1": pytest.approx(0.4),
                                "support": 2, "predicted": 3}
    # Without `seen` the scores are as before.
    assert "seen_unseen" not in tag_scores([sentence], [predicted])
    # Side by side: a model without the scores (an older step) shows "-"; none with them, no rows.
    assert seen_unseen_rows({"teacher": None, "student": scores}) == [
        ["seen", "3", "-", "0.6667 / 1.0000"], ["unseen", "2", "-", "0.5000 / 0.3333"]]
    assert seen_unseen_rows({"teacher": None}) == []


def test_bin_evaluate_reads_the_train_labels_of_a_work_dir_or_a_labeled_file(tmp_path):
    """bin/evaluate --train_labels: a work dir (data/train.jsonl, read in its run's scheme), its data/ folder, or a
    labeled file read as --test_file is; what cannot hold train labels is refused in one line."""
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    write_jsonl(TRAIN, work / "data" / "train.jsonl")
    (work / "data" / "step.json").write_text(json.dumps({"fingerprint": {"data": {"scheme": "IOB2"}}}))
    (tmp_path / "train.conll").write_text("".join("".join(f"{w} {t}\n" for w, t in zip(s.tokens, s.tags)) + "\n"
                                                  for s in TRAIN), encoding="utf-8")
    expected = train_entities(TRAIN)
    assert read_train_entities(str(work), "conll", "", [], "BIOES") == expected   # the run's scheme, not --scheme
    assert read_train_entities(str(work / "data"), "conll", "", [], "IOB2") == expected
    assert read_train_entities("train.conll", "conll", str(tmp_path), [], "IOB2") == expected
    for value, fmt, message in ((str(tmp_path), "conll", "a directory without data/train.jsonl"),
                                ("x.conll", "demo", "--data_format=demo has no train file; give the work dir"),
                                (str(work), "label_tsv", "scores names of a tagger")):
        with pytest.raises(ConfigError, match=message):
            read_train_entities(value, fmt, "", [], "IOB2")


def test_bin_evaluate_prints_seen_and_unseen_beside_the_scores():
    sentence = TEST[0][0]
    scores = {"model": "m", "kind": "student", "scheme": "IOB2", "decode": "constrained",
              **tag_scores([sentence], [sentence.tags], seen=train_entities(TRAIN))}
    lines = format_scores(scores).splitlines()
    assert lines[-2:] == [
        "seen names recall / precision 1.0000 / 1.0000  (of 1 gold entities whose type and words are those of one "
        "of the 6 entities of --train_labels)",
        "unseen names recall / precision 1.0000 / 1.0000  (of 2 other gold entities)"]
