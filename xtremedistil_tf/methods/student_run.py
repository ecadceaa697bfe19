"""Build, distil, evaluate and save a student from a fine-tuned teacher and its cached outputs.

Saved student layout (what `bin/export`, `bin/evaluate` and `load_student` read):
    dir/model/        the Keras model (SavedModel); `tf.keras.models.load_model` after `import xtremedistil_tf`
    dir/student.json  labels, piece tags, scheme, tokenizer casing, max_seq_length, architecture, decoder
                      (`xtremedistil_tf.students.artifact.StudentMeta`)
    dir/tokenizer/    the teacher's tokenizer (`save_pretrained`, any family): the student reads the same pieces
    dir/vocab.txt     its WordPiece vocabulary, for the in-graph tokenizer of the served model (WordPiece
                      teachers only; a SentencePiece student's SavedModel reads tokenizer/'s .model file, and ONNX/TFLite
                      exports of other families the teacher's tokenizer.json: docs/serving.md)
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf.decoding import DEFAULT_DECODE, WordDecoder, check_decode
from xtremedistil_tf.damage import RETRAIN, reading
from xtremedistil_tf.data.alignment import (
    TagVocab,
    Windows,
    decode,
    encode,
    encode_consecutive,
    predict_by_length,
    word_pieces,
)
from xtremedistil_tf.data.scoring import tag_scores
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.engine.distribute import scope_of
from xtremedistil_tf.engine.resume import EpochCheckpoint, stateful_dropout
from xtremedistil_tf.engine.tensorboard import EpochScalars, ScalarLog
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_dir
from xtremedistil_tf.losses import registry
from xtremedistil_tf.losses.xtremedistil import TEACHER_MASK, teacher_mask
from xtremedistil_tf.methods.multigrained import (
    MultiGrainedConfig,
    make_crf_dev_f1,
    predict_tags_crf,
    train_multigrained,
)
from xtremedistil_tf.methods.staged import INPUT_KEYS, DistilConfig, batched, head_probs_fn, make_dev_f1, train_student
from xtremedistil_tf.methods.strategies import get_strategy
from xtremedistil_tf.students import build_bilstm_student, build_transformer_student, svd_reduce
from xtremedistil_tf.students.artifact import StudentMeta, load_student_dir, write_student_dir
from xtremedistil_tf.students.crf_student import (
    build_bilstm_crf_student,
    build_transformer_crf_student,
    student_crf_constraints,
)
from xtremedistil_tf.students.models import ARCHITECTURES, CASE_INPUT, EMBEDDINGS, StudentArch, reads_case
from xtremedistil_tf.teachers.families import servable_in_graph, tokenizer_family
from xtremedistil_tf.teachers.model import load_tokenizer
from xtremedistil_tf.transfer.cache import load_manifest, padding_values, read_sharded, subset

log = logging.getLogger(__name__)

StudentConfig = Union[DistilConfig, MultiGrainedConfig]   # a student of either method


def student_embeddings(arch: StudentArch, teacher_matrix: np.ndarray):
    """(initial matrix or None, frozen) for the chosen embedding initialisation."""
    if arch.embeddings == "random":
        return None, False
    if arch.embeddings == "svd":
        return svd_reduce(teacher_matrix, arch.embedding_dim), False
    if arch.embeddings == "teacher":
        return teacher_matrix, True
    raise ConfigError(f"--student_embeddings={arch.embeddings!r}; expected one of {', '.join(EMBEDDINGS)}")


def build_student(cfg: StudentConfig, teacher, scheme: str) -> tf.keras.Model:
    """A student for `teacher`'s pieces and tags: heads for XtremeDistil (representation sized to
    the teacher), or a CRF under the scheme's constraints for multi-grained distillation."""
    arch, matrix = cfg.arch, teacher.word_embeddings()
    embeddings, frozen = student_embeddings(arch, matrix)
    common = dict(vocab_size=matrix.shape[0], num_tags=len(teacher.tag_vocab), dropout=arch.dropout,
                  embedding_dim=matrix.shape[1] if arch.embeddings == "teacher" else arch.embedding_dim,
                  embeddings=embeddings, freeze_embeddings=frozen)
    transformer = dict(depth=arch.depth, heads=arch.heads, ffn=arch.ffn, max_length=teacher.max_seq_length)
    if arch.architecture not in ARCHITECTURES:
        raise ConfigError(f"--student_architecture={arch.architecture!r}; expected one of {', '.join(ARCHITECTURES)}")
    if arch.case_dim and (arch.architecture != "bilstm" or cfg.method != "xtremedistil"):
        raise ConfigError(f"--student_case_dim={arch.case_dim}: word shapes are read by XtremeDistil BiLSTM taggers "
                          f"(--student_architecture=bilstm --method=xtremedistil); this student is a {arch.architecture} "
                          f"of --method={cfg.method}")
    if cfg.method == "multigrained":
        common["constraints"] = student_crf_constraints(teacher.tag_vocab, scheme)
        if arch.architecture == "bilstm":
            return build_bilstm_crf_student(hidden=arch.hidden, **common)
        return build_transformer_crf_student(**transformer, **common)
    common.update(teacher_hidden=teacher.hidden_size, heads_on=cfg.heads_on)
    if arch.architecture == "bilstm":
        return build_bilstm_student(hidden=arch.hidden, case_dim=arch.case_dim, **common)
    return build_transformer_student(**transformer, **common)


