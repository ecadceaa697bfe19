"""Sentence classification data: class ids and encoded texts (paper section 6.6).

A text is one `Sentence` whose `label` is its class (`read_label_tsv`); unlabeled transfer
sentences have no label. Texts longer than `max_seq_length` pieces are cut (a sentence gets one
class, so there is nothing to stitch back, unlike tagging windows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np

from xtremedistil_tf.data.alignment import TagVocab, length_batches
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError

NO_LABEL = -1  # the class id of unlabeled texts; losses skip it


class ClassVocab(TagVocab):
    """Class ids in the order of `labels`: a TagVocab without piece markers (the interface the
    students and caches read: `labels`, `tags`, `id`, `pad_id`, `len`)."""

    markers = ()
    DUPLICATE = "duplicate class labels in {}"
    UNKNOWN = "class {!r} is not one of the teacher's classes {}"

    def __init__(self, labels: Sequence[str]):
        if not labels:
            raise ConfigError("no class labels: the labeled splits carry none")
        super().__init__(labels)

    @property
    def pad_id(self) -> int:
        return NO_LABEL


def class_labels_of(splits: Dict[str, List[Sentence]]) -> List[str]:
    """The sorted classes of the labeled splits; every labeled-split sentence must have one."""
    labels = set()
    for split in ("train", "dev", "test"):
        for i, sentence in enumerate(splits[split]):
            if sentence.label is None:
                raise ConfigError(f"{split} sentence {i + 1} has no class label; classification data "
                                  "must be 'LABEL<TAB>text' lines (--data_format=label_tsv)")
            labels.add(sentence.label)
    return sorted(labels)


@dataclass
class TextArrays:
    """Encoded texts: input_ids, attention_mask [N, L] int32 ([CLS] text [SEP], padded) and
    label_ids [N] int32 (NO_LABEL for unlabeled texts)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    label_ids: np.ndarray

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def as_dict(self) -> Dict[str, np.ndarray]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "label_ids": self.label_ids}


def encode_texts(sentences: Sequence[Sentence], tokenizer, vocab: ClassVocab, max_seq_length: int = 128) -> TextArrays:
    """Word-split texts -> fixed-length piece ids with [CLS]/[SEP], cut at `max_seq_length`."""
    if max_seq_length < 3:
        raise ConfigError(f"max_seq_length must be at least 3 (CLS, one piece, SEP), got {max_seq_length}")
    n = len(sentences)
    input_ids = np.full((n, max_seq_length), tokenizer.pad_token_id, dtype=np.int32)
    mask = np.zeros((n, max_seq_length), dtype=np.int32)
    if n:
        encoded = tokenizer([list(s.tokens) for s in sentences], is_split_into_words=True, truncation=True,
                            max_length=max_seq_length, add_special_tokens=True)
        for row, ids in enumerate(encoded["input_ids"]):
            input_ids[row, :len(ids)] = ids
            mask[row, :len(ids)] = 1
    labels = np.array([vocab.id(s.label) if s.label is not None else NO_LABEL for s in sentences], dtype=np.int32)
    return TextArrays(input_ids, mask, labels)


def predict_by_length_texts(arrays: TextArrays, classes_fn, batch_size: int = 64) -> np.ndarray:
    """Class ids [N] from `classes_fn({"input_ids", "attention_mask"} [B, T]) -> [B]`, batched by
    length (alignment.length_batches)."""
    out = np.zeros((len(arrays),), dtype=np.int32)
    for idx, batch in length_batches(arrays.input_ids, arrays.attention_mask, batch_size):
        out[idx] = np.asarray(classes_fn(batch))
    return out
