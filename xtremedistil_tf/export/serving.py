"""A TF Serving SavedModel of a student: raw strings in, word tags and entity spans out.

Everything runs in the graph: invalid UTF-8 replaced as Python's bytes.decode("utf-8",
errors="replace") does, the training tokenizer's word split with byte offsets and the pieces of each word
(export.words: WordPieces, or SentencePieces for XLM-R/CamemBERT teachers), windows of pieces with [CLS]/[SEP], the student, the word's
tag read at its first piece (as in data/alignment.py): for softmax students the best sequence of
word labels the tag scheme allows, or the argmax (crf/decoding.py, `decode`), for CRF students
the CRF's Viterbi over the pieces; lenient span decoding (as schemes.tags_to_spans) and byte ->
character offsets. docs/serving.md describes the signatures and the offset unit.

Shapes: B texts, P pieces (all texts together), W words (all texts), S spans (all texts),
C windows, L window length, N tags. Ragged per-text results are padded to dense at the end.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf import ops as crf_ops
from xtremedistil_tf.data.alignment import PAD_TAG
from xtremedistil_tf.data.schemes import split_tag
from xtremedistil_tf.data.shapes import PAD as PAD_SHAPE
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.crf.decoding import DEFAULT_DECODE, WordDecoder, check_decode
from xtremedistil_tf.export.bfloat16 import check_cpu, in_bfloat16
from xtremedistil_tf.students.artifact import (CLASSIFIER, StudentMeta, block_bilstm, clone_replacing, check_servable,
                                            load_student_dir, read_config, sentencepiece_model, served_model,
                                            student_identity)
from xtremedistil_tf.export.vocabulary import corpus_texts, kept_piece_ids, piece_counts, pruned_embedding
from xtremedistil_tf.export.words import SentencePieces, WordPieces, WordSplit, row_ids
from xtremedistil_tf.students.models import CASE_INPUT, reads_case
from xtremedistil_tf.teachers.families import UNIGRAM, WORDPIECE
from xtremedistil_tf.teachers.model import load_tokenizer
from xtremedistil_tf.io import atomic_dir, atomic_write_json, read_json

# Prefix codes of a word's tag for span decoding; I- and M- (BMES) are the same "inside".
OUTSIDE, BEGIN, INSIDE, END, SINGLE = 0, 1, 2, 3, 4
_PREFIX_CODES = {"O": OUTSIDE, "B": BEGIN, "I": INSIDE, "M": INSIDE, "E": END, "S": SINGLE}
# Row keys for searching offsets of all texts in one sorted vector: row * 2^32 + byte.
_ROW_STRIDE = 2 ** 32

# assets.extra/ of a SavedModel export: how it decodes (bin/evaluate reads it).
EXPORT_META = "export.json"
# export.json's record of the student an export was made from (`student_identity`).
STUDENT_IDENTITY = "student_sha256"

# --xla_lengths: batches of fewer windows than this run on the fused kernel.
XLA_MIN_WINDOWS = 2

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
IDS_SPECS = (tf.TensorSpec([None, None], tf.int32, name="input_ids"),
             tf.TensorSpec([None, None], tf.int32, name="attention_mask"))
# The `ids` signature of a student that reads word shapes (students.models.reads_case) takes them third.
CASE_SPEC = tf.TensorSpec([None, None], tf.int32, name=CASE_INPUT)


def tag_tables(config: StudentMeta):
    """Per tag id: its word label, prefix code and entity-type id (-1 for O), and the type names.

    Markers (X, [CLS], [SEP], [PAD]) predicted at a word's first piece read as "O", like
    TagVocab.word_label.
    """
    words, prefixes, type_ids, types = [], [], [], []
    for index, tag in enumerate(config.tags):
        label = tag if index < len(config.labels) else "O"
        prefix, etype = split_tag(label, config.scheme)
        if etype is not None and etype not in types:
            types.append(etype)
        words.append(label)
        prefixes.append(_PREFIX_CODES[prefix])
        type_ids.append(types.index(etype) if etype is not None else -1)
    return words, prefixes, type_ids, types


def windows_of(pieces: tf.RaggedTensor, budget, cls_id: int, sep_id: int, pad_id: int):
    """Cuts each text's pieces [B, (P)] into consecutive windows of at most `budget` pieces
    (None: one window per text), each wrapped in [CLS] ... [SEP]; an empty text gets one window.

    Returns (input_ids [C, L] int32, attention_mask [C, L] int32, lengths [C] int64: pieces per
    window without CLS/SEP, at [P, 2] int64: the (window, column) of each piece in input_ids).
    Windows list the pieces in their original order.
    """
    rows = row_ids(pieces)
    position = tf.range(tf.size(rows, out_type=tf.int64)) - tf.gather(pieces.row_splits, rows)
    if budget is None:
        window_of_piece, column, num_windows = rows, position, pieces.nrows()
    else:
        per_text = tf.maximum(tf.math.floordiv(pieces.row_lengths() + budget - 1, budget), 1)
        first_window = tf.cumsum(per_text, exclusive=True)
        window_of_piece = tf.gather(first_window, rows) + position // budget
        column, num_windows = position % budget, tf.reduce_sum(per_text)
    lengths = tf.math.unsorted_segment_sum(tf.ones_like(window_of_piece), window_of_piece, num_windows)
    # One scatter of pieces and markers into a [PAD] tensor: at batch 1 each op's dispatch counts,
    # and a ragged concat and to_tensor take dozens.
    width = _max(lengths + 2)
    at = tf.stack([window_of_piece, column + 1], axis=1)
    windows = tf.range(num_windows)
    markers = tf.concat([tf.stack([windows, tf.zeros_like(windows)], axis=1), tf.stack([windows, lengths + 1], axis=1)],
                        axis=0)
    ids = tf.concat([pieces.flat_values, tf.fill([num_windows], tf.constant(cls_id, tf.int32)),
                     tf.fill([num_windows], tf.constant(sep_id, tf.int32))], axis=0)
    input_ids = tf.tensor_scatter_nd_update(tf.fill(tf.stack([num_windows, width]), tf.constant(pad_id, tf.int32)),
                                            tf.concat([at, markers], axis=0), ids)
    attention_mask = tf.sequence_mask(lengths + 2, width, dtype=tf.int32)
    return input_ids, attention_mask, lengths, at


def byte_to_char(text, rows, offsets):
    """Character (Unicode code point) offsets of byte `offsets` [K] into text[rows] [K].

    A byte offset maps to the number of characters that start before it, so an exclusive
    end byte maps to an exclusive end character. `text` is valid UTF-8 (valid_utf8).
    """
    _, char_starts = tf.strings.unicode_decode_with_offsets(text, "UTF-8", errors="replace")
    keys = row_ids(char_starts) * _ROW_STRIDE + char_starts.flat_values
    queries = tf.cast(rows, tf.int64) * _ROW_STRIDE + tf.cast(offsets, tf.int64)
    index = tf.searchsorted(keys[None], queries[None], side="left", out_type=tf.int64)[0]
    return tf.cast(index - tf.gather(char_starts.row_splits, rows), tf.int32)


def valid_utf8(text):
    """Texts [B] with each maximal invalid UTF-8 subsequence replaced by U+FFFD, as Python's
    bytes.decode("utf-8", errors="replace") does: the text the served offsets index."""
    return tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD,
                                        replace_control_characters=False)


def decode_spans(prefix, type_id, word_position):
    """Lenient span decoding of flat word tags (schemes.tags_to_spans, vectorised).

    prefix, type_id, word_position: [W]. A word continues the entity before it
    when it is inside/end (I, M, E), the previous word in the same text is begin/inside of
    the same type; any other non-O word starts a span. Returns (first word [S], last word
    [S]) as flat word indices.
    """
    # Each word's predecessor in the flat list (word 0 keeps its own: word_position > 0 rules it out).
    # A slice and a concat: tf.roll took ~60 us a call at batch 1 (its kernel shards over the thread pool).
    previous_prefix = tf.concat([prefix[:1], prefix[:-1]], axis=0)
    previous_type = tf.concat([type_id[:1], type_id[:-1]], axis=0)
    continues = ((word_position > 0)
                 & ((prefix == INSIDE) | (prefix == END))
                 & ((previous_prefix == BEGIN) | (previous_prefix == INSIDE))
                 & (previous_type == type_id))
    in_entity = prefix != OUTSIDE
    starts = in_entity & ~continues
    span_of_word = tf.cumsum(tf.cast(starts, tf.int32)) - 1
    index = tf.range(tf.size(prefix))
    first = tf.boolean_mask(index, starts)
    last = tf.math.unsorted_segment_max(tf.boolean_mask(index, in_entity), tf.boolean_mask(span_of_word, in_entity),
                                        tf.size(first))
    return first, last, span_of_word, in_entity


def _max(counts):
    """max(counts) int64, 0 when there are none."""
    return tf.reduce_max(tf.concat([tf.zeros([1], tf.int64), tf.cast(counts, tf.int64)], axis=0))


def _positions(rows, counts):
    """[K] int64: the position of each flat value in its text, from its sorted text `rows` [K] and `counts` [B]
    int64 per text."""
    return tf.range(tf.size(rows, out_type=tf.int64)) - tf.gather(tf.cumsum(counts, exclusive=True), rows)


def dense_index(rows, position, counts):
    """[len(counts), max(counts)] int64: where flat per-text values [K] (text `rows` [K], `position` [K]
    in it; `counts` [B] per text) go when padded to dense, K at the padding (see `padded`)."""
    size = tf.size(rows, out_type=tf.int64)
    return tf.tensor_scatter_nd_update(tf.fill(tf.stack([tf.size(counts, out_type=tf.int64), _max(counts)]), size),
                                       tf.stack([tf.cast(rows, tf.int64), position], axis=1), tf.range(size))


def padded(values, index, default):
    """Flat values [K] padded to dense along `dense_index`'s index, `default` at the padding."""
    return tf.gather(tf.concat([values, tf.fill([1], tf.constant(default, values.dtype))], axis=0), index)


