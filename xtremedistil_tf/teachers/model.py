"""A BERT-family encoder with a token-classification head, built through `transformers` Auto classes.

Save layout (`TokenTeacher.save(dir)`, mirrored by `teachers.saved.load_teacher(dir)`), in the spirit of
`save_pretrained`:
    dir/encoder/        the transformer and its tokenizer (`save_pretrained`)
    dir/head.npz        the classifier's kernel and bias
    dir/teacher.json    labels, max_seq_length, dropout, format version
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
from transformers import AutoConfig, AutoTokenizer, BertConfig, TFAutoModel

from xtremedistil_tf.data.alignment import TagVocab, decode
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_dir
from xtremedistil_tf.losses import registry
from xtremedistil_tf.teachers.families import config_from_dict, needs_prefix_space, usable_positions

FORMAT_VERSION = 1
# Weight files of a saved teacher are written in shards of at most this size (a tensor larger than it is a shard of its
# own): safetensors copies a file's tensors to bytes all at once, so one file of all-mpnet-base-v2 raised the teacher
# step's peak memory by 0.41 GiB, a 100 MB shard by 0.1 (docs/benchmarks.md 5.2). `from_pretrained` reads them.
SHARD_SIZE = "100MB"


class TeacherBase:
    """What every teacher reads from its transformers model, the attribute named `sized_by` (the
    encoder of a teacher trained here, a fine-tuned checkpoint as it is): depth, width, the word
    embeddings, the hidden-layer check, a dummy build, and `predict_tags_fn`, `logits_and_tags`' tags
    compiled once."""

    sized_by = "encoder"

    @property
    def num_layers(self) -> int:
        return int(getattr(self, self.sized_by).config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(getattr(self, self.sized_by).config.hidden_size)

    def word_embeddings(self) -> np.ndarray:
        """The input word-embedding matrix [vocab, hidden] (students reuse or SVD-reduce it)."""
        return getattr(self, self.sized_by).get_input_embeddings().weights[0].numpy()

    def check_layer(self, layer: int) -> None:
        """Fail before any work is done when hidden_states[layer] does not exist."""
        check_layer_range(layer, self.num_layers)

    def build_for_length(self, length: int = 8) -> None:
        """Create all variables by running one dummy batch."""
        ones = tf.ones((1, length), tf.int32)
        self({"input_ids": ones, "attention_mask": ones})

    def predict_tags_fn(self):
        """`logits_and_tags`' tag ids [B, T] as one compiled function for any batch size and length,
        built once per teacher."""
        if getattr(self, "_tags_fn", None) is None:
            spec = tf.TensorSpec([None, None], tf.int32)
            self._tags_fn = tf.function(lambda batch: self.logits_and_tags(batch)[1],
                                        input_signature=[{"input_ids": spec, "attention_mask": spec}])
        return self._tags_fn


class TokenTeacher(TeacherBase, tf.keras.Model):
    """Transformer encoder + dropout + dense logits over the piece-level tag vocabulary.

    `call` returns logits [B, T, num_tags]; `call_with_hidden(inputs, layer)` also returns
    hidden_states[layer] ([B, T, H]; 0 is the embedding output, as in `transformers`).
    Fine-tuning minimises the losses/registry.py entry `LOSS` names (a subclass with another head
    names its own and gives the outputs it reads, `loss_outputs`).
    """

    LOSS = "teacher_token_ce"

    def __init__(self, encoder, tag_vocab: TagVocab, max_seq_length: int = 128,
                 dropout: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.tag_vocab = tag_vocab
        self.max_seq_length = int(max_seq_length)
        self.dropout_rate = float(dropout)
        self.dropout = tf.keras.layers.Dropout(dropout, name="head_dropout")
        self.classifier = tf.keras.layers.Dense(
            len(tag_vocab), name="logits",
            kernel_initializer=tf.keras.initializers.TruncatedNormal(
                stddev=getattr(encoder.config, "initializer_range", 0.02)))

    def _encode(self, inputs, training, output_hidden_states):
        return self.encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                            output_hidden_states=output_hidden_states, training=training)

    def call(self, inputs, training=False):
        out = self._encode(inputs, training, output_hidden_states=False)
        return self.classifier(self.dropout(out.last_hidden_state, training=training))

    def call_with_hidden(self, inputs, layer: int):
        self.check_layer(layer)
        out = self._encode(inputs, False, output_hidden_states=True)
        return self.classifier(out.last_hidden_state), out.hidden_states[layer]

    @property
    def head_variables(self):
        """The variables trained at the head's learning rate."""
        return self.classifier.trainable_variables

    def loss_outputs(self, batch, training=False) -> dict:
        """The outputs the fine-tuning loss reads (its registry entry's `prediction`)."""
        return {"logits": self(batch, training=training)}

    def loss(self, batch, training=False):
        """Fine-tuning loss of a batch (input_ids, attention_mask, label_ids): the registry entry
        `LOSS` names, over the positions its mask gives (here: token cross-entropy over real, labeled
        pieces, CLS, SEP and X included, as in the papers)."""
        entry = registry.get(self.LOSS)
        return entry(self.loss_outputs(batch, training), batch, entry.mask(batch, self.tag_vocab.pad_id))

    def logits_and_tags(self, batch):
        """The logits [B, T, tags] and `predict_tags_fn`'s tag ids [B, T], from one forward pass."""
        logits = self(batch, training=False)
        # Over the word labels only: a word's first piece always gets one (a teacher trained
        # on first pieces never learnt the marker columns), and no other piece is read.
        return logits, tf.argmax(logits[..., :len(self.tag_vocab.labels)], axis=-1, output_type=tf.int32)

    def decode_words(self, windows, piece_predictions: np.ndarray):
        """Word labels per sentence from `predict_tags_fn`'s piece tags (a pretrained teacher's
        columns go through its label map instead: teachers/pretrained.py)."""
        return decode(windows, piece_predictions, self.tag_vocab)

    @staticmethod
    def vocab_of(labels: Sequence[str]):
        """The head's output ids for `labels` (piece tags here; classes for a sentence head)."""
        return TagVocab(labels)

    @classmethod
    def from_meta(cls, encoder, meta: dict) -> "TokenTeacher":
        """A teacher around `encoder` with the settings saved in teacher.json."""
        return cls(encoder, cls.vocab_of(meta["labels"]), meta["max_seq_length"], meta["dropout"])

    def load_head(self, directory) -> None:
        """Restore the head's weights written by `save`."""
        head = np.load(Path(directory) / "head.npz")
        self.classifier.set_weights([head["kernel"], head["bias"]])

    def save(self, directory, tokenizer) -> None:  # noqa: D102  (Keras' save is not used for teachers)
        with atomic_dir(directory) as tmp:
            # safetensors: the h5 format keys weights by scoped names, which differ between a
            # model made with from_config and one made with from_pretrained, so it reloads wrongly.
            self.encoder.save_pretrained(str(tmp / "encoder"), safe_serialization=True, max_shard_size=SHARD_SIZE)
            tokenizer.save_pretrained(str(tmp / "encoder"))
            kernel, bias = self.classifier.get_weights()
            np.savez(tmp / "head.npz", kernel=kernel, bias=bias)
            (tmp / "teacher.json").write_text(json.dumps(self.meta(), indent=2), encoding="utf-8")

    def meta(self) -> dict:
        """What teacher.json records (subclasses add their head's settings)."""
        return {"format_version": FORMAT_VERSION, "labels": self.tag_vocab.labels,
                "max_seq_length": self.max_seq_length, "dropout": self.dropout_rate,
                "model_type": self.encoder.config.model_type}


