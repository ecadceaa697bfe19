"""BERT+CRF teacher of the multi-grained KD paper (Zhou et al., NAACL 2021, Sec. 5.2, Table 6).

`CRFTokenTeacher` is a `TokenTeacher` (encoder -> dropout -> dense logits over the piece-level
tags) with a linear-chain CRF on top. `call` still returns the raw logits, so the cache, logit
regression and `call_with_hidden` are unchanged; the CRF adds potentials, the NLL, Viterbi and
k-best surrogates. Paper settings: dropout 0.5 on the embedding output and on BERT's output;
learning rate 1e-3 for the logits and the CRF, 1e-5 for the top encoder layer with 0.9 decay per
layer going down (`crf_finetune_config`).

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

import json
import logging
from pathlib import Path
from typing import Dict, Sequence

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf.layer import CRF
from xtremedistil_tf.crf.ops import allowed_transitions
from xtremedistil_tf.data.alignment import CLS_TAG, SEP_TAG, TagVocab, Windows, decode, encode
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.evaluate import score_by_language
from xtremedistil_tf.io import atomic_dir
from xtremedistil_tf.teachers.finetune import (FinetuneConfig, FinetuneResult, _run_epoch, parameter_groups,
                                               windows_dataset)
from xtremedistil_tf.teachers.model import FORMAT_VERSION, TokenTeacher, load_encoder, load_tokenizer
from xtremedistil_tf.teachers.surrogates import make_surrogate_fn

log = logging.getLogger(__name__)

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

    def nll(self, batch, training=False):
        """Mean CRF NLL of label_ids over the labeled windows of `batch` (input_ids,
        attention_mask, label_ids [B, T]); unlabeled windows (PAD tags inside the length) are skipped."""
        mask = tf.cast(batch["attention_mask"], tf.bool)
        lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
        labeled = tf.reduce_all(tf.not_equal(batch["label_ids"], self.tag_vocab.pad_id) | ~mask, axis=1)
        nll = -self.crf.log_likelihood(self.potentials(batch, training), batch["label_ids"], lengths)
        labeled = tf.cast(labeled, tf.float32)
        return tf.math.divide_no_nan(tf.reduce_sum(nll * labeled), tf.reduce_sum(labeled))

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

    def save(self, directory, tokenizer) -> None:
        """TokenTeacher's layout plus crf.npz (raw transitions) and head/scheme/embedding_dropout
        in teacher.json; written to a temporary dir and renamed, like the base layout."""
        with atomic_dir(directory) as tmp:
            super().save(tmp, tokenizer)
            np.savez(tmp / "crf.npz", transitions=self.crf.raw_transitions.numpy())
            meta = json.loads((tmp / "teacher.json").read_text(encoding="utf-8"))
            meta.update(head=HEAD_TYPE, scheme=self.scheme, embedding_dropout=self.embedding_dropout_rate)
            (tmp / "teacher.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")


def build_crf_teacher(name_or_path: str, labels: Sequence[str], scheme: str, max_seq_length: int = 128,
                      dropout: float = 0.5, embedding_dropout: float = 0.5, random_init: bool = False,
                      config_overrides=None):
    """A fresh CRF teacher (pretrained or random encoder, new head and CRF) and its tokenizer."""
    encoder = load_encoder(name_or_path, random_init, config_overrides)
    teacher = CRFTokenTeacher(encoder, TagVocab(labels), scheme, max_seq_length, dropout, embedding_dropout)
    teacher.build_for_length()
    return teacher, load_tokenizer(name_or_path)


def load_crf_teacher(directory):
    """Reload a teacher written by `CRFTokenTeacher.save`; returns (teacher, tokenizer)."""
    from transformers import TFAutoModel

    directory = Path(directory)
    meta_path = directory / "teacher.json"
    if not meta_path.exists():
        raise ConfigError(f"{directory} is not a saved teacher (no teacher.json)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format_version") != FORMAT_VERSION or meta.get("head") != HEAD_TYPE:
        raise ConfigError(f"{meta_path}: not a CRF teacher of format {FORMAT_VERSION} "
                          f"(head={meta.get('head')!r}, format_version={meta.get('format_version')})")
    encoder = TFAutoModel.from_pretrained(str(directory / "encoder"))
    teacher = CRFTokenTeacher(encoder, TagVocab(meta["labels"]), meta["scheme"], meta["max_seq_length"],
                              meta["dropout"], meta["embedding_dropout"])
    teacher.build_for_length()
    head = np.load(directory / "head.npz")
    teacher.classifier.set_weights([head["kernel"], head["bias"]])
    teacher.crf.raw_transitions.assign(np.load(directory / "crf.npz")["transitions"])
    return teacher, load_tokenizer(str(directory / "encoder"))


def crf_finetune_config(**overrides) -> FinetuneConfig:
    """The paper's teacher settings (Table 6, Sec. 5.2); keyword arguments override them."""
    settings = dict(batch_size=32, learning_rate=1e-5, head_learning_rate=1e-3, layer_decay=0.9)
    settings.update(overrides)
    return FinetuneConfig(**settings)