class _Untracked:
    """Holds Keras models out of the SavedModel object graph.

    tf.saved_model.save would otherwise serialise them the Keras way, tracing every layer's
    call (minutes on 2 cores); the serving graph needs only their variables, tracked below.
    """

    def __init__(self, **models):
        self.__dict__.update(models)


class NerServing(tf.Module):
    """The student plus its tokenizer and decoding, with `serve` (strings) and `ids` (pieces)."""

    def __init__(self, model: tf.keras.Model, config: StudentMeta, vocab: Optional[List[str]],
                 keep_ids: Optional[np.ndarray] = None, xla_lengths: Sequence[int] = (), unroll: bool = False,
                 bfloat16: bool = False, decode: str = DEFAULT_DECODE, tokenizer: Optional[WordSplit] = None):
        """`vocab`: the WordPiece vocabulary of the in-graph tokenizer; `tokenizer`: instead, the in-graph tokenizer
        of another family (export.words.SentencePieces). With neither, a module whose only entry is `ids` (or
        `decode_windows`), as the Python tagger of a student of another tokenizer family uses (export.predictor)
        and the ONNX/TFLite exports of one, and which `export_student` never saves.
        `keep_ids`: serve only these pieces of `vocab` (export.vocabulary.kept_piece_ids).
        `xla_lengths`: window lengths (in pieces, with [CLS]/[SEP]) at which a BiLSTM student runs
        unrolled under XLA; a batch of windows goes to the shortest one that holds it (padded),
        longer ones and single windows to the fused kernel. TF Serving runs the XLA graphs only with
        --xla_cpu_compilation_enabled=true (docs/serving.md). `unroll`: the BiLSTM is unrolled
        wherever the window length is static (BlockBiLSTM(unroll=True); export.formats traces TFLite
        graphs at fixed lengths with it), also without `xla_lengths`. `bfloat16`: the served model's
        weights and computation in bfloat16 (export.bfloat16.in_bfloat16; bin/export
        --quantize=bfloat16); the signatures' outputs stay float32. `decode`: how a softmax student's
        word tags are read (crf/decoding.py: "constrained" or "argmax"); CRF students decode with their
        CRF's Viterbi, so only "constrained" is accepted for them."""
        super().__init__(name="ner_serving")
        if config.decoder == CLASSIFIER:
            raise ConfigError("this student is a sentence classifier; bin/export serves taggers only. Load it "
                              "with tf.keras.models.load_model(<student_dir>/model) after import xtremedistil_tf")
        if any(int(n) < 2 for n in xla_lengths):
            raise ConfigError(f"--xla_lengths must be window lengths >= 2 ([CLS] and [SEP]); got {list(xla_lengths)}")
        check_decode(decode)
        if config.decoder == "crf" and decode != "constrained":
            raise ConfigError(f"--decode={decode}: a CRF student decodes with its CRF's Viterbi; --decode=argmax "
                              "is for softmax students")
        self.decode = decode
        # Softmax students: word labels from the first pieces' probabilities (crf/decoding.py).
        self.word_decoder = None if config.decoder == "crf" else WordDecoder(config.tags, config.labels,
                                                                              config.scheme, decode)
        served = served_model(model, config)
        replacements = block_bilstm(served, unroll=bool(xla_lengths) or unroll)
        if xla_lengths and not replacements:
            raise ConfigError(f"--xla_lengths serves BiLSTM students unrolled; this student is a "
                              f"{config.architecture}")
        if keep_ids is not None:
            replacements.update(pruned_embedding(keep_ids))
            vocab = [vocab[i] for i in keep_ids]
        if replacements:
            served = clone_replacing(served, replacements)
        if bfloat16:
            served = in_bfloat16(served)
        self.vocab = vocab
        # Whether the student reads each piece's word shape (data/shapes.py) beside it.
        self.case = reads_case(served)
        self.ids = tf.function(self._ids, input_signature=(*IDS_SPECS, CASE_SPEC) if self.case else IDS_SPECS)
        self._keras = _Untracked(model=served)
        self._xla_lengths = sorted({int(n) for n in xla_lengths})
        self._keras.fixed = [self._fixed_length_fn(n) for n in self._xla_lengths]
        # Only what serving runs is saved: training-only heads stay out of the SavedModel.
        self.student_variables = list(served.variables)
        if config.decoder == "crf":
            self._keras.crf = model.get_layer("crf")
            self.student_variables += list(self._keras.crf.variables)
        self.config = config
        self._pad_tag = config.tags.index(PAD_TAG)
        # Transformer students have position embeddings for max_seq_length; BiLSTMs take any length.
        self._budget = config.max_seq_length - 2 if config.architecture == "transformer" else None
        if vocab is not None:
            tokenizer = WordPieces(vocab, config.lower_case)
        if tokenizer is not None:
            self.tokenizer = tokenizer
            self._cls, self._sep, self._pad = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
            # The tokenizer's resources (the SentencePiece model) saved with the module.
            self.tokenizer_modules = list(tokenizer.modules)
        words, prefixes, type_ids, types = tag_tables(config)
        self._word_labels = tf.constant(words)
        self._prefixes = tf.constant(prefixes, tf.int32)
        self._type_ids = tf.constant(type_ids, tf.int32)
        self._types = tf.constant(types + [""])  # "" keeps the constant non-empty when there are no types

    def served_pieces(self) -> int:
        """Word pieces the served model reads (its `word_embedding` rows: the pruned vocabulary's with --prune_vocab)."""
        return int(self._keras.model.get_layer("word_embedding").input_dim)

    def served_parameters(self) -> int:
        """Parameters of the served graph (embeddings, body and the heads on the path to the tags)."""
        return int(sum(v.shape.num_elements() for v in self.student_variables))

    @classmethod
    def from_student_dir(cls, student_dir, prune_corpus: Sequence[Path] = (), min_count: int = 1,
                         keep_characters: bool = True, xla_lengths: Sequence[int] = (),
                         unroll: bool = False, bfloat16: bool = False,
                         decode: str = DEFAULT_DECODE, fmt: str = "saved_model") -> "NerServing":
        """The saved student; with `prune_corpus`, serving only the pieces those texts use
        (export.vocabulary); `xla_lengths`, `unroll`, `bfloat16`, `decode` as in __init__. A student whose pieces
        an export in `fmt` cannot make is refused (students.artifact.check_servable). For a saved_model, a
        SentencePiece Unigram student gets its in-graph tokenizer (export.words.SentencePieces); other families'
        ONNX/TFLite exports tokenize in predict.py, and their module has no tokenizer."""
        config = read_config(student_dir)
        check_servable(config, student_dir, fmt)
        if config.tokenizer_family != WORDPIECE:
            if prune_corpus:
                raise ConfigError(f"--prune_vocab prunes WordPiece vocabularies; {student_dir} reads the pieces of a "
                                  f"{config.tokenizer_family} tokenizer")
            tokenizer = None
            if fmt == "saved_model" and config.tokenizer_family == UNIGRAM:
                # Before the model is read: a tokenizer whose pieces the graph does not give is refused (words.py).
                teacher = load_tokenizer(str(Path(student_dir) / "tokenizer"))
                tokenizer = SentencePieces.of_tokenizer(teacher, sentencepiece_model(student_dir, teacher))
                tokenizer.check(teacher, student_dir)
            model = load_student_dir(student_dir)[0]
            return cls(model, config, None, None, xla_lengths, unroll, bfloat16, decode, tokenizer=tokenizer)
        model, config, vocab = load_student_dir(student_dir)
        keep_ids = None
        if prune_corpus:
            counts = piece_counts(corpus_texts(prune_corpus), vocab, config.lower_case)
            keep_ids = kept_piece_ids(counts, vocab, min_count, keep_characters)
        return cls(model, config, vocab, keep_ids, xla_lengths, unroll, bfloat16, decode)

    def _inputs(self, input_ids, attention_mask, case_ids=None) -> dict:
        """The served model's inputs: windows [C, L] of pieces, their mask and, for a student that reads them, the
        pieces' word shapes (PAD at [CLS], [SEP] and padding)."""
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.case:
            if case_ids is None:
                raise ConfigError("this student reads each piece's word shape (case_ids) beside its id; give them")
            inputs[CASE_INPUT] = case_ids
        return inputs

    def _fixed_length_fn(self, length: int):
        """The served model under XLA on windows of exactly `length` pieces (unrolled BiLSTM)."""
        spec = tf.TensorSpec([None, length], tf.int32)

        @tf.function(input_signature=[spec, spec, spec], jit_compile=True)
        def run(input_ids, attention_mask, case_ids):
            return self._keras.model(self._inputs(input_ids, attention_mask, case_ids), training=False)

        return run

    def _student_outputs(self, input_ids, attention_mask, case_ids=None):
        """The served model on windows [C, L] (and their pieces' word shapes, for a student that reads them): at the
        shortest of `xla_lengths` >= L (padded, then cut back to L), else (or for a single window) on the fused
        kernel."""
        inputs = self._inputs(input_ids, attention_mask, case_ids)
        if not self._xla_lengths:
            return self._keras.model(inputs, training=False)
        width = tf.shape(input_ids)[1]
        shapes = case_ids if self.case else tf.zeros_like(input_ids)

        def padded(run, length):
            def branch():
                pad = [[0, 0], [0, length - width]]
                outputs = run(tf.pad(input_ids, pad), tf.pad(attention_mask, pad), tf.pad(shapes, pad))
                return tf.nest.map_structure(lambda t: t[:, :width], outputs)
            return branch

        branches = [padded(run, n) for run, n in zip(self._keras.fixed, self._xla_lengths)]
        branches.append(lambda: self._keras.model(inputs, training=False))
        bucket = tf.reduce_sum(tf.cast(tf.constant(self._xla_lengths) < width, tf.int32))
        # One window alone runs faster on the fused kernel (1.9 against 3.4 ms at (50, 200);
        # from 2 windows on, the unrolled graph is faster: docs/benchmarks.md).
        bucket = tf.where(tf.shape(input_ids)[0] < XLA_MIN_WINDOWS, len(self._xla_lengths), bucket)
        return tf.switch_case(bucket, branches)

    def decode_windows(self, input_ids, attention_mask, case_ids=None):
        """Piece tags of windows [C, L]: (tag_ids int32, tag_probs float32, probs [C, L, N] float32).

        softmax: argmax of the student's probs (the piece tags; `serve` decodes words from the probs with
        the tag scheme, crf/decoding.py); crf: Viterbi over the CRF potentials, with the CRF marginals
        as probs. Positions with attention_mask 0 get the [PAD] tag and 0. `case_ids`: the pieces' word
        shapes, for a student that reads them.
        """
        return self._decode(self._student_outputs(input_ids, attention_mask, case_ids), attention_mask)

    def _decode(self, outputs, attention_mask):
        """decode_windows on the served model's outputs."""
        if self.config.decoder == "crf":
            crf, lengths = self._keras.crf, tf.reduce_sum(attention_mask, axis=1)
            potentials = self.crf_potentials(outputs, attention_mask)
            tag_ids = crf_ops.crf_decode(potentials, crf.transitions, lengths)[0]
            probs = crf_ops.crf_marginals(potentials, lengths, crf.transitions)
        else:
            probs = tf.cast(outputs["probs"], tf.float32)
            tag_ids = tf.argmax(probs, axis=-1, output_type=tf.int32)
        real = attention_mask > 0
        tag_probs = tf.gather(probs, tag_ids, batch_dims=2)
        return tf.where(real, tag_ids, self._pad_tag), tf.where(real, tag_probs, 0.0), probs

    def crf_potentials(self, emissions, attention_mask):
        """CRF students: the emissions [C, L, N] of windows with the `crf` layer's start/end constraints
        applied (float32), the unary potentials its Viterbi and marginals read."""
        crf = self._keras.crf
        return crf_ops.apply_boundary_constraints(tf.cast(emissions, tf.float32), tf.reduce_sum(attention_mask, axis=1),
                                                  crf.start_allowed, crf.end_allowed)

    def portable_outputs(self, input_ids, attention_mask, case_ids=None):
        """What ONNX and TFLite exports compute (export.formats): the served model alone (no XLA
        buckets), then for softmax students the `ids` outputs, for CRF students {"potentials"}, which
        the shipped predict module decodes with its NumPy Viterbi and the `crf` transitions."""
        outputs = self._keras.model(self._inputs(input_ids, attention_mask, case_ids), training=False)
        if self.config.decoder == "crf":
            return {"potentials": self.crf_potentials(outputs, attention_mask)}
        tag_ids, tag_probs, probs = self._decode(outputs, attention_mask)
        return {"tag_ids": tag_ids, "tag_probs": tag_probs, "probs": probs}

    def _ids(self, input_ids, attention_mask, case_ids=None):
        """The `ids` signature (`self.ids`): the client's own pieces [B, T] (with CLS/SEP), and for a student that
        reads them their words' shapes [B, T] -> piece tags."""
        tag_ids, tag_probs, probs = self.decode_windows(input_ids, attention_mask, case_ids)
        return {"tag_ids": tag_ids, "tag_probs": tag_probs, "probs": probs}

    # The stages of `serve`, in order (bin/benchmark served_text times each on its own).
    def _tokens(self, text):
        """Texts [B] -> valid UTF-8 texts [B], the pieces of their words [B, (W), (P)] int32, the words'
        start/end bytes [B, (W)] int64, and for a student that reads them the pieces' word shapes [B, (W), (P)]
        (else None)."""
        text = valid_utf8(text)
        tokens = self.tokenizer.tokenize(text, shapes=self.case)
        return (text, *tokens) if self.case else (text, *tokens, None)

    def _windows(self, pieces, case=None):
        """windows_of the pieces [B, (W), (P)] of `_tokens`: (input_ids, attention_mask, the (window, column) of
        each word's first piece [W, 2], the word shapes [C, L] of the pieces `case`, or None)."""
        input_ids, attention_mask, _, at = windows_of(pieces.merge_dims(1, 2), self._budget, self._cls, self._sep,
                                                      self._pad)
        if case is not None:
            case = windows_of(case.merge_dims(1, 2), self._budget, PAD_SHAPE, PAD_SHAPE, PAD_SHAPE)[0]
        # A word's label sits at its first piece (alignment.py).
        return input_ids, attention_mask, tf.gather(at, pieces.values.row_splits[:-1]), case

    def _word_tags(self, outputs, windows, start):
        """The word tags [W] int32 and their scores [W] float32, from the served model's `outputs` on the
        `_windows` of the words with start bytes `start` [B, (W)]. Softmax students: the WordDecoder on the probs
        at the words' first pieces (the tag scheme's best valid sequence, or argmax); CRF students: the piece
        Viterbi's tag at the first piece."""
        _, attention_mask, at_first, _ = windows
        word_rows, num_words = start.value_rowids(), start.row_lengths()
        if self.word_decoder is None:
            tag_ids, tag_probs, _ = self._decode(outputs, attention_mask)
            return tf.gather_nd(tag_ids, at_first), tf.gather_nd(tag_probs, at_first)
        word_probs = tf.gather_nd(tf.cast(outputs["probs"], tf.float32), at_first)
        # Per text, padded with zeros to [B, max(num_words), N].
        at = tf.stack([word_rows, _positions(word_rows, num_words)], axis=1)
        shape = tf.stack([tf.size(num_words, out_type=tf.int64), _max(num_words),
                          tf.shape(word_probs, out_type=tf.int64)[1]])
        labels, scores = self.word_decoder(tf.scatter_nd(at, word_probs, shape), num_words)
        return tf.gather_nd(labels, at), tf.gather_nd(scores, at)

    def _entities(self, text, start, end, tags, probs):
        """The signature's outputs from valid UTF-8 texts [B], their words' start/end bytes [B, (W)] and the words'
        tags and scores [W]."""
        rows, num_words, start_byte, end_byte = start.value_rowids(), start.row_lengths(), start.values, end.values
        position = _positions(rows, num_words)
        prefix, type_id = tf.gather(self._prefixes, tags), tf.gather(self._type_ids, tags)
        first, last, span_of_word, in_entity = decode_spans(prefix, type_id, position)
        span_rows = tf.gather(rows, first)
        span_start_byte, span_end_byte = tf.gather(start_byte, first), tf.gather(end_byte, last)
        confidence = tf.math.unsorted_segment_mean(tf.boolean_mask(probs, in_entity),
                                                   tf.boolean_mask(span_of_word, in_entity), tf.size(first))
        entity_text = tf.strings.substr(tf.gather(text, span_rows), span_start_byte,
                                        span_end_byte - span_start_byte, unit="BYTE")
        # Word starts and ends in characters, in one pass; a span starts at its first word and ends at its last.
        chars = byte_to_char(text, tf.concat([rows, rows], axis=0), tf.concat([start_byte, end_byte], axis=0))
        word_start, word_end = chars[:tf.size(rows)], chars[tf.size(rows):]
        nrows = tf.shape(text)[0]
        num_entities = tf.math.bincount(tf.cast(span_rows, tf.int32), minlength=nrows, maxlength=nrows)
        words = dense_index(rows, position, num_words)
        spans = dense_index(span_rows, _positions(span_rows, tf.cast(num_entities, tf.int64)), num_entities)
        return {
            "num_words": tf.cast(num_words, tf.int32),
            "word_tags": padded(tf.gather(self._word_labels, tags), words, ""),
            "word_start": padded(word_start, words, -1),
            "word_end": padded(word_end, words, -1),
            "num_entities": num_entities,
            "entity_start": padded(tf.gather(word_start, first), spans, -1),
            "entity_end": padded(tf.gather(word_end, last), spans, -1),
            "entity_type": padded(tf.gather(self._types, tf.gather(type_id, first)), spans, ""),
            "entity_text": padded(entity_text, spans, ""),
            "entity_confidence": padded(confidence, spans, 0.0),
        }

    @tf.function(input_signature=[TEXT_SPEC])
    def serve(self, text):
        """The `serving_default` signature: text [B] UTF-8 -> word tags and entities, padded (docs/serving.md)."""
        text, pieces, start, end, case = self._tokens(text)
        windows = self._windows(pieces, case)
        input_ids, attention_mask, _, case_ids = windows
        tags, probs = self._word_tags(self._student_outputs(input_ids, attention_mask, case_ids), windows, start)
        return self._entities(text, start, end, tags, probs)