def initialise_head(teacher, kind: str) -> None:
    """Start the head's kernel afresh: `glorot` (Glorot uniform, Keras' default) or `bert` (the
    truncated normal of the encoder's initializer_range, 0.02 for BERT); the bias at zero."""
    kernel, bias = teacher.classifier.kernel, teacher.classifier.bias
    if kind == "glorot":
        initializer = tf.keras.initializers.GlorotUniform()
    elif kind == "bert":
        initializer = tf.keras.initializers.TruncatedNormal(
            stddev=getattr(teacher.encoder.config, "initializer_range", 0.02))
    else:
        raise ConfigError(f"head_init={kind!r}; expected glorot or bert")
    kernel.assign(initializer(kernel.shape, kernel.dtype))
    bias.assign(tf.zeros_like(bias))


def load_encoder(name_or_path: str, random_init: bool = False, config_overrides: Optional[dict] = None):
    """A TF transformer from a hub name or a local dir (config.json, weights unless `random_init`)."""
    _check_local_dir(name_or_path, need_weights=not random_init)
    config = AutoConfig.from_pretrained(name_or_path, **(config_overrides or {}))
    if random_init:
        encoder = TFAutoModel.from_config(config)
        # Build now, in the encoder's own name scope, as from_pretrained does: built later inside
        # the teacher, its weight names would carry the teacher's scope and the saved
        # checkpoint would not load back with from_pretrained.
        encoder.build_in_name_scope()
        return encoder
    try:
        return TFAutoModel.from_pretrained(name_or_path, config=config)
    except (OSError, ValueError) as error:   # weights that passed check_weight_files but do not load
        reason = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise ConfigError(f"--teacher={name_or_path}: its weights could not be read: {reason}") from None