def distil_config(cfg: DistilConfig, tag_vocab: TagVocab, progress: bool = False) -> DistilConfig:
    """`cfg` as the staged loop runs it: CE skips the tag vocabulary's [PAD]; `progress`, a bar
    over each epoch's batches (the epoch lines are logged either way)."""
    return replace(cfg, pad_id=tag_vocab.pad_id, verbose=1 if progress else 0)


def source_keys(strategy: str, source: str) -> Tuple[str, ...]:
    """The features the strategy's losses on `source` ("train" or "transfer") read: the inputs,
    `label_ids` (the staged loop tells sentence-level data by its rank) and the losses' targets."""
    keys = [*INPUT_KEYS, "label_ids"]
    for stage in get_strategy(strategy).stages:
        for term in stage.terms:
            target, = registry.get(term.loss).target
            if term.source == source and target not in keys:
                keys.append(target)
    return tuple(keys)


def with_teacher_mask(cache_dir, keys: Sequence[str]) -> Tuple[str, ...]:
    """`keys`, plus the cache's `teacher_mask` when it has one (a first-piece teacher) and the keys
    read the teacher's logits: the positions those logits count at go with them."""
    keys = tuple(keys)
    if "logits" in keys and TEACHER_MASK not in keys and TEACHER_MASK in load_manifest(cache_dir)["features"]:
        return (*keys, TEACHER_MASK)
    return keys


def with_case_ids(examples: tf.data.Dataset, windows: Windows, where) -> tf.data.Dataset:
    """Cached examples, each with the word shapes of its pieces ("case_ids", from `windows`: the windows the cache
    at `where` was written from, in its order). A window whose pieces are not the example's stops the run."""
    cached = load_manifest(where)["num_examples"]
    if cached != len(windows):
        raise ConfigError(f"the teacher-output cache in {where} holds {cached} examples where its text gives "
                          f"{len(windows)} windows: it was written from other text (bin/train --overwrite)")
    lengths = windows.attention_mask.sum(1)
    real = windows.attention_mask.astype(bool)
    rows = {key: tf.RaggedTensor.from_row_lengths(values[real], lengths)
            for key, values in (("input_ids", windows.input_ids), (CASE_INPUT, windows.case_ids))}

    def add(example, row):
        same = tf.debugging.assert_equal(example["input_ids"], row["input_ids"], message=(
            f"the teacher-output cache in {where} is not of the text its word shapes were read from"))
        with tf.control_dependencies([same]):
            return {**example, CASE_INPUT: tf.identity(row[CASE_INPUT])}

    return tf.data.Dataset.zip((examples, tf.data.Dataset.from_tensor_slices(rows))).map(add)


