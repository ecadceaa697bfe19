"""BERT+CRF teacher of the multi-grained KD paper (Zhou et al., NAACL 2021, Sec. 5.2, Table 6).

`CRFTokenTeacher` is a `TokenTeacher` (encoder -> dropout -> dense logits over the piece-level
tags) with a linear-chain CRF on top. `call` still returns the raw logits, so the cache, logit
regression and `call_with_hidden` are unchanged; the CRF adds potentials, the NLL, Viterbi and
k-best surrogates. Paper settings: dropout 0.5 on the embedding output and on BERT's output;
learning rate 1e-3 for the logits and the CRF, 1e-5 for the top encoder layer with 0.9 decay per
layer going down (`recipe_for("crf", learning_rate=1e-5)`, teachers/finetune.py).

Constraints over the piece-level tags (`piece_crf_constraints`). A window is always
`[CLS] pieces... [SEP]`, its length is the attention mask's sum, and [PAD] never occurs inside
it. Windows of long sentences are cut at word boundaries, possibly mid-entity. So:
- word label -> word label: the tag scheme's rule (`ops.allowed_transitions`);
- [CLS] starts every window and nothing else does; it may be followed by any word label
  (a continuation window may start with I-PER) or by [SEP] (an empty sentence), never by X
  (a word's first piece carries the word's label);
- [SEP] ends every window and nothing else does; any word label, X or [CLS] may precede it
  (a window may end mid-entity); nothing follows it;
- X follows a word label or X, and is followed by a word label, X or [SEP]. Moves across X are
  not checked (a first-order CRF cannot see past it): B-PER X I-PER must stay legal, so O X I-PER
  is legal too;
- [PAD] is forbidden everywhere (never inside a length).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf.layer import CRF
from xtremedistil_tf.crf.ops import allowed_transitions
from xtremedistil_tf.data.alignment import CLS_TAG, SEP_TAG, TagVocab
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_dir
from xtremedistil_tf.teachers.model import TokenTeacher, load_encoder, load_tokenizer
from xtremedistil_tf.teachers.surrogates import make_surrogate_fn

HEAD_TYPE = "crf"


def piece_crf_constraints(tag_vocab: TagVocab, scheme: str):
    """(allowed [N, N], start [N], end [N]) numpy bool masks over `tag_vocab.tags` (see module doc)."""
    num_labels = len(tag_vocab.labels)
    words = slice(0, num_labels)
    cls, sep = tag_vocab.id(CLS_TAG), tag_vocab.id(SEP_TAG)
    x = tag_vocab.x_id
    allowed = np.zeros([len(tag_vocab)] * 2, dtype=bool)
    allowed[words, words] = allowed_transitions(tag_vocab.labels, scheme)[0]
    allowed[words, x] = allowed[x, words] = allowed[x, x] = True
    allowed[cls, words] = allowed[cls, sep] = True
    allowed[words, sep] = allowed[x, sep] = True
    start = np.zeros(len(tag_vocab), dtype=bool)
    end = np.zeros(len(tag_vocab), dtype=bool)
    start[cls], end[sep] = True, True
    return allowed, start, end


def set_embedding_dropout(encoder, rate: float) -> None:
    """Dropout `rate` on the embedding output only (Table 6: 0.5), leaving the encoder layers'
    own dropout (config.hidden_dropout_prob, 0.1 for BERT) as pretrained."""
    embeddings = encoder.get_input_embeddings()
    dropout = getattr(embeddings, "dropout", None)
    if not isinstance(dropout, tf.keras.layers.Dropout):
        raise ConfigError(f"{type(embeddings).__name__} has no dropout layer to set the embedding dropout on")
    dropout.rate = float(rate)


class CRFTokenTeacher(TokenTeacher):
    """TokenTeacher + CRF over the piece-level tags.

    Args as TokenTeacher's, plus `scheme` (the word labels' tag scheme, for the constraints)
    and `embedding_dropout`. `dropout` is the dropout on BERT's output before the logits.
    """

    LOSS = "teacher_crf_nll"

    def __init__(self, encoder, tag_vocab: TagVocab, scheme: str, max_seq_length: int = 128,
                 dropout: float = 0.5, embedding_dropout: float = 0.5, **kwargs):
        super().__init__(encoder, tag_vocab, max_seq_length, dropout, **kwargs)
        self.scheme = scheme
        self.embedding_dropout_rate = float(embedding_dropout)
        set_embedding_dropout(encoder, embedding_dropout)
        allowed, self.start_allowed, self.end_allowed = piece_crf_constraints(tag_vocab, scheme)
        self.crf = CRF(len(tag_vocab), allowed=allowed, start_allowed=self.start_allowed,
                       end_allowed=self.end_allowed, name="crf")

    def build_for_length(self, length: int = 8) -> None:
        ones = tf.ones((1, length), tf.int32)
        self.potentials({"input_ids": ones, "attention_mask": ones})

    @property
    def transitions(self):
        """[N, N] float32 transitions, forbidden moves at -1e4."""
        return self.crf.transitions

    @property
    def head_variables(self):
        """The variables trained at the head rate: logits and CRF transitions."""
        return self.classifier.trainable_variables + self.crf.trainable_variables

    def potentials(self, inputs, training=False):
        """[B, T, N] CRF potentials: the logits with the [CLS]-first / [SEP]-last constraints."""
        return self.crf(self(inputs, training=training), mask=tf.cast(inputs["attention_mask"], tf.bool))

    def loss_outputs(self, batch, training=False) -> dict:
        """The CRF teacher trains on the CRF NLL of label_ids over the labeled windows (`LOSS`;
        unlabeled windows, PAD tags inside the length, are skipped): it reads the potentials and
        the transitions."""
        return {"potentials": self.potentials(batch, training), "transitions": self.transitions}

    def predict_tags_fn(self):
        """Viterbi tags [B, T] int32 as one compiled function for any batch size and length."""
        if getattr(self, "_tags_fn", None) is None:
            spec = tf.TensorSpec([None, None], tf.int32)

            @tf.function(input_signature=[{"input_ids": spec, "attention_mask": spec}])
            def tags(batch):
                lengths = tf.reduce_sum(batch["attention_mask"], axis=1)
                return self.crf.decode(self.potentials(batch), lengths)[0]

            self._tags_fn = tags
        return self._tags_fn

    def surrogate_fn(self, k: int):
        """`(logits, transitions, lengths) -> {kbest_tags, kbest_probs, kbest_valid, residual,
        marginals}` for cached logits (teachers/surrogates.py), with this teacher's constraints.
        Pass `self.transitions.numpy()` as transitions."""
        return make_surrogate_fn(k, self.start_allowed, self.end_allowed)

    @classmethod
    def from_meta(cls, encoder, meta: dict) -> "CRFTokenTeacher":
        return cls(encoder, TagVocab(meta["labels"]), meta["scheme"], meta["max_seq_length"],
                   meta["dropout"], meta["embedding_dropout"])

    def load_head(self, directory) -> None:
        super().load_head(directory)
        self.crf.raw_transitions.assign(np.load(Path(directory) / "crf.npz")["transitions"])

    def save(self, directory, tokenizer) -> None:
        """TokenTeacher's layout plus crf.npz (raw transitions) and head/scheme/embedding_dropout
        in teacher.json; written to a temporary dir and renamed, like the base layout."""
        with atomic_dir(directory) as tmp:
            super().save(tmp, tokenizer)
            np.savez(tmp / "crf.npz", transitions=self.crf.raw_transitions.numpy())

    def meta(self) -> dict:
        return {**super().meta(), "head": HEAD_TYPE, "scheme": self.scheme,
                "embedding_dropout": self.embedding_dropout_rate}


def build_crf_teacher(name_or_path: str, labels: Sequence[str], scheme: str, max_seq_length: int = 128,
                      dropout: float = 0.5, embedding_dropout: float = 0.5, random_init: bool = False,
                      config_overrides=None):
    """A fresh CRF teacher (pretrained or random encoder, new head and CRF) and its tokenizer."""
    encoder = load_encoder(name_or_path, random_init, config_overrides)
    teacher = CRFTokenTeacher(encoder, TagVocab(labels), scheme, max_seq_length, dropout, embedding_dropout)
    teacher.build_for_length()
    return teacher, load_tokenizer(name_or_path)
