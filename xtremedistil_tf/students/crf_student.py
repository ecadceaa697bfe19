"""CRF students of multi-grained KD (Zhou et al., NAACL 2021, Sec. 5.2): BiLSTM+CRF (Huang et al.
2015) and the same CRF head on the transformer body.

Layout (the XtremeDistil students' body, `students/models.py`, with a CRF head instead of the
projection/logit/softmax heads):

    input_ids ─> word_embedding ─> embedding_dropout ─> bilstm | encoder ─> dropout ─> logits ─> crf
    attention_mask ─> sequence_mask ──────────────────────────────────────────────────────────┘

Outputs, a dict: "logits" [B, T, N], the emissions (L_Token-em compares them with the teacher's
logits), and "potentials" [B, T, N], the emissions with the CRF's [CLS]-first / [SEP]-last
constraints applied (what the sequence losses and Viterbi take). The `crf` layer owns the
transitions; serving (`export/serving.py`, decoder "crf") decodes from the `crf` layer's input.

Paper settings (Table 6): LSTM hidden 300, dropout 0.5 on the embeddings and the LSTM output, the
teacher's word embeddings copied and frozen (TE: `embeddings=teacher.word_embeddings()`,
`freeze_embeddings=True`, `embedding_dim` = the teacher's hidden size).
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf.layer import CRF
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.students.layers import SequenceMask
from xtremedistil_tf.students.models import StudentArch, build_bilstm_student, build_transformer_student
from xtremedistil_tf.teachers.crf_head import piece_crf_constraints

# (allowed [N, N], start_allowed [N], end_allowed [N]) bool masks, as piece_crf_constraints returns.
Constraints = Tuple[np.ndarray, np.ndarray, np.ndarray]


def student_crf_constraints(tag_vocab: TagVocab, scheme: str) -> Constraints:
    """The teacher's piece-level constraints (`teachers.crf_head.piece_crf_constraints`): the
    student tags the same windows over the same tags, so it obeys the same moves."""
    return piece_crf_constraints(tag_vocab, scheme)


def _crf_head(body: tf.keras.Model, states_layer: str, mask, num_tags: int,
              constraints: Optional[Constraints], name: str) -> tf.keras.Model:
    """A model from `body`'s inputs through the output of `states_layer` [B, T, width] to the
    emissions (`logits`) and the CRF potentials (`crf`). The body's own heads are left out."""
    allowed, start, end = constraints if constraints is not None else (None, None, None)
    states = body.get_layer(states_layer).output
    emissions = tf.keras.layers.Dense(num_tags, name="logits")(states)
    potentials = CRF(num_tags, allowed=allowed, start_allowed=start, end_allowed=end, name="crf")(
        emissions, mask=mask)
    return tf.keras.Model(body.input, {"logits": emissions, "potentials": potentials}, name=name)


def build_bilstm_crf_student(vocab_size: int, num_tags: int, constraints: Optional[Constraints] = None,
                             embedding_dim: int = 300, hidden: int = 300, dropout: float = 0.5,
                             embeddings: Optional[np.ndarray] = None, freeze_embeddings: bool = False,
                             name: str = "bilstm_crf_student") -> tf.keras.Model:
    """BiLSTM+CRF student: inputs {"input_ids", "attention_mask"} [B, T] int32, outputs
    {"logits", "potentials"} [B, T, num_tags] float32.

    `constraints` = `student_crf_constraints(tag_vocab, scheme)` (None: every move allowed).
    `hidden` units per direction; `dropout` on the embeddings and on the BiLSTM output.
    `embeddings` [vocab_size, embedding_dim] initialises the word embeddings (None: random).
    """
    body = build_bilstm_student(vocab_size, num_tags, embedding_dim=embedding_dim, hidden=hidden,
                                teacher_hidden=1, dropout=dropout, embeddings=embeddings,
                                freeze_embeddings=freeze_embeddings, name=f"{name}_body")
    mask = body.get_layer("sequence_mask").output
    return _crf_head(body, "bilstm_dropout", mask, num_tags, constraints, name)


def build_transformer_crf_student(vocab_size: int, num_tags: int, constraints: Optional[Constraints] = None,
                                  embedding_dim: int = 240, depth: int = StudentArch.depth,
                                  heads: int = StudentArch.heads, ffn: int = StudentArch.ffn,
                                  max_length: int = 512, dropout: float = StudentArch.dropout,
                                  embeddings: Optional[np.ndarray] = None, freeze_embeddings: bool = False,
                                  name: str = "transformer_crf_student") -> tf.keras.Model:
    """`build_transformer_student`'s body (layer `encoder`) with the CRF head; inputs and outputs
    as `build_bilstm_crf_student`'s. `embedding_dim` must divide by `heads`."""
    body = build_transformer_student(vocab_size, num_tags, embedding_dim=embedding_dim, depth=depth, heads=heads,
                                     ffn=ffn, teacher_hidden=1, max_length=max_length, dropout=dropout,
                                     embeddings=embeddings, freeze_embeddings=freeze_embeddings,
                                     name=f"{name}_body")
    mask = SequenceMask(name="sequence_mask")(body.input["attention_mask"])
    return _crf_head(body, "encoder_dropout", mask, num_tags, constraints, name)
