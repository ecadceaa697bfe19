"""The saved student directory that export and predict read (written by the pipeline):

    student_dir/model/       the Keras model, `model.save(dir)` (SavedModel format)
    student_dir/student.json {"format_version": 1, "labels", "tags", "scheme", "lower_case",
                              "max_seq_length", "architecture": "bilstm"|"transformer",
                              "decoder": "softmax"|"crf"|"classes", "tokenizer_family"}
                             ("classes": a sentence classifier; its tags are its classes)
    student_dir/vocab.txt    the teacher tokenizer's WordPiece vocabulary, one piece a line; only for a
                             WordPiece teacher (tokenizer_family "WordPiece"). student_dir/tokenizer/
                             (methods.student_run) holds the tokenizer files of any family (a SentencePiece
                             teacher's .model among them, which bin/export serves in-graph).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

import xtremedistil_tf.crf.layer  # noqa: F401  (registers CRF for load_model)
import xtremedistil_tf.students.layers  # noqa: F401  (registers SequenceMask, TransformerEncoder)
from xtremedistil_tf.students.layers import BlockBiLSTM
from xtremedistil_tf.damage import RETRAIN, reading
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.data.schemes import normalize_scheme
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_json, read_blocks, read_json
from xtremedistil_tf.teachers.families import BYTE_LEVEL_BPE, UNIGRAM, WORDPIECE

FORMAT_VERSION = 1
ARCHITECTURES = ("bilstm", "transformer")
DECODERS = ("softmax", "crf", "classes")
CLASSIFIER = "classes"
# make(old layer) -> new layer, copy_weights(old layer, new layer): see clone_replacing.
Replacement = Tuple[Callable[[tf.keras.layers.Layer], tf.keras.layers.Layer],
                    Callable[[tf.keras.layers.Layer, tf.keras.layers.Layer], None]]


@dataclass
class StudentMeta:
    """student.json. `tags` are the ids the model's outputs index: TagVocab(labels).tags for
    taggers, the labels themselves for a classifier."""

    labels: List[str]
    scheme: str = "IOB2"
    lower_case: bool = True
    max_seq_length: int = 128
    architecture: str = "bilstm"
    decoder: str = "softmax"
    tags: List[str] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    # The teacher tokenizer's family (teachers.families.tokenizer_family); students saved before
    # the field existed all had WordPiece teachers.
    tokenizer_family: str = WORDPIECE

    def __post_init__(self):
        expected = list(self.labels) if self.decoder == CLASSIFIER else TagVocab(self.labels).tags
        if not self.tags:
            self.tags = expected
        if list(self.tags) != expected:
            raise ConfigError(f"student.json tags {self.tags} are not the labels followed by the markers: {expected}")
        if self.format_version != FORMAT_VERSION:
            raise ConfigError(f"student.json format_version {self.format_version} is not {FORMAT_VERSION}")
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"student.json architecture {self.architecture!r} is not one of {ARCHITECTURES}")
        if self.decoder not in DECODERS:
            raise ConfigError(f"student.json decoder {self.decoder!r} is not one of {DECODERS}")
        if self.max_seq_length < 3:
            raise ConfigError(f"student.json max_seq_length must be at least 3 (CLS, a piece, SEP); "
                              f"got {self.max_seq_length}")
        self.scheme = normalize_scheme(self.scheme)


def read_config(student_dir) -> StudentMeta:
    path = Path(student_dir) / "student.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {student_dir} is not a saved student directory")
    with reading(student_dir, RETRAIN):   # student.json damaged: named in one line
        stored = read_json(path)
    try:
        return StudentMeta(**stored)
    except TypeError as e:
        raise ConfigError(f"{path}: {e}") from None


# The special pieces of a WordPiece vocabulary by the names its family gives them: BERT's, and MPNet's (fairseq's
# <s>, </s>, <pad>, <mask> beside BERT's [UNK]).
WORDPIECE_SPECIALS = ({"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "unk": "[UNK]", "mask": "[MASK]"},
                      {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "unk": "[UNK]", "mask": "<mask>"})


def special_pieces(pieces: Sequence[str], path="the vocabulary") -> Dict[str, str]:
    """{"cls", "sep", "pad", "unk", "mask"} -> piece of the WORDPIECE_SPECIALS convention whose cls, sep, pad and
    unk pieces `pieces` all hold (mask may be absent); of several, the one whose cls comes first: MPNet's vocabulary
    is BERT's with its own <s> <pad> </s> <unk> put before it, and its tokenizer reads those, not the [CLS] and
    [SEP] it still holds at 101-102 (`check_specials` checks the choice against the tokenizer's own). A ConfigError
    naming `path` when none does."""
    index = {piece: i for i, piece in reversed(list(enumerate(pieces)))}
    held = [names for names in WORDPIECE_SPECIALS if all(names[k] in index for k in ("cls", "sep", "pad", "unk"))]
    if held:
        return min(held, key=lambda names: index[names["cls"]])
    held = set(pieces)
    missing = [p for p in ("[UNK]", "[CLS]", "[SEP]", "[PAD]") if p not in held]
    raise ConfigError(f"{path} lacks the special pieces {missing} (or MPNet's <s>, </s>, <pad> and [UNK])")


def read_vocab(path) -> List[str]:
    """WordPiece vocabulary, one piece a line (line number = id), as HF BertTokenizer reads it."""
    pieces = Path(path).read_text(encoding="utf-8").split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    pieces = [p.rstrip("\r") for p in pieces]
    special_pieces(pieces, path)
    return pieces


def check_specials(pieces: Sequence[str], tokenizer_dir) -> None:
    """The special pieces the served tokenizer uses (`special_pieces`) against those the student's tokenizer
    declares (tokenizer_dir/special_tokens_map.json, when there): a ConfigError naming both when they differ, so
    that an export never wraps windows in other markers than the student was trained on."""
    path = Path(tokenizer_dir) / "special_tokens_map.json"
    if not path.is_file():
        return
    declared = {k[: -len("_token")]: v["content"] if isinstance(v, dict) else v
                for k, v in json.loads(path.read_text(encoding="utf-8")).items()
                if k in ("cls_token", "sep_token", "pad_token", "unk_token")}
    chosen = special_pieces(pieces)
    differ = {k: (chosen[k], v) for k, v in declared.items() if chosen[k] != v}
    if differ:
        raise ConfigError(f"{path} declares " + ", ".join(f"{k} {v!r}" for k, (_, v) in differ.items())
                          + " but the vocabulary's markers would be " + ", ".join(f"{c!r}" for c, _ in differ.values())
                          + "; the served tokenizer must use the pieces the student was trained with")


def sentencepiece_model(student_dir, tokenizer) -> Path:
    """The SentencePiece model in student_dir/tokenizer/ that `tokenizer` (a transformers tokenizer, which saves it
    when it was made from one) reads: its vocab_files_names' "vocab_file" (sentencepiece.bpe.model for XLM-R and
    CamemBERT, spiece.model for ALBERT, XLNet and DeBERTa-v2); a ConfigError in one line if it is not there."""
    directory = Path(student_dir) / "tokenizer"
    name = getattr(tokenizer, "vocab_files_names", {}).get("vocab_file")
    if name and (directory / name).is_file():
        return directory / name
    present = sorted(p.name for p in directory.glob("*.model"))
    raise ConfigError(f"{directory} has no {name or 'SentencePiece model'}, the SentencePiece model its "
                      f"{type(tokenizer).__name__} reads (it has {', '.join(present) or 'no .model file'}): save the "
                      "tokenizer with its model (tokenizer.save_pretrained), or export with --format=onnx or "
                      "--format=tflite, whose predict.py reads tokenizer.json")


def check_servable(config: StudentMeta, student_dir, fmt: str = "saved_model") -> None:
    """Refuse, in one line, a student whose pieces an export in `fmt` cannot make from raw text: a SavedModel
    tokenizes in the graph (WordPiece, or SentencePiece Unigram with the teacher's .model file, when the graph gives
    the tokenizer's pieces: export.words.SentencePieces.check, after this check); ONNX and TFLite
    exports tokenize in their predict.py with the `tokenizers` library (any family with a tokenizer.json)."""
    family = config.tokenizer_family
    if family == WORDPIECE:
        return
    python = (f"to tag text in Python, run bin/predict --model={student_dir}, or export it with --format=onnx or "
              "--format=tflite, whose predict.py tokenizes with the tokenizers library (docs/serving.md)")
    if fmt != "saved_model":
        if family in (UNIGRAM, BYTE_LEVEL_BPE) and (Path(student_dir) / "tokenizer" / "tokenizer.json").exists():
            return
        raise ConfigError(f"{student_dir} reads the pieces of a {family} tokenizer without a tokenizer.json in "
                          f"{Path(student_dir) / 'tokenizer'}: --format={fmt} serves WordPiece, SentencePiece Unigram "
                          f"and byte-level BPE students whose tokenizer.json its predict.py reads; run bin/predict "
                          f"--model={student_dir} (docs/serving.md)")
    if family == UNIGRAM:
        # Which .model file the tokenizer reads, and whether the graph gives its pieces, is checked when the
        # tokenizer is read (sentencepiece_model, export.words.SentencePieces.check).
        if not any((Path(student_dir) / "tokenizer").glob("*.model")):
            raise ConfigError(f"{student_dir} reads the pieces of a {family} tokenizer, and its tokenizer/ has no "
                              "SentencePiece .model file (e.g. sentencepiece.bpe.model), which the in-graph "
                              f"SentencePiece tokenizer runs: {python}")
        return
    if family == BYTE_LEVEL_BPE:
        raise ConfigError(f"{student_dir} reads the pieces of a byte-level BPE tokenizer (RoBERTa), and no in-graph "
                          "tokenizer of a tf-keras SavedModel makes them (tensorflow-text has no byte-level BPE; "
                          f"KerasHub's BytePairTokenizer is a Keras 3 layer): {python}")
    raise ConfigError(
        f"{student_dir} reads the pieces of a {family} tokenizer, and bin/export's in-graph tokenizers are WordPiece "
        "and SentencePiece Unigram: to serve with TF Serving, distil from a WordPiece teacher (BERT, DistilBERT, "
        "ELECTRA, or a student with its own WordPiece vocabulary from bin/distil_lm, docs/subwords.md) or an XLM-R "
        f"or CamemBERT one; to tag text in Python, run bin/predict --model={student_dir} (docs/serving.md)")


def student_identity(student_dir) -> str:
    """A SHA-256 over a saved student's student.json and its model's variables (names and bytes): what an export
    records as the student it was made from (export/predictor.exported_student), so that a benchmark can tell an
    export from a student trained since."""
    student_dir = Path(student_dir)
    digest = hashlib.sha256()
    files = [student_dir / "student.json", *sorted((student_dir / "model" / "variables").glob("variables.*"))]
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with reading(path, RETRAIN):
            for block in read_blocks(path):
                digest.update(block)
    return digest.hexdigest()


def load_student_dir(student_dir):
    """(Keras model, StudentMeta, vocab list) of a saved student directory; the vocab is None for a
    student of a tokenizer other than WordPiece (it has no vocab.txt)."""
    student_dir = Path(student_dir)
    config = read_config(student_dir)
    with reading(student_dir, RETRAIN):   # a damaged or missing file named in one line
        vocab = read_vocab(student_dir / "vocab.txt") if config.tokenizer_family == WORDPIECE else None
        if vocab is not None:
            check_specials(vocab, student_dir / "tokenizer")
        model = tf.keras.models.load_model(student_dir / "model", compile=False)
    return model, config, vocab


def served_model(model: tf.keras.Model, config: StudentMeta) -> tf.keras.Model:
    """The part of a trained student that serving runs, as a Keras model on the same layers.

    softmax taggers and classifiers: inputs -> {"probs"}; CRF taggers: inputs -> the emissions the
    `crf` layer reads (its transitions are applied by the caller). Heads used only in training
    (the `logits` regressor, and the `projection` when the heads read the states) drop out,
    because a functional model keeps only the layers between its inputs and outputs.
    """
    if config.decoder == "crf":
        return tf.keras.Model(model.inputs, model.get_layer("crf").input, name=f"{model.name}_emissions")
    return tf.keras.Model(model.inputs, {"probs": model.get_layer("probs").output}, name=f"{model.name}_served")


def clone_replacing(model: tf.keras.Model, replacements: Dict[str, Replacement]) -> tf.keras.Model:
    """A copy of functional `model` in which each layer named in `replacements` is swapped for
    `make(old layer)` and given weights by `copy_weights(old, new)`; other layers keep theirs."""
    def clone(layer):
        if layer.name in replacements:
            return replacements[layer.name][0](layer)
        return layer.__class__.from_config(layer.get_config())

    copy = tf.keras.models.clone_model(model, clone_function=clone)
    for layer in copy.layers:
        old = model.get_layer(layer.name)
        if layer.name in replacements:
            replacements[layer.name][1](old, layer)
        else:
            layer.set_weights(old.get_weights())
    return copy


def block_bilstm(model: tf.keras.Model, unroll: bool = False) -> Dict[str, Replacement]:
    """The replacement of a student's sequence-returning `bilstm` by BlockBiLSTM (TensorFlow's
    fused LSTM kernel, or unrolled where the length is static: students.layers), or none when the
    student has no such layer."""
    names = {layer.name: layer for layer in model.layers}
    layer = names.get("bilstm")
    if not (isinstance(layer, tf.keras.layers.Bidirectional) and layer.forward_layer.return_sequences):
        return {}
    return {"bilstm": (lambda old: BlockBiLSTM(old.forward_layer.units, unroll=unroll, name="bilstm"),
                       lambda old, new: new.set_from_bidirectional(old))}


def write_student_dir(model: tf.keras.Model, student_dir, config: StudentMeta, vocab_file: Optional[str]) -> Path:
    """Writes the layout above (the model, student.json, a copy of `vocab_file`: a WordPiece
    vocab.txt, or None for other tokenizer families); returns the dir."""
    student_dir = Path(student_dir)
    student_dir.mkdir(parents=True, exist_ok=True)
    model.save(student_dir / "model")
    if vocab_file is not None:
        shutil.copyfile(vocab_file, student_dir / "vocab.txt")
    atomic_write_json(student_dir / "student.json", asdict(config))
    return student_dir