def exported_decode(saved_model_dir) -> str:
    """How a SavedModel export decodes its word tags (assets.extra/export.json). Exports written before
    it existed decode softmax students with the argmax, CRF students with their Viterbi."""
    extra = Path(saved_model_dir) / "assets.extra"
    if (extra / EXPORT_META).exists():
        return read_json(extra / EXPORT_META)["decode"]
    student = extra / "student.json"
    return "constrained" if student.exists() and read_json(student).get("decoder") == "crf" else "argmax"


def next_version(model_dir: Path) -> int:
    """1 + the highest numeric version under `model_dir` (TF Serving serves the highest)."""
    versions = [int(p.name) for p in model_dir.glob("*") if p.is_dir() and p.name.isdigit()]
    return max(versions, default=0) + 1


def export_student(student_dir, export_dir, name: str = "ner", version: int = 0, overwrite: bool = False,
                   prune_corpus: Sequence[Path] = (), min_count: int = 1,
                   keep_characters: bool = True, xla_lengths: Sequence[int] = (),
                   bfloat16: bool = False, decode: str = DEFAULT_DECODE) -> Tuple[Path, NerServing]:
    """Writes <export_dir>/<name>/<version>/ (SavedModel with `serving_default` and `ids`);
    returns it and the module that was saved.

    version 0 means the next free version. `prune_corpus`, `xla_lengths`, `decode` etc.: see NerServing.
    `bfloat16` (bin/export --quantize=bfloat16): weights stored and computed in bfloat16 (as in
    NerServing), refused on a CPU without bfloat16 units (export.bfloat16.check_cpu).
    assets.extra/ (which TF Serving ignores) gets the student's student.json (bin/predict and
    clients read the tags there), the served vocab.txt (the ids the `ids` signature takes; for a SentencePiece
    student its tokenizer/ instead) and export.json ({"decode": how word tags are decoded}, which bin/evaluate
    reports).
    """
    check_decode(decode)
    if bfloat16:
        check_cpu()  # before any work
    student_dir = Path(student_dir)
    check_servable(read_config(student_dir), student_dir)  # before any work
    model_dir = Path(export_dir) / name
    version = version or next_version(model_dir)
    target = model_dir / str(version)
    if target.exists() and not overwrite:
        raise ConfigError(f"{target} exists; pass --overwrite or another --version")
    module = NerServing.from_student_dir(student_dir, prune_corpus, min_count, keep_characters, xla_lengths,
                                         bfloat16=bfloat16, decode=decode)
    signatures = {"serving_default": module.serve.get_concrete_function(), "ids": module.ids.get_concrete_function()}
    with atomic_dir(target) as tmp:
        tf.saved_model.save(module, str(tmp), signatures=signatures)
        (tmp / "assets.extra").mkdir()
        shutil.copyfile(student_dir / "student.json", tmp / "assets.extra" / "student.json")
        if module.vocab is not None:
            (tmp / "assets.extra" / "vocab.txt").write_text("".join(p + "\n" for p in module.vocab), encoding="utf-8")
        else:
            shutil.copytree(student_dir / "tokenizer", tmp / "assets.extra" / "tokenizer")
        atomic_write_json(tmp / "assets.extra" / EXPORT_META, {"decode": module.decode,
                                                              STUDENT_IDENTITY: student_identity(student_dir)})
    return target, module
