"""Entity-level scores with seqeval, over words (never word pieces), overall and per language;
class scores for sentence classification; and exact character-span scores: an exported model
returns entities as character offsets of its text, and a tagger's word tags give the same spans
through its words' offsets (`tag_scores`), so a saved model and its export are scored alike.
Beside them, recall and precision on names the training labels hold and on the rest (`seen_scores`,
with the rule in `entity_keys`).

Tags of any scheme are converted to IOB2 first so seqeval's default (CoNLL) span rules apply
the same way to WikiAnn (IOB2) and MSRA (BMES).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np
from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

from xtremedistil_tf.data.schemes import tags_to_spans, to_iob2
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.wordsplit import split_words, word_offsets

Span = Tuple[int, int, str]  # (start character, end character (exclusive), entity type)
EntityKey = Tuple[str, Tuple[str, ...]]  # (entity type, its words on the served word split): `entity_keys`


def entity_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], scheme: str = "IOB2") -> Dict:
    """Micro-averaged entity precision, recall and F1 (in [0, 1]) of predicted word tags."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
    y_true = [to_iob2(list(g), scheme) for g in gold]
    y_pred = [to_iob2(list(p), scheme) for p in pred]
    for i, (g, p) in enumerate(zip(y_true, y_pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
    return {
        "precision": float(precision_score(y_true, y_pred, zero_division=0)),
        "recall": float(recall_score(y_true, y_pred, zero_division=0)),
        "f1": float(f1_score(y_true, y_pred, zero_division=0)),
        "sentences": len(y_true),
        "types": type_scores(y_true, y_pred),
    }


def type_scores(y_true, y_pred) -> Dict[str, Dict[str, float]]:
    """Per entity type (IOB2 word tags): precision, recall, F1 and the number of gold entities."""
    if not any(t != "O" for tags in y_true + y_pred for t in tags):
        return {}
    report = classification_report(y_true, y_pred, output_dict=True, zero_division=0)
    return {kind: {"precision": float(v["precision"]), "recall": float(v["recall"]), "f1": float(v["f1-score"]),
                   "support": int(v["support"])}
            for kind, v in sorted(report.items()) if not kind.endswith(" avg")}


def char_spans(sentence: Sentence, tags: Sequence[str], scheme: str = "IOB2") -> Set[Span]:
    """The entities of word `tags` of `sentence` as character spans of its raw text (`Sentence.raw_text`: the
    text an exported model is given; its words' offsets, data/wordsplit.word_offsets)."""
    offsets = word_offsets(sentence)
    return {(offsets[first][0], offsets[end - 1][1], etype) for etype, first, end in tags_to_spans(list(tags), scheme)}


def tag_scores(sentences: Sequence[Sentence], predicted: Sequence[Sequence[str]], scheme: str = "IOB2",
               seen: Optional[FrozenSet[EntityKey]] = None) -> Dict:
    """`score_by_language` of predicted word tags against the sentences' tags, with "spans": the same predictions
    scored on exact entity character spans of the sentences' raw text (`char_spans`), what `bin/evaluate` scores
    an export on. With the served word split (data/wordsplit.py) the two agree but for entities of words that
    vanish; the spans are the number comparable with an export's. `seen` (`train_entities` of the labeled train
    split): also "seen_unseen", `seen_scores` of the same spans."""
    gold, langs = [s.tags for s in sentences], [s.lang for s in sentences]
    scores = score_by_language(gold, predicted, langs, scheme)
    gold_spans = [char_spans(s, s.tags, scheme) for s in sentences]
    pred_spans = [char_spans(s, p, scheme) for s, p in zip(sentences, predicted)]
    scores["spans"] = score_by_language(gold_spans, pred_spans, langs, scorer=span_scores)
    if seen is not None:
        scores["seen_unseen"] = seen_scores(sentences, gold_spans, pred_spans, seen)
    return scores


def span_scores(gold: Sequence[Set[Span]], pred: Sequence[Set[Span]]) -> Dict:
    """Micro-averaged precision, recall and F1 of exact (start, end, type) matches, per sentence."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
    def prf(keep) -> Dict:
        scores = _exact_prf(gold, pred, keep)
        del scores["predicted"]
        return scores

    kinds = sorted({span[2] for spans in list(gold) + list(pred) for span in spans})
    overall = prf(lambda span: True)
    del overall["support"]
    return {**overall, "sentences": len(gold), "types": {kind: prf(lambda span, k=kind: span[2] == k) for kind in kinds}}


def _exact_prf(gold: Sequence[set], pred: Sequence[set], keep: Callable) -> Dict:
    """Precision, recall and F1 of exact matches, per sentence, among the gold and predicted entities `keep` keeps;
    "support" and "predicted": how many it keeps of each."""
    gold_kept = [{span for span in g if keep(span)} for g in gold]
    pred_kept = [{span for span in p if keep(span)} for p in pred]
    hits = sum(len(g & p) for g, p in zip(gold_kept, pred_kept))
    expected, predicted = sum(map(len, gold_kept)), sum(map(len, pred_kept))
    precision, recall = hits / max(1, predicted), hits / max(1, expected)
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "support": expected, "predicted": predicted}


def entity_keys(texts: Sequence[str], spans: Sequence[Iterable[Span]]) -> List[Dict[Span, EntityKey]]:
    """For each text, the key (type, words) of each of its entity `spans` (character spans of that text).

    The rule of seen and unseen names, in one place: an entity's key is its type and its words, the served word
    split (data/wordsplit.split_words: BERT's pre-tokenizer, cased) of its characters. A gold entity is *seen* when
    its key is the key of some entity of the labeled train split (`train_entities`), *unseen* otherwise; a
    predicted entity is seen or unseen by the same rule applied to its own characters. So:
      - whole entities only: the words of one entity equal those of another, in order and all of them ("New York"
        seen does not make "New York City" or "York" seen, nor the other way round);
      - case counts ("Apple" seen does not make "APPLE" or "apple" seen): a cased model, or a student with word
        shapes (--student_case_dim), reads them as other input, and a headline's capitals are what the labels did
        not show it;
      - the type counts ("Washington" taught as PER is unseen as LOC): the labels taught the model another answer
        for that text, which is what a model that recalls names, not context, gets wrong;
      - spacing does not count, punctuation does: "U.S." and "U. S." are the same words (U . S .), "U.S." and "US"
        are not.
    The same rule for every model and every word split of a work dir (--word_split=none too), and for an export's
    served character spans."""
    flat = [(i, span) for i, text_spans in enumerate(spans) for span in text_spans]
    words = split_words([texts[i][start:end] for i, (start, end, _) in flat]) if flat else []
    keys: List[Dict[Span, EntityKey]] = [{} for _ in texts]
    for (i, span), offsets in zip(flat, words):
        text = texts[i][span[0]:span[1]]
        keys[i][span] = (span[2], tuple(text[a:b] for a, b in offsets))
    return keys


def train_entities(sentences: Sequence[Sentence], scheme: str = "IOB2") -> FrozenSet[EntityKey]:
    """The `entity_keys` of the entities of labeled sentences (the labeled train split): what makes a name seen."""
    labeled = [s for s in sentences if s.tags is not None]
    keys = entity_keys([s.raw_text for s in labeled], [char_spans(s, s.tags, scheme) for s in labeled])
    return frozenset(key for text_keys in keys for key in text_keys.values())


def seen_scores(sentences: Sequence[Sentence], gold: Sequence[Set[Span]], pred: Sequence[Set[Span]],
                seen: FrozenSet[EntityKey]) -> Dict:
    """Exact character-span scores (as `span_scores`) on the names the training labels hold and on the rest:
    {"seen": ..., "unseen": ...}, each with precision (of the predicted entities of that kind), recall (of the gold
    entities of that kind), F1, "support" (gold entities) and "predicted"; and "train_entities", how many distinct
    keys `seen` holds. Seen or unseen by `entity_keys`' rule, for gold and predicted entities alike, so an exact
    match is always of one kind. `gold`/`pred`: each sentence's entities as character spans of its raw text."""
    if not len(sentences) == len(gold) == len(pred):
        raise ValueError(f"{len(sentences)} sentences, {len(gold)} gold and {len(pred)} predicted")
    keys = entity_keys([s.raw_text for s in sentences], [set(g) | set(p) for g, p in zip(gold, pred)])
    marked_gold = [{(*span, k[span] in seen) for span in g} for g, k in zip(gold, keys)]
    marked_pred = [{(*span, k[span] in seen) for span in p} for p, k in zip(pred, keys)]
    return {kind: _exact_prf(marked_gold, marked_pred, lambda span, want=want: span[3] == want)
            for kind, want in (("seen", True), ("unseen", False))} | {"train_entities": len(seen)}


def seen_unseen_rows(by_model: Dict[str, Optional[Dict]]) -> List[List[str]]:
    """What every surface shows of `seen_scores` ({model name: its "seen_unseen", None where it has none}), models
    side by side: a row per kind, [kind, its gold entities, then "recall / precision" of each model ("-": none)].
    No rows when no model has the scores (a work dir or step from before they were recorded)."""
    present = [s for s in by_model.values() if s]
    if not present:
        return []
    rows = []
    for kind in ("seen", "unseen"):
        support = present[0][kind]["support"]
        rows.append([kind, f"{support:,}"] + [f"{s[kind]['recall']:.4f} / {s[kind]['precision']:.4f}" if s else "-"
                                              for s in by_model.values()])
    return rows


def class_scores(gold: Sequence[str], pred: Sequence[str]) -> Dict:
    """Sentence classification: accuracy (the paper's Table 10 metric) and macro-averaged
    precision, recall and F1 over the gold classes (a class never predicted scores 0)."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predicted")
    gold, pred = np.asarray(gold, dtype=object), np.asarray(pred, dtype=object)
    per_class = []
    for label in sorted(set(gold)):
        hits = float(np.sum((pred == label) & (gold == label)))
        precision = hits / max(1, int(np.sum(pred == label)))
        recall = hits / max(1, int(np.sum(gold == label)))
        per_class.append((precision, recall, 2 * precision * recall / (precision + recall) if hits else 0.0))
    macro = np.mean(per_class, axis=0) if per_class else np.zeros(3)
    return {"accuracy": float(np.mean(gold == pred)) if len(gold) else 0.0, "precision": float(macro[0]),
            "recall": float(macro[1]), "f1": float(macro[2]), "sentences": len(gold)}


def score_by_language(gold, pred, langs: Sequence[Optional[str]], scheme: str = "IOB2",
                      scorer: Optional[Callable[[Sequence, Sequence], Dict]] = None) -> Dict:
    """Overall scores, plus per-language scores and the mean and standard deviation of F1
    across languages (the papers' summary) when sentences carry a language.

    `scorer(gold, pred)` defaults to entity scores under `scheme`; `class_scores` for classification."""
    if scorer is None:
        def scorer(g, p):
            return entity_scores(g, p, scheme)
    result = {"all": scorer(gold, pred)}
    groups = defaultdict(list)
    for i, lang in enumerate(langs):
        if lang is not None:
            groups[lang].append(i)
    if groups:
        per = {lang: scorer([gold[i] for i in idx], [pred[i] for i in idx])
               for lang, idx in sorted(groups.items())}
        f1s = np.array([s["f1"] for s in per.values()])
        result["languages"] = per
        result["f1_mean"] = float(f1s.mean())
        result["f1_std"] = float(f1s.std())
    return result


def predates_decoded_teacher_scores(scores: Dict[str, dict]) -> bool:
    """Whether a teacher step's recorded `scores` ({split: scores}) are from before the step scored the
    teacher decoded as the students (pipeline.step_teacher marks those with "decode"): a token teacher's
    own decoding then. A text classifier's scores (with accuracy) never carry the mark."""
    return bool(scores) and not any("decode" in s or "accuracy" in s["all"] for s in scores.values())
