"""The student and teacher masked-LM models of dual training.

Student: a BERT (`TFBertForMaskedLM`) with the student vocabulary and narrow sizes; its MLM decoder is
tied to its input embeddings, as in BERT. Saved with `save_pretrained` next to its tokenizer, so
`TFAutoModel.from_pretrained(dir)` (the NER pipeline's encoder loader) reads its encoder unchanged.

Teacher: the pretrained BERT as a `TFBertForMaskedLM`, plus what dual training adds (`DualTeacher`):
  - the student vocabulary's table in the teacher: the *student's own* word embeddings [V_s, e] times a
    learned up-projection P [e, H_t], used in place of the teacher's table for positions segmented with
    the student vocabulary. The paper leaves open how student pieces enter a teacher of another width;
    sharing the student table (rather than a separate [V_s, H_t] teacher table) is what lets the
    teacher's masked-LM gradient reach the student at all when no projection loss is used: DualTrain's
    transfer goes through these embeddings.
  - the student-vocabulary softmax: logits = transform(h) @ (E_s P)^T + b_s, tied to the same
    up-projected table as the teacher's own decoder is tied to its input table.
"""
from __future__ import annotations

import logging
from typing import Dict, Tuple

import tensorflow as tf
from transformers import BertConfig, TFBertForMaskedLM, TFBertModel

from xtremedistil_tf.io import atomic_dir
from xtremedistil_tf.methods.subwords.dual import IGNORE

log = logging.getLogger(__name__)


def student_config(vocab_size: int, hidden: int, layers: int = 6, heads: int = 4, intermediate: int = 0,
                   max_position: int = 512, dropout: float = 0.1):
    """A BertConfig for the student (intermediate 0: 4 x hidden, BERT's ratio)."""
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not a multiple of {heads} attention heads")
    return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, intermediate_size=intermediate or 4 * hidden,
                      max_position_embeddings=max_position, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout)


def _build(model) -> None:
    model(input_ids=tf.constant([[2, 5, 3]]), attention_mask=tf.constant([[1, 1, 1]]))


def build_student(config, seed: int = 0):
    """A randomly initialised student masked LM, built (its variables exist)."""
    # Keras' seeding (TF's, and the seeds of unseeded initializers under engine.stateful_dropout).
    tf.keras.utils.set_random_seed(seed)
    model = TFBertForMaskedLM(config)
    _build(model)
    return model


def load_teacher(path) -> Tuple[object, bool]:
    """(TFBertForMaskedLM, head_pretrained). A checkpoint without MLM head weights (sentence-transformers
    checkpoints such as all-MiniLM-L6-v2) gets a freshly initialised head: transform + bias, decoder
    tied to the input embeddings; head_pretrained is then False."""
    model, info = TFBertForMaskedLM.from_pretrained(str(path), output_loading_info=True)
    head_missing = [k for k in info.get("missing_keys", []) if "predictions" in k or "mlm" in k or "cls" in k]
    if head_missing:
        log.info("teacher %s has no MLM head weights (%d missing); the head is freshly initialised",
                 path, len(head_missing))
    _build(model)
    return model, not head_missing


def word_embeddings(model) -> tf.Variable:
    """The input (and tied output) word-embedding table [V, H] of a TFBertForMaskedLM."""
    return model.bert.embeddings.weight


def encoder_variables(model) -> list:
    """Trainable variables of the pretrained encoder (the MLM head excluded)."""
    return list(model.bert.trainable_variables)


def gather_masked(hidden: tf.Tensor, labels: tf.Tensor, *others: tf.Tensor):
    """Positions to predict: hidden [B, L, H] -> [N, H], labels [B, L] -> [N], and each of `others`
    [B, L] -> [N], in row-major order."""
    keep = tf.not_equal(labels, IGNORE)
    return (tf.boolean_mask(hidden, keep), tf.boolean_mask(labels, keep)) + tuple(
        tf.boolean_mask(o, keep) for o in others)


def transform(model, hidden: tf.Tensor) -> tf.Tensor:
    """The MLM head's dense + GELU + LayerNorm on [N, H] (its LayerNorm was built for rank 3, so the
    gathered positions pass as one [1, N, H] sequence)."""
    return model.mlm.predictions.transform(hidden_states=hidden[None])[0]