def crf_parameter_groups(teacher: CRFTokenTeacher, config: FinetuneConfig, total_steps: int):
    """finetune.parameter_groups with the CRF transitions added to the head's group (its last)."""
    groups = parameter_groups(teacher, config, total_steps)
    head_optimizer, _ = groups[-1]
    return groups[:-1] + [(head_optimizer, teacher.head_variables)]


def make_crf_train_step(teacher: CRFTokenTeacher, groups):
    """One compiled step: CRF NLL, one optimizer per parameter group."""
    variables = [v for _, vs in groups for v in vs]
    spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[{"input_ids": spec, "attention_mask": spec, "label_ids": spec}])
    def train_step(batch):
        with tf.GradientTape() as tape:
            loss = teacher.nll(batch, training=True)
        grads = iter(tape.gradient(loss, variables))
        for optimizer, group in groups:
            optimizer.apply_gradients([(next(grads), v) for v in group])
        return loss

    return train_step


def predict_piece_tags_crf(teacher: CRFTokenTeacher, windows: Windows, batch_size: int = 64) -> np.ndarray:
    """Viterbi tag id per piece, [W, L]; windows batched by length to skip padding."""
    tags_fn = teacher.predict_tags_fn()
    order = np.argsort(windows.attention_mask.sum(1), kind="stable")
    out = np.zeros(windows.input_ids.shape, dtype=np.int32)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        # At least 2: a window is [CLS] ... [SEP], and the CRF loops need a time step to scan.
        length = max(2, int(windows.attention_mask[idx].sum(1).max()))
        batch = {"input_ids": windows.input_ids[idx, :length], "attention_mask": windows.attention_mask[idx, :length]}
        out[idx, :length] = tags_fn(batch).numpy()
    return out


def evaluate_crf_teacher(teacher: CRFTokenTeacher, tokenizer, sentences: Sequence[Sentence], scheme: str,
                         batch_size: int = 64) -> Dict:
    """Entity scores of the teacher's Viterbi word-level predictions on labeled sentences."""
    windows = encode(sentences, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    predicted = decode(windows, predict_piece_tags_crf(teacher, windows, batch_size), teacher.tag_vocab)
    return score_by_language([s.tags for s in sentences], predicted, [s.lang for s in sentences], scheme)


def finetune_crf_teacher(teacher: CRFTokenTeacher, tokenizer, train: Sequence[Sentence], dev: Sequence[Sentence],
                         scheme: str, config: FinetuneConfig) -> FinetuneResult:
    """`finetune.finetune` for the CRF teacher: CRF NLL, transitions at the head rate, Viterbi
    dev F1 for early stopping; leaves the best epoch's weights in the teacher."""
    tf.keras.utils.set_random_seed(config.seed)
    windows = encode(train, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    steps = -(-len(windows) // config.batch_size)
    if config.max_steps_per_epoch:
        steps = min(steps, config.max_steps_per_epoch)
    train_step = make_crf_train_step(teacher, crf_parameter_groups(teacher, config, steps * config.epochs))
    dataset = windows_dataset(windows, config.batch_size, shuffle=True, seed=config.seed)
    result, best_weights, stale = FinetuneResult(), None, 0
    for epoch in range(config.epochs):
        losses = _run_epoch(train_step, dataset.take(steps), steps, epoch, config)
        dev_f1 = evaluate_crf_teacher(teacher, tokenizer, dev, scheme)["all"]["f1"]
        result.history.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)), "dev_f1": dev_f1})
        log.info("CRF teacher epoch %d: train loss %.4f, dev F1 %.4f", epoch + 1, np.mean(losses), dev_f1)
        if dev_f1 > result.best_dev_f1:
            result.best_dev_f1, result.best_epoch, stale = dev_f1, epoch + 1, 0
            best_weights = teacher.get_weights()
        else:
            stale += 1
            if stale >= config.patience:
                break
    if best_weights is not None:
        teacher.set_weights(best_weights)
    return result