def check_hub_name(name: str) -> None:
    """A --teacher that is no local path names a model on the Hugging Face hub: its config (a few KB)
    is fetched now, or read from the hub cache when offline, so a misspelt name fails in one line
    before any work."""
    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as error:
        reason = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        raise ConfigError(f"--teacher={name}: no local directory of that name, and the Hugging Face hub "
                          f"{'cache (HF_HUB_OFFLINE=1) ' if os.environ.get('HF_HUB_OFFLINE') == '1' else ''}"
                          f"has no model of that name (a misspelling?): {reason}") from None


# The first bytes of each weight file format: HDF5 (tf_model.h5), a zip (pytorch_model.bin since
# PyTorch 1.6) or a pickle (older ones); safetensors starts with its header's length (checked apart).
_WEIGHT_MAGIC = {"tf_model.h5": (b"\x89HDF\r\n\x1a\n",), "pytorch_model.bin": (b"PK\x03\x04", b"\x80")}


def check_weight_files(path: Path) -> None:
    """Each weight file of a teacher dir can be opened and starts as its format does: one line naming
    the file otherwise (unreadable, empty, truncated or not that format), before any work."""
    for name in ("tf_model.h5", "model.safetensors", "pytorch_model.bin"):
        file = path / name
        if not file.exists():
            continue
        try:
            with file.open("rb") as f:
                head = f.read(9)
        except OSError as error:
            raise ConfigError(f"{file}: the teacher's weights cannot be read: {error.strerror}") from None
        size = file.stat().st_size
        if name == "model.safetensors":
            header = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
            ok = len(head) == 9 and head[8:9] == b"{" and 8 + header <= size
        else:
            ok = any(head.startswith(magic) for magic in _WEIGHT_MAGIC[name])
        if not ok:
            raise ConfigError(f"{file}: not a {name.rsplit('.', 1)[-1]} weight file ({size:,} bytes, "
                              f"starting {head[:8]!r}); re-download or re-save the teacher")


def load_tokenizer(name_or_path: str):
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if needs_prefix_space(tokenizer):  # byte-level BPE (RoBERTa): words are given one by one (families.py)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, add_prefix_space=True)
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"{name_or_path}: a fast tokenizer is needed for word alignment "
                          "(tokenizer.json or a vocab.txt that BertTokenizerFast can read)")
    return tokenizer


def check_layer_range(layer: int, num_layers: int) -> None:
    if not 0 <= layer <= num_layers:
        raise ConfigError(f"--teacher_layer={layer} is out of range: the teacher has "
                          f"{num_layers} layers (0 is the embedding output)")