def mlm_logits(model, hidden: tf.Tensor) -> tf.Tensor:
    """A TFBertForMaskedLM's own-vocabulary logits [N, V] for hidden states [N, H]."""
    head = model.mlm.predictions
    h = transform(model, hidden)
    return tf.matmul(h, word_embeddings(model), transpose_b=True) + head.bias


def sum_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Summed CE, in float32 under a mixed-precision policy too."""
    return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                        logits=tf.cast(logits, tf.float32)))


class DualTeacher(tf.Module):
    """The teacher with a student-vocabulary input table and softmax (see the module docstring).

    `student_embeddings` (the student's [V_s, e] table) is passed to each call, not owned, so the
    teacher's loss trains it."""

    def __init__(self, teacher, student_width: int, student_vocab_size: int, seed: int = 0):
        super().__init__(name="dual_teacher")
        self.teacher = teacher
        width = int(word_embeddings(teacher).shape[1])
        self.up = tf.Variable(tf.keras.initializers.GlorotUniform(seed)((student_width, width)),
                              name="student_table_up_projection")
        self.student_bias = tf.Variable(tf.zeros([student_vocab_size]), name="student_vocab_bias")

    @property
    def new_variables(self) -> list:
        """Variables dual training adds, and the teacher's MLM head (all start untrained)."""
        encoder = {v.ref() for v in encoder_variables(self.teacher)}
        head = [v for v in self.teacher.mlm.trainable_variables if v.ref() not in encoder]
        return head + [self.up, self.student_bias]

    def student_table(self, student_embeddings: tf.Tensor) -> tf.Tensor:
        """[V_s, H_t]: the student table up-projected to the teacher's width."""
        return tf.matmul(student_embeddings, self.up)

    def embed(self, ids: tf.Tensor, is_student: tf.Tensor, student_embeddings: tf.Tensor) -> tf.Tensor:
        """[B, L, H_t] input embeddings: each id read from the table of its vocabulary."""
        flag = tf.cast(is_student, tf.bool)
        teacher_rows = tf.gather(word_embeddings(self.teacher), tf.where(flag, 0, ids))
        student_rows = tf.gather(self.student_table(student_embeddings), tf.where(flag, ids, 0))
        return tf.where(flag[..., None], student_rows, teacher_rows)

    def masked_loss(self, batch: Dict[str, tf.Tensor], student_embeddings: tf.Tensor, training: bool = False):
        """(summed CE, masked positions, correct predictions) over the teacher's masked positions, each
        predicted with the softmax of the vocabulary its word was segmented with."""
        embeds = self.embed(batch["t_ids"], batch["t_is_student"], student_embeddings)
        out = self.teacher.bert(input_ids=None, inputs_embeds=embeds, attention_mask=batch["t_attn"], training=training)
        hidden, labels, is_student = gather_masked(out.last_hidden_state, batch["t_labels"], batch["t_is_student"])
        head = self.teacher.mlm.predictions
        h = transform(self.teacher, hidden)
        flag = tf.cast(is_student, tf.bool)
        t_logits = tf.matmul(tf.boolean_mask(h, ~flag), word_embeddings(self.teacher), transpose_b=True) + head.bias
        s_logits = tf.matmul(tf.boolean_mask(h, flag), self.student_table(student_embeddings),
                             transpose_b=True) + self.student_bias
        t_labels, s_labels = tf.boolean_mask(labels, ~flag), tf.boolean_mask(labels, flag)
        loss = sum_cross_entropy(t_labels, t_logits) + sum_cross_entropy(s_labels, s_logits)
        correct = (_count_correct(t_labels, t_logits) + _count_correct(s_labels, s_logits))
        return loss, tf.size(labels), correct


def _count_correct(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=labels.dtype), labels), tf.int32))


def parameter_count(model) -> int:
    return int(sum(int(tf.size(v)) for v in model.trainable_variables))


def encoder_parameter_count(config) -> int:
    """Parameters of the encoder the NER pipeline fine-tunes (TFBertModel with its pooler; the MLM head
    is left out, as in the paper's Table 1)."""
    model = TFBertModel(config)
    _build(model)
    return parameter_count(model)


def save_student(model, tokenizer, directory) -> None:
    """The student masked LM and its tokenizer in one dir (written atomically)."""
    with atomic_dir(directory) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))


def load_student(directory):
    model = TFBertForMaskedLM.from_pretrained(str(directory))
    _build(model)
    return model