class WordDropout:
    """DistilConfig.word_dropout over a tokenizer's pieces: `apply(batches, seed)` replaces whole words of each
    batch's `input_ids` by the unknown piece, each word with probability `rate`, where the words are a piece that
    starts one and the pieces that continue it (WordPiece's "##" pieces; for BPE and SentencePiece vocabularies the
    pieces without a leading "Ġ" or "▁"); special pieces and padding are never replaced. The draws are a function
    of the epoch's seed and the batch's place in the epoch (exact resume); the teacher's targets and a word's shape
    (case_ids) stay, so the student learns to tag a word it cannot read from its context and shape."""

    def __init__(self, tokenizer, rate: float):
        vocab = tokenizer.get_vocab()
        wordpiece = any(piece.startswith("##") for piece in vocab)
        starts = np.ones(max(vocab.values()) + 1, bool)
        for piece, index in vocab.items():
            starts[index] = not piece.startswith("##") if wordpiece else piece.startswith(("Ġ", "▁"))
        special = sorted(set(tokenizer.all_special_ids))
        starts[special] = True
        self.rate, self.unk = float(rate), int(tokenizer.unk_token_id)
        self.starts, self.special = tf.constant(starts), tf.constant(special, tf.int32)

    def apply(self, batches: tf.data.Dataset, seed: int) -> tf.data.Dataset:
        def drop(index, batch):
            ids = tf.cast(batch["input_ids"], tf.int32)
            # Each piece's word: the number of word starts up to it; a word's draw is the one at its own number.
            word = tf.maximum(tf.cumsum(tf.cast(tf.gather(self.starts, ids), tf.int32), axis=1) - 1, 0)
            draws = tf.random.stateless_uniform(tf.shape(ids), seed=tf.stack([tf.cast(seed, tf.int64), index]))
            dropped = ((tf.gather(draws, word, batch_dims=1) < self.rate) & (batch["attention_mask"] > 0)
                       & ~tf.reduce_any(ids[..., None] == self.special, axis=-1))
            return {**batch, "input_ids": tf.cast(tf.where(dropped, self.unk, ids), batch["input_ids"].dtype)}

        return batches.enumerate().map(drop)


def staged_sources(cfg: DistilConfig, transfer_dir, dev_cache_dir, train_examples: int,
                   shuffle_buffer: Optional[int] = None, pad_id: Optional[int] = None,
                   transfer_keep: Optional[np.ndarray] = None, case_windows: Optional[Tuple[Windows, Windows]] = None,
                   word_dropout: Optional[WordDropout] = None):
    """The staged loop's data from the caches: (labeled train, transfer) as per-epoch sources for
    `train_student`, functions `seed -> batches` whose shuffle order is fixed by the epoch's seed
    (exact resume, engine/resume.py), and dev batches. The labeled examples are the first
    `train_examples` of the transfer cache. With none (`train_examples` 0, a teacher used as it
    is) the "train" source is the transfer set labeled with the teacher's own argmax
    (`teacher_labeled`; `pad_id` is the label of padding pieces). `transfer_keep` (one bool per
    cached example, pipeline.transfer_subset) limits the transfer source, and a teacher-labeled
    train source, to those examples.

    Memory (docs/benchmarks.md, "Peak memory of student training"): the shuffle buffers are what
    the input pipeline holds. Each set reads only the features its losses use, so the labeled set,
    shuffled whole, holds ids, mask and tags (3 x T int32 per window, never the hidden states; D4.2-KD's soft
    targets add the teacher's logits, T x N float32, and its teacher_mask); the
    transfer set goes through a buffer of `shuffle_buffer` windows (default min(50,000, 10 x batch
    size)) whatever its size: at most that many windows x (ids, mask, tags, logits, float32 hidden).
    `case_windows` (the windows the transfer and dev caches were written from) gives every example its
    "case_ids" (`with_case_ids`), for a student that reads word shapes. `word_dropout` (cfg.word_dropout's
    `WordDropout`) applies to every epoch's train and transfer batches."""
    shuffle_buffer = min(50_000, 10 * cfg.batch_size) if shuffle_buffer is None else shuffle_buffer
    if shuffle_buffer < 1:
        raise ConfigError(f"shuffle_buffer must be >= 1 window, got {shuffle_buffer}")
    def limited(ds: tf.data.Dataset) -> tf.data.Dataset:
        return ds if transfer_keep is None else subset(ds, transfer_keep)

    shapes_of = {} if case_windows is None else dict(zip((transfer_dir, dev_cache_dir), case_windows))

    def read(where, keys=None) -> tf.data.Dataset:
        examples = read_sharded(where, keys=keys)
        return with_case_ids(examples, shapes_of[where], where) if where in shapes_of else examples

    train_keys = with_teacher_mask(transfer_dir, source_keys(cfg.strategy, "train"))
    check_cached(transfer_dir, source_keys(cfg.strategy, "transfer"), cfg.strategy)
    if train_examples:
        train, train_buffer = read(transfer_dir, keys=train_keys).take(train_examples), train_examples
    else:
        log.info("no labeled train examples: the label (CE) losses learn the teacher's argmax over the transfer set")
        train = teacher_labeled(limited(read(transfer_dir, keys=with_teacher_mask(
            transfer_dir, (*train_keys, "logits")))), pad_id, train_keys)
        train_buffer = shuffle_buffer
    transfer = limited(read(transfer_dir, keys=with_teacher_mask(transfer_dir, source_keys(cfg.strategy, "transfer"))))

    padding = padding_values(transfer_dir)

    def epoch(ds: tf.data.Dataset, buffer: int, seed: int) -> tf.data.Dataset:
        batches = batched(ds, cfg.batch_size, shuffle_buffer=buffer, seed=seed, reshuffle=False, padding=padding,
                          group=cfg.group_by_length)
        return batches if word_dropout is None else word_dropout.apply(batches, seed)

    def train_for(seed: int) -> tf.data.Dataset:
        return epoch(train, train_buffer, seed)

    def transfer_for(seed: int) -> tf.data.Dataset:
        return epoch(transfer, shuffle_buffer, seed)

    check_cached(dev_cache_dir, [t for s in get_strategy(cfg.strategy).stages for t in _stage_targets(s)],
                 cfg.strategy)
    dev = read(dev_cache_dir)
    if not train_examples:
        # The label losses learn the teacher's argmax where it was trained: dev's CE counts the same pieces.
        dev = dev.map(lambda e: {**e, "label_ids": tf.where(teacher_mask(e, e["attention_mask"]) > 0, e["label_ids"],
                                                            pad_id)})
    return train_for, transfer_for, batched(dev, cfg.batch_size, padding=padding_values(dev_cache_dir))


