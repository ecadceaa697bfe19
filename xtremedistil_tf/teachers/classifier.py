"""A sequence-classification teacher (paper section 6.6): the encoder's [CLS] state, dropout and a
dense layer over the classes; its fine-tuning, scoring and cached outputs.

The [CLS] state of the last layer is used rather than the pooler: not every BERT-family model
has a trained pooler (sentence-transformers checkpoints such as all-MiniLM-L6-v2 do not), and
the student's representation loss reads the [CLS] state of `--teacher_layer` the same way.
Save layout: TokenTeacher's, with `"task": "classification"` in teacher.json.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.classification import ClassVocab, encode_texts, predict_by_length_texts
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.engine.resume import EpochCheckpoint
from xtremedistil_tf.data.scoring import class_scores, score_by_language
from xtremedistil_tf.teachers.finetune import FinetuneConfig, FinetuneResult, arrays_dataset, train_with_early_stopping
from xtremedistil_tf.teachers.model import TokenTeacher, build_teacher

TASK = "classification"


class SequenceTeacher(TokenTeacher):
    """`call` returns class logits [B, C]; `call_with_hidden(inputs, layer)` also returns the [CLS]
    state of hidden_states[layer] [B, H]. `tag_vocab` is a ClassVocab; `predict_tags_fn` (inherited)
    gives class ids [B]. Fine-tuning minimises the mean cross-entropy over labeled texts (label_ids
    [B]; NO_LABEL rows do not count), its registry entry `LOSS`."""

    LOSS = "teacher_class_ce"

    def call(self, inputs, training=False):
        out = self._encode(inputs, training, output_hidden_states=False)
        return self.classifier(self.dropout(out.last_hidden_state[:, 0], training=training))

    def call_with_hidden(self, inputs, layer: int):
        self.check_layer(layer)
        out = self._encode(inputs, False, output_hidden_states=True)
        return self.classifier(out.last_hidden_state[:, 0]), out.hidden_states[layer][:, 0]

    @staticmethod
    def vocab_of(labels: Sequence[str]) -> ClassVocab:
        return ClassVocab(labels)

    def meta(self) -> dict:
        return {**super().meta(), "task": TASK}


def build_sequence_teacher(name_or_path: str, labels: Sequence[str], max_seq_length: int = 128,
                           dropout: float = 0.1, random_init: bool = False,
                           config_overrides: Optional[dict] = None):
    """A fresh classification teacher (pretrained encoder, new head) and its tokenizer."""
    return build_teacher(name_or_path, labels, max_seq_length, dropout, random_init, config_overrides,
                         teacher_class=SequenceTeacher)


def evaluate_sequence_teacher(teacher: SequenceTeacher, tokenizer, sentences: Sequence[Sentence],
                              batch_size: int = 64) -> Dict:
    """Accuracy and macro P/R/F1 of the teacher's classes, overall and per language."""
    arrays = encode_texts(sentences, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    predicted = predict_by_length_texts(arrays, teacher.predict_tags_fn(), batch_size)
    return score_texts(teacher.tag_vocab, sentences, predicted)


def score_texts(vocab: ClassVocab, sentences: Sequence[Sentence], predicted: np.ndarray) -> Dict:
    """Class scores of predicted class ids [N] against the sentences' labels."""
    return score_by_language([s.label for s in sentences], [vocab.labels[i] for i in predicted],
                             [s.lang for s in sentences], scorer=class_scores)


def finetune_sequence_teacher(teacher: SequenceTeacher, tokenizer, train: Sequence[Sentence],
                              dev: Sequence[Sentence], config: FinetuneConfig, log_dir: Optional[str] = None,
                              checkpoint: Optional[EpochCheckpoint] = None,
                              distribution: Optional[tf.distribute.Strategy] = None,
                              callbacks: Sequence[tf.keras.callbacks.Callback] = ()) -> FinetuneResult:
    """Fine-tune on labeled texts, early-stopped on dev macro-F1: the token teachers' loop
    (finetune.train_with_early_stopping, its arguments), so each epoch's order is a function of the
    seed and the epoch and a run resumes exactly from `checkpoint`."""
    tf.keras.utils.set_random_seed(config.seed)
    arrays = encode_texts(train, tokenizer, teacher.tag_vocab, teacher.max_seq_length).as_dict()

    def dataset(seed: int) -> tf.data.Dataset:
        return arrays_dataset(arrays, config.batch_size, shuffle=True, seed=seed, reshuffle=False,
                              group=config.group_by_length)

    return train_with_early_stopping(
        teacher, dataset, len(arrays["input_ids"]),
        lambda: evaluate_sequence_teacher(teacher, tokenizer, dev)["all"]["f1"], config, log_dir=log_dir,
        checkpoint=checkpoint, distribution=distribution, callbacks=callbacks)
