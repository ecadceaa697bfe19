"""XtremeDistil students as Keras functional models with stable layer names.

Layout (paper section 3 and 4), with `heads_on="projection"` (the default; the authors' code):

    input_ids ─> word_embedding ─> dropout ─> bilstm | encoder ─> dropout ─> projection (GELU, W^f b^f)
                                                                               ├─> dropout ─> logits  (W^r b^r)
                                                                               └─> dropout ─> softmax (W^s) ─> probs

With `heads_on="states"` (the paper's equations: W^r, W^s in R^{C x 2H}) logits and softmax read
the BiLSTM/encoder states and the projection only feeds the representation loss, so it leaves the
served graph (export.serving.served_model): at (E, H) = (50, 200) that is 308K fewer parameters
and 43% fewer multiply-adds per token (docs/benchmarks.md, issue 6).

A BiLSTM tagger with `case_dim` > 0 also reads "case_ids" [B, T], each piece's word shape (data/shapes.py), whose
`case_embedding` joins the word embeddings before the BiLSTM (`_embedded`).

Outputs, a dict: "projection" [B, T, H_T] (compared with the teacher's hidden states),
"logits" [B, T, N] (regresses the teacher's logits), "probs" [B, T, N] (softmax over the tags,
trained on labels). The layer names `word_embedding`, `bilstm`/`encoder`, `projection`,
`logits`, `softmax` are what unfreezing schedules name (methods/strategies.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.shapes import SHAPES
from xtremedistil_tf.students.embeddings import check_embeddings
from xtremedistil_tf.students.layers import SequenceMask, TransformerEncoder, plain_recurrence_on_cpu

OUTPUTS = ("projection", "logits", "probs")
HEADS_ON = ("projection", "states")
ARCHITECTURES = ("bilstm", "transformer")
EMBEDDINGS = ("svd", "random", "teacher")   # SVD of the teacher's word embeddings to E, random, the teacher's (frozen)


@dataclass
class StudentArch:
    """What a student of either method is built of (methods/student_run.build_student). Paper
    defaults (Table 12): E=300 (SVD of the teacher's embeddings), H=2x600, dropout 0.2; its 35x
    configuration is E=50, H=200."""

    architecture: str = "bilstm"     # one of ARCHITECTURES
    embedding_dim: int = 300         # E
    hidden: int = 600                # BiLSTM units per direction H
    depth: int = 3                   # transformer blocks
    heads: int = 4                   # transformer attention heads
    ffn: int = 960                   # transformer feed-forward size
    embeddings: str = "svd"          # one of EMBEDDINGS
    dropout: float = 0.2
    case_dim: int = 0                # width of the word-shape embedding beside each piece's (0: none)


def _inputs():
    return (tf.keras.Input(shape=(None,), dtype=tf.int32, name="input_ids"),
            tf.keras.Input(shape=(None,), dtype=tf.int32, name="attention_mask"))


def _word_embedding(vocab_size: int, embedding_dim: int):
    return tf.keras.layers.Embedding(
        vocab_size, embedding_dim, name="word_embedding",
        embeddings_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1))


CASE_INPUT = "case_ids"
CASE_EMBEDDING = "case_embedding"


def _embedded(vocab_size: int, embedding_dim: int, case_dim: int, inputs: dict):
    """Each piece's word embedding [B, T, E], and with `case_dim` > 0 its word shape's embedding
    (data/shapes.py; layer `case_embedding`, read from the input "case_ids" [B, T] it adds to `inputs`)
    concatenated after it: [B, T, E + case_dim]."""
    x = _word_embedding(vocab_size, embedding_dim)(inputs["input_ids"])
    if case_dim <= 0:
        return x
    inputs[CASE_INPUT] = tf.keras.Input(shape=(None,), dtype=tf.int32, name=CASE_INPUT)
    case = tf.keras.layers.Embedding(len(SHAPES), case_dim, name=CASE_EMBEDDING,
                                     embeddings_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1))
    return tf.keras.layers.Concatenate(name="embeddings_and_case")([x, case(inputs[CASE_INPUT])])


def reads_case(model: tf.keras.Model) -> bool:
    """Whether `model` reads word shapes ("case_ids") beside its pieces."""
    return CASE_INPUT in model.input_names


def _heads(states, num_tags: int, teacher_hidden: int, dropout: float, heads_on: str = "projection") -> dict:
    """Projection, logit regressor and softmax head on `states` [..., width] -> output dict; the
    two task heads read the projection or the states themselves (`heads_on`, see the module docstring)."""
    if heads_on not in HEADS_ON:
        raise ValueError(f"heads_on must be one of {HEADS_ON}; got {heads_on!r}")
    projection = tf.keras.layers.Dense(teacher_hidden, activation="gelu", name="projection")(states)
    dropped = tf.keras.layers.Dropout(dropout, name="projection_dropout")(projection)
    head_input = dropped if heads_on == "projection" else states
    logits = tf.keras.layers.Dense(num_tags, name="logits")(head_input)
    # Eq. 1 has no bias for W^s.
    scores = tf.keras.layers.Dense(num_tags, use_bias=False, name="softmax")(head_input)
    probs = tf.keras.layers.Activation("softmax", dtype="float32", name="probs")(scores)
    return {"projection": projection, "logits": logits, "probs": probs}


def _finish(model: tf.keras.Model, embeddings: Optional[np.ndarray], freeze_embeddings: bool):
    layer = model.get_layer("word_embedding")
    if embeddings is not None:
        layer.set_weights([check_embeddings(embeddings, layer.input_dim, layer.output_dim)])
    # A frozen layer is kept frozen by the staged loop (it never unfreezes what starts frozen).
    layer.trainable = not freeze_embeddings
    plain_recurrence_on_cpu(model)
    return model


def build_bilstm_student(vocab_size: int, num_tags: int, embedding_dim: int = StudentArch.embedding_dim,
                         hidden: int = StudentArch.hidden, teacher_hidden: int = 768,
                         dropout: float = StudentArch.dropout,
                         embeddings: Optional[np.ndarray] = None, freeze_embeddings: bool = False,
                         name: str = "bilstm_student", heads_on: str = "projection",
                         case_dim: int = StudentArch.case_dim) -> tf.keras.Model:
    """Token-tagging student: embeddings, one BiLSTM layer (`hidden` units per direction), heads.

    Inputs {"input_ids", "attention_mask"} [B, T] int32, and "case_ids" [B, T] with `case_dim` > 0 (`_embedded`);
    outputs as in the module docstring.
    Defaults: StudentArch's (the paper's).
    `embeddings` [vocab_size, embedding_dim] initialises the word embeddings (e.g.
    `svd_reduce(teacher.word_embeddings(), E)`, or the teacher's own matrix with
    `freeze_embeddings=True`); None keeps a random uniform(-0.1, 0.1) init. `heads_on`:
    "projection" or "states" (module docstring).
    """
    input_ids, attention_mask = _inputs()
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    mask = SequenceMask(name="sequence_mask")(attention_mask)
    x = _embedded(vocab_size, embedding_dim, case_dim, inputs)
    x = tf.keras.layers.Dropout(dropout, name="embedding_dropout")(x)
    x = tf.keras.layers.Bidirectional(tf.keras.layers.LSTM(hidden, return_sequences=True),
                                      name="bilstm")(x, mask=mask)
    x = tf.keras.layers.Dropout(dropout, name="bilstm_dropout")(x)
    outputs = _heads(x, num_tags, teacher_hidden, dropout, heads_on)
    model = tf.keras.Model(inputs, outputs, name=name)
    return _finish(model, embeddings, freeze_embeddings)


def build_transformer_student(vocab_size: int, num_tags: int, embedding_dim: int = 240,
                              depth: int = StudentArch.depth, heads: int = StudentArch.heads,
                              ffn: int = StudentArch.ffn, teacher_hidden: int = 768, max_length: int = 512,
                              dropout: float = StudentArch.dropout,
                              embeddings: Optional[np.ndarray] = None, freeze_embeddings: bool = False,
                              name: str = "transformer_student", heads_on: str = "projection") -> tf.keras.Model:
    """Token-tagging student with a `depth`-block transformer (layer `encoder`) instead of the BiLSTM.

    Same inputs, outputs and heads as `build_bilstm_student`; Table 15 pairs e.g. E=240, depth 3
    with the BiLSTM E=100, H=600 at similar latency. `embedding_dim` must divide by `heads`.
    """
    input_ids, attention_mask = _inputs()
    x = _word_embedding(vocab_size, embedding_dim)(input_ids)
    x = tf.keras.layers.Dropout(dropout, name="embedding_dropout")(x)
    x = TransformerEncoder(embedding_dim, depth, heads, ffn, max_length=max_length, dropout=dropout,
                           name="encoder")([x, attention_mask])
    x = tf.keras.layers.Dropout(dropout, name="encoder_dropout")(x)
    outputs = _heads(x, num_tags, teacher_hidden, dropout, heads_on)
    model = tf.keras.Model({"input_ids": input_ids, "attention_mask": attention_mask}, outputs, name=name)
    return _finish(model, embeddings, freeze_embeddings)


def build_bilstm_classifier(vocab_size: int, num_classes: int, embedding_dim: int = StudentArch.embedding_dim,
                            hidden: int = StudentArch.hidden, teacher_hidden: int = 768,
                            dropout: float = StudentArch.dropout,
                            embeddings: Optional[np.ndarray] = None, freeze_embeddings: bool = False,
                            name: str = "bilstm_classifier", heads_on: str = "projection") -> tf.keras.Model:
    """Sentence-classification student (paper 6.6): the BiLSTM's last states (forward state at the
    last real token, backward state at the first) feed projection, regression and softmax.

    Outputs "projection" [B, H_T], "logits" [B, C], "probs" [B, C]; compare with the teacher's
    [CLS] hidden state and logits.
    """
    input_ids, attention_mask = _inputs()
    mask = SequenceMask(name="sequence_mask")(attention_mask)
    x = _word_embedding(vocab_size, embedding_dim)(input_ids)
    x = tf.keras.layers.Dropout(dropout, name="embedding_dropout")(x)
    x = tf.keras.layers.Bidirectional(tf.keras.layers.LSTM(hidden), name="bilstm")(x, mask=mask)
    x = tf.keras.layers.Dropout(dropout, name="bilstm_dropout")(x)
    outputs = _heads(x, num_classes, teacher_hidden, dropout, heads_on)
    model = tf.keras.Model({"input_ids": input_ids, "attention_mask": attention_mask}, outputs, name=name)
    return _finish(model, embeddings, freeze_embeddings)


def encoder_layer_name(student: tf.keras.Model) -> str:
    """`bilstm` or `encoder`: the name of the student's sequence layer."""
    names = {layer.name for layer in student.layers}
    for candidate in ("bilstm", "encoder"):
        if candidate in names:
            return candidate
    raise ValueError(f"student {student.name} has neither a 'bilstm' nor an 'encoder' layer")
