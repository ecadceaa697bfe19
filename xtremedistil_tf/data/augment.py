"""Unlabeled transfer text made from the labeled train split by entity swaps (`--transfer_augment=N`).

The data augmentation TinyBERT and TextBrewer use for distillation, in the form that keeps a sentence's grammar
and gives the teacher new names in context: each of a sentence's N variants replaces every entity mention by a
mention of the same type drawn at random from the whole train split (another or the same one), keeping the other
words. Labels are dropped, so the teacher labels the variants like any unlabeled text; a sentence without entities
gives none. Seeded (--seed), so a rerun makes the same text.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Sequence, Tuple

import numpy as np

from xtremedistil_tf.data.schemes import tags_to_spans
from xtremedistil_tf.data.sentence import Sentence


def mentions_by_type(sentences: Sequence[Sentence], scheme: str) -> Dict[str, List[Tuple[str, ...]]]:
    """{entity type: [its mentions' tokens, in corpus order]} of the tagged `sentences`."""
    found: Dict[str, List[Tuple[str, ...]]] = defaultdict(list)
    for sentence in sentences:
        for etype, start, end in tags_to_spans(sentence.tags or (), scheme):
            found[etype].append(tuple(sentence.tokens[start:end]))
    return dict(found)


def entity_swaps(sentences: Sequence[Sentence], variants: int, scheme: str, seed: int) -> List[Sentence]:
    """`variants` unlabeled sentences per tagged sentence with entities, each mention replaced by one of the same
    type from `sentences` (see the module doc); in sentence order, the variants of one sentence together."""
    pool = mentions_by_type(sentences, scheme)
    rng = np.random.default_rng(seed)
    out = []
    for sentence in sentences:
        spans = tags_to_spans(sentence.tags or (), scheme)
        if not spans:
            continue
        for _ in range(variants):
            tokens, last = [], 0
            for etype, start, end in spans:
                choices = pool[etype]
                tokens += list(sentence.tokens[last:start]) + list(choices[int(rng.integers(len(choices)))])
                last = end
            out.append(Sentence(tokens + list(sentence.tokens[last:]), lang=sentence.lang))
    return out