def _stage_targets(stage) -> List[str]:
    """The cached targets a stage's losses read (each stage is selected by them on dev)."""
    return [key for term in stage.terms for key in registry.get(term.loss).target]


def check_cached(cache_dir, keys: Sequence[str], strategy: str) -> None:
    """ConfigError in one line if the cache was written without a key the strategy's losses read (a
    cache made for a student that reads no hidden states leaves them out)."""
    features = load_manifest(cache_dir)["features"]
    missing = sorted({k for k in keys if k not in features and k != "label_ids"})
    if missing:
        raise ConfigError(f"the teacher-output cache in {cache_dir} was written without {missing} (for a student "
                          f"that reads none); strategy {strategy} reads them: regenerate it (bin/train --overwrite, "
                          "or a new --work_dir)")


def teacher_labeled(examples: tf.data.Dataset, pad_id: int, keys: Sequence[str]) -> tf.data.Dataset:
    """Cached examples with `label_ids` replaced by the argmax of the teacher's cached `logits`
    (per piece [T, N], padding pieces and those a first-piece teacher was not trained on get
    `pad_id`; or per text [C]), then only `keys` kept."""
    if pad_id is None:
        raise ConfigError("labeling the transfer set with the teacher's argmax needs the tag vocabulary's pad id")

    def relabel(example):
        tags = tf.argmax(example["logits"], axis=-1, output_type=tf.int32)
        if example["logits"].shape.rank > 1:
            tags = tf.where(teacher_mask(example, example["attention_mask"]) > 0, tags, pad_id)
        kept = {k: tags if k == "label_ids" else example[k] for k in keys}
        return {**kept, CASE_INPUT: example[CASE_INPUT]} if CASE_INPUT in example else kept

    return examples.map(relabel)


def build_resumable(build, *args, **kwargs) -> tf.keras.Model:
    """`build(*args, **kwargs)` with dropout that each epoch can reseed (engine/resume.py)."""
    with stateful_dropout():
        return build(*args, **kwargs)


