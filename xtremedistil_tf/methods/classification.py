"""Distil a sentence-classification student (paper section 6.6) with any XtremeDistil strategy.

The same staged loop as tagging (methods/staged.py) runs on the BiLSTM classifier of
students/models.py, whose last states feed projection, logit regressor and softmax; the cache
(teachers/classifier.py) holds per text the teacher's class logits and its [CLS] state at
`--teacher_layer`. Steps are selected on dev loss; dev macro-F1 is recorded per step.
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.alignment import CompiledPerStudent
from xtremedistil_tf.data.classification import ClassVocab, encode_texts, predict_by_length_texts
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.students.models import build_bilstm_classifier
from xtremedistil_tf.teachers.classifier import score_texts
from xtremedistil_tf.methods.staged import DistilConfig, EvaluateFn, head_argmax_fn
from xtremedistil_tf.methods.student_run import StudentConfig, distil_staged, student_embeddings



def build_classifier_student(cfg: StudentConfig, teacher) -> tf.keras.Model:
    """The BiLSTM classifier for `teacher`'s pieces and classes (embeddings as `cfg.arch.embeddings`)."""
    arch = cfg.arch
    if arch.architecture != "bilstm":
        raise ConfigError(f"sentence classification has a BiLSTM student only; got --student_architecture="
                          f"{arch.architecture}")
    if cfg.method != "xtremedistil":
        raise ConfigError(f"--method={cfg.method} is for CRF taggers; sentence classification uses xtremedistil")
    matrix = teacher.word_embeddings()
    embeddings, frozen = student_embeddings(arch, matrix)
    return build_bilstm_classifier(
        vocab_size=matrix.shape[0], num_classes=len(teacher.tag_vocab), hidden=arch.hidden, dropout=arch.dropout,
        embedding_dim=matrix.shape[1] if arch.embeddings == "teacher" else arch.embedding_dim,
        teacher_hidden=teacher.hidden_size, embeddings=embeddings, freeze_embeddings=frozen, heads_on=cfg.heads_on)


def predict_classes(student: tf.keras.Model, arrays, head: str = "softmax", batch_size: int = 64,
                    argmax_fn=None) -> np.ndarray:
    """Class ids [N] from the `softmax` (probs) or `logits` head (or a given `head_argmax_fn`)."""
    return predict_by_length_texts(arrays, argmax_fn or head_argmax_fn(student, head), batch_size)


def make_dev_class_f1(sentences: Sequence[Sentence], tokenizer, vocab: ClassVocab, max_seq_length: int) -> EvaluateFn:
    """An `evaluate_fn` for `train_student`: macro-F1 of a head's classes on dev."""
    arrays = encode_texts(sentences, tokenizer, vocab, max_seq_length)
    argmax_fns = CompiledPerStudent(head_argmax_fn)

    def dev_f1(student: tf.keras.Model, head: str) -> float:
        classes = predict_classes(student, arrays, argmax_fn=argmax_fns(student, head))
        return score_texts(vocab, sentences, classes)["all"]["f1"]

    return dev_f1


def distil_classifier(cfg: DistilConfig, teacher, tokenizer, transfer_dir, dev_cache_dir, train_texts: int,
                      dev: Sequence[Sentence], progress: bool = False, log_dir=None, **run):
    """Distil a new classifier with the configured strategy; returns (student, history).

    The labeled texts are the first `train_texts` examples of the transfer cache, as for tagging;
    steps with a classifier head record their dev macro-F1. `run`: student_run.distil_staged's
    checkpoint_dir, distribution, transfer_keep, shared_stages."""
    evaluate_fn = make_dev_class_f1(dev, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    return distil_staged(cfg, lambda: build_classifier_student(cfg, teacher), evaluate_fn, teacher.tag_vocab,
                         transfer_dir, dev_cache_dir, train_texts, progress, log_dir, tokenizer=tokenizer, **run)


def evaluate_classifier_student(student: tf.keras.Model, tokenizer, vocab: ClassVocab, max_seq_length: int,
                                sentences: Sequence[Sentence]) -> Dict:
    """Accuracy and macro P/R/F1 of the student's softmax head, overall and per language."""
    arrays = encode_texts(sentences, tokenizer, vocab, max_seq_length)
    return score_texts(vocab, sentences, predict_classes(student, arrays))