def check_teacher_dir(name_or_path: str, need_weights: bool, layer: int, max_seq_length: int,
                      config_overrides: Optional[dict] = None) -> None:
    """Flags against a local teacher dir, before any work: config.json and readable weights present,
    `layer` and `max_seq_length` within the model's sizes. A hub name must name a model
    (check_hub_name); its sizes are checked once it is loaded."""
    if not _check_local_dir(name_or_path, need_weights):
        check_hub_name(name_or_path)
        return
    config_file = Path(name_or_path) / "config.json"
    try:
        config = {**json.loads(config_file.read_text(encoding="utf-8")), **(config_overrides or {})}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{config_file} is not valid JSON: {e}") from None
    config = config_from_dict(config)  # each family's names (DistilBERT's n_layers) as the common ones
    if getattr(config, "num_hidden_layers", None):
        check_layer_range(layer, int(config.num_hidden_layers))
    positions = usable_positions(config)
    if positions and max_seq_length > positions:
        offset = "" if positions == config.max_position_embeddings else \
            f", of which {config.model_type} uses {positions} (its positions start after pad_token_id)"
        raise ConfigError(f"--max_seq_length={max_seq_length} exceeds the teacher's max_position_embeddings="
                          f"{config.max_position_embeddings}{offset} ({config_file})")


def _check_local_dir(name_or_path: str, need_weights: bool) -> bool:
    """Clear errors for local dirs; a name that is not a path is left to the hub (or its cache).
    True when `name_or_path` is a local dir."""
    path = Path(name_or_path)
    looks_local = path.exists() or os.sep in name_or_path or name_or_path.startswith(".")
    if not looks_local:
        return False
    if not path.is_dir():
        raise ConfigError(f"teacher directory {path} " + ("is a file" if path.exists() else "does not exist"))
    if not (path / "config.json").exists():
        raise ConfigError(f"teacher directory {path} has no config.json")
    weights = ("tf_model.h5", "model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
               "tf_model.h5.index.json")
    if need_weights and not any((path / w).exists() for w in weights):
        raise ConfigError(f"teacher directory {path} has no weights (expected one of {', '.join(weights)}); "
                          "pass --teacher_random_init to start from random weights")
    if need_weights:
        check_weight_files(path)
    return True


def build_teacher(name_or_path: str, labels: Sequence[str], max_seq_length: int = 128,
                  dropout: float = 0.1, random_init: bool = False,
                  config_overrides: Optional[dict] = None, teacher_class=TokenTeacher):
    """A fresh teacher (pretrained encoder, new head of `teacher_class`) and its tokenizer."""
    encoder = load_encoder(name_or_path, random_init, config_overrides)
    teacher = teacher_class(encoder, teacher_class.vocab_of(labels), max_seq_length, dropout)
    teacher.build_for_length()
    return teacher, load_tokenizer(name_or_path)


def write_random_teacher_dir(directory, vocab: Sequence[str], config_overrides: Optional[dict] = None):
    """A local BERT dir (config.json + vocab.txt, no weights) for a randomly initialised teacher.

    Used where no pretrained model of the language can be had (MSRA without a Chinese BERT):
    the vocabulary comes from the training data.
    """
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens = specials + [t for t in vocab if t not in specials]
    config = BertConfig(vocab_size=len(tokens), **(config_overrides or {}))
    with atomic_dir(directory) as tmp:
        config.save_pretrained(str(tmp))
        (tmp / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
        # Characters and tokens are used as they are: no lower-casing or accent stripping.
        (tmp / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "BertTokenizer", "do_lower_case": False, "strip_accents": False,
             "tokenize_chinese_chars": True}), encoding="utf-8")
    return Path(directory)


def encoder_parameters(config_file) -> int:
    """About how many parameters a BERT-family encoder has, from its config.json alone (embeddings, then per
    layer attention's four projections and the feed-forward's two); 0 for a file that cannot be read."""
    try:
        config = json.loads(Path(config_file).read_text(encoding="utf-8"))
        hidden = int(config["hidden_size"])
        inner = int(config.get("intermediate_size") or 4 * hidden)
        layers = int(config["num_hidden_layers"])
        return int(config.get("vocab_size", 0)) * hidden + layers * (4 * hidden * hidden + 2 * hidden * inner)
    except (OSError, ValueError, KeyError, TypeError):
        return 0