def distil_staged(cfg: DistilConfig, build, evaluate_fn, tag_vocab, transfer_dir, dev_cache_dir, train_examples: int,
                  progress: bool = False, log_dir=None, checkpoint_dir=None, distribution=None,
                  transfer_keep: Optional[np.ndarray] = None, shared_stages=None, case_windows=None,
                  tokenizer=None):
    """A new student, `build()` under the run's seed, distilled with the configured strategy by
    the staged loop from the caches (`staged_sources`); returns (student, history). Taggers
    (`distil`) and classifiers (methods/classification.py) differ only in `build` and
    `evaluate_fn` (dev F1 of a head). `transfer_keep`, `case_windows`: staged_sources's; `shared_stages`:
    train_student's `shared`; `log_dir`: TensorBoard scalars of every epoch; `tokenizer`: the teacher's, whose pieces
    cfg.word_dropout drops (`WordDropout`)."""
    tf.keras.utils.set_random_seed(cfg.seed)
    with scope_of(distribution):
        student = build_resumable(build)
    train_ds, transfer_ds, dev_ds = staged_sources(cfg, transfer_dir, dev_cache_dir, train_examples,
                                                   pad_id=tag_vocab.pad_id, transfer_keep=transfer_keep,
                                                   case_windows=case_windows if reads_case(student) else None,
                                                   word_dropout=WordDropout(tokenizer, cfg.word_dropout)
                                                   if cfg.word_dropout else None)
    history = train_student(cfg.strategy, student, train_ds, transfer_ds, dev_ds,
                            distil_config(cfg, tag_vocab, progress), evaluate_fn=evaluate_fn,
                            callbacks=[EpochScalars(ScalarLog(log_dir))],
                            checkpoint=EpochCheckpoint(checkpoint_dir), distribution=distribution,
                            shared=shared_stages)
    return student, history


def distil(cfg: DistilConfig, teacher, tokenizer, transfer_dir, dev_cache_dir, train_windows: int,
           dev: Sequence[Sentence], scheme: str, progress: bool = False, log_dir=None,
           transfer_text: Sequence[Sentence] = (), **run):
    """Distil a new tagging student with the configured strategy; returns (student, history).

    The labeled train windows are the first `train_windows` examples of the transfer cache (the
    pipeline caches train before any unlabeled text); the dev cache carries teacher outputs so
    every step can be selected by its stage's loss on dev; steps with a tagger record their dev
    entity F1. A student that reads word shapes (`--student_case_dim`) reads them from the cased words of
    `transfer_text` (the sentences the transfer cache was written from, in order) and `dev`.
    `run`: distil_staged's checkpoint_dir, distribution, transfer_keep, shared_stages.
    """
    dev_windows = served_windows(dev, tokenizer, teacher.tag_vocab, teacher.max_seq_length,
                                 cfg.arch.architecture != "transformer")
    evaluate_fn = make_dev_f1(dev_windows, [s.tags for s in dev], teacher.tag_vocab, scheme)
    if cfg.arch.case_dim:
        run["case_windows"] = tuple(encode(sentences, tokenizer, teacher.tag_vocab, teacher.max_seq_length)
                                    for sentences in (transfer_text, dev))
    return distil_staged(cfg, lambda: build_student(cfg, teacher, scheme), evaluate_fn, teacher.tag_vocab,
                         transfer_dir, dev_cache_dir, train_windows, progress, log_dir, tokenizer=tokenizer, **run)


def distil_multigrained(cfg: MultiGrainedConfig, teacher, tokenizer, transfer_dir, train_windows: int,
                        dev: Sequence[Sentence], scheme: str, progress: bool = False, log_dir=None,
                        checkpoint_dir=None, distribution=None):
    """Multi-grained KD of a CRF student from the cached k-best surrogates; returns (student, history).

    The stream is the transfer cache: its first `train_windows` examples are labeled (gold tags for
    L_hard); the rest are unlabeled sentences (the teacher's top-1 for L_hard), used when
    `use_unlabeled` (DA). Epochs are selected by Viterbi entity F1 on dev.
    """
    tf.keras.utils.set_random_seed(cfg.seed)
    with scope_of(distribution):
        student = build_resumable(build_student, cfg, teacher, scheme)
    transfer = read_sharded(transfer_dir)
    stream = transfer if cfg.use_unlabeled else transfer.take(train_windows)
    config = replace(cfg, progress=progress, log_dir=str(log_dir) if log_dir else None)
    dev_windows = served_windows(dev, tokenizer, teacher.tag_vocab, teacher.max_seq_length, True)   # BiLSTM+CRF
    evaluate_fn = make_crf_dev_f1(dev_windows, [s.tags for s in dev], teacher.tag_vocab, scheme)
    history = train_multigrained(student, stream, None, config, teacher.tag_vocab.pad_id, evaluate_fn,
                                 checkpoint=EpochCheckpoint(checkpoint_dir), distribution=distribution)
    return student, history


