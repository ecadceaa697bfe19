"""Entity-level scores with seqeval, over words (never word pieces), overall and per language.

Tags of any scheme are converted to IOB2 first so seqeval's default (CoNLL) span rules apply
the same way to WikiAnn (IOB2) and MSRA (BMES).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, Optional, Sequence

import numpy as np
from seqeval.metrics import f1_score, precision_score, recall_score

from xtremedistil_tf.data.schemes import to_iob2


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
    }


def score_by_language(gold, pred, langs: Sequence[Optional[str]], scheme: str = "IOB2") -> Dict:
    """Overall scores, plus per-language scores and the mean and standard deviation of F1
    across languages (the papers' summary) when sentences carry a language."""
    result = {"all": entity_scores(gold, pred, scheme)}
    groups = defaultdict(list)
    for i, lang in enumerate(langs):
        if lang is not None:
            groups[lang].append(i)
    if groups:
        per = {lang: entity_scores([gold[i] for i in idx], [pred[i] for i in idx], scheme)
               for lang, idx in sorted(groups.items())}
        f1s = np.array([s["f1"] for s in per.values()])
        result["languages"] = per
        result["f1_mean"] = float(f1s.mean())
        result["f1_std"] = float(f1s.std())
    return result