def served_windows(sentences: Sequence[Sentence], tokenizer, tag_vocab: TagVocab, max_seq_length: int,
                   recurrent: bool):
    """The windows a student is scored on, as its export serves text (export/serving.py): a recurrent (BiLSTM)
    student's export runs each text whole, however long, so it is scored on one window per sentence; a
    transformer's export cuts consecutive windows of `max_seq_length - 2` pieces, even inside a word, and so is it
    scored (`alignment.encode_consecutive`)."""
    if not recurrent:
        return encode_consecutive(sentences, tokenizer, tag_vocab, max_seq_length)
    longest = max((sum(map(len, pieces)) for pieces in word_pieces(tokenizer, sentences)), default=1)
    return encode(sentences, tokenizer, tag_vocab, max(max_seq_length, longest + 2))


def predict_words(student, tokenizer, tag_vocab: TagVocab, max_seq_length: int, sentences: Sequence[Sentence],
                  scheme: str, decoder: str = "softmax", decode_as: str = DEFAULT_DECODE) -> List[List[str]]:
    """Each sentence's word tags from a student, decoded as serving decodes them: softmax students by
    crf.decoding.WordDecoder (`decode_as`: "constrained", the best sequence the tag scheme allows, or
    "argmax"), CRF students by the CRF's Viterbi (only "constrained"); on the windows its export runs
    (`served_windows`)."""
    recurrent = any(layer.name == "bilstm" for layer in student.layers)
    windows = served_windows(sentences, tokenizer, tag_vocab, max_seq_length, recurrent)
    if decoder == "crf":
        if check_decode(decode_as) != "constrained":
            raise ConfigError(f"--decode={decode_as}: a CRF student decodes with its CRF's Viterbi; --decode=argmax "
                              "is for softmax students")
        return decode(windows, predict_tags_crf(student, windows), tag_vocab)
    probs = predict_by_length(windows, head_probs_fn(student), case=reads_case(student))
    return WordDecoder(tag_vocab.tags, tag_vocab.labels, scheme, decode_as).decode_windows(windows, probs)[0]


def evaluate_student(student, tokenizer, tag_vocab: TagVocab, max_seq_length: int,
                     sentences: Sequence[Sentence], scheme: str, decoder: str = "softmax",
                     decode_as: str = DEFAULT_DECODE, seen=None) -> Dict:
    """Entity scores of a student's word predictions (`predict_words`: decoded as serving decodes them); `seen`
    (scoring.train_entities): also on seen and unseen names (scoring.tag_scores)."""
    predicted = predict_words(student, tokenizer, tag_vocab, max_seq_length, sentences, scheme, decoder, decode_as)
    return tag_scores(sentences, predicted, scheme, seen)


def lowercases(tokenizer) -> bool:
    """Whether the tokenizer lower-cases its input (asked of the tokenizer, not its config)."""
    return tokenizer.tokenize("A") == tokenizer.tokenize("a")


def save_student(directory, student: tf.keras.Model, architecture: str, tokenizer, tag_vocab: TagVocab,
                 scheme: str, max_seq_length: int, decoder: str = "softmax") -> None:
    """Write the layout above atomically (students/artifact.py defines student.json)."""
    with atomic_dir(directory) as tmp:
        tokenizer.save_pretrained(str(tmp / "tokenizer"))
        family = tokenizer_family(tokenizer)
        # save_vocabulary writes a WordPiece tokenizer's vocab.txt (a BPE one's vocab.json and merges.txt).
        vocab = tokenizer.save_vocabulary(str(tmp / "tokenizer"))[0] if servable_in_graph(tokenizer) else None
        meta = StudentMeta(labels=tag_vocab.labels, scheme=scheme, lower_case=lowercases(tokenizer),
                           max_seq_length=max_seq_length, architecture=architecture, decoder=decoder,
                           tokenizer_family=family)
        write_student_dir(student, tmp, meta, vocab)


def load_student(directory):
    """(Keras model, StudentMeta, tokenizer) of a student written by `save_student`."""
    with reading(directory, RETRAIN):   # a damaged or missing file named in one line
        model, meta, _ = load_student_dir(directory)
        return model, meta, load_tokenizer(str(Path(directory) / "tokenizer"))
