"""Word tags of a softmax student: the best sequence its tag scheme allows (default) or the argmax.

A softmax student scores every piece on its own, so the argmax can give sequences the scheme
forbids (`O I-PER`, an `E-LOC` with no `B-LOC` before it). `WordDecoder` decodes per word, the unit
users see: a word's scores are the probabilities at its first piece (the piece that carries the
word's label, data/alignment.py), where a marker tag (X, [CLS], [SEP], [PAD]) counts as O, as
`TagVocab.word_label` reads it (the score of each label is the highest probability among the tags
that read as it). Then

- "constrained": the most probable sequence of word labels that is valid under the scheme. Where
  each word's best label (the argmax of the potentials below) already makes a valid sequence, that
  sequence; otherwise Viterbi (`crf.ops.crf_decode`) over the logs of these scores, with the
  scheme's allowed moves as transitions (0 allowed, -1e4 forbidden: `crf.ops.allowed_transitions`,
  `apply_transition_constraints`) and its allowed first and last tags (`apply_boundary_constraints`).
  The first case is exact, not a shortcut: with every transition 0 or below, no path scores above the
  sum of the per-word maxima, and a valid argmax path reaches it. It also skips ~440 of a served
  text's graph ops at batch 1 (30 words: 956 -> 516 ops, 0.25 ms, docs/benchmarks.md), and it keeps the
  more probable label where the Viterbi's float32 running sum can no longer tell two labels apart
  (a long text of improbable words: a tie there goes to the lower label id).
- "argmax": each word's best label on its own (what serving did before constrained decoding).

Decoding per word rather than per piece makes the constraint exact: the piece-level CRF mask
(teachers/crf_head.py) cannot check a move across a word's `X` pieces, so `O X I-PER` passes it.
The same decoder serves the SavedModel graph (export/serving.py), bin/predict's Python tagger and
bin/evaluate on a saved student (`decode_windows`); the ONNX/TFLite `predict.py` (export/portable.py,
which imports nothing of this package) runs the same steps in NumPy from `export_meta()`.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf import ops as crf_ops
from xtremedistil_tf.errors import ConfigError

DECODES = ("constrained", "argmax")
DEFAULT_DECODE = "constrained"
_TINY = float(np.finfo(np.float32).tiny)


def check_decode(decode: str) -> str:
    """`decode`, or a one-line ConfigError when it is not one of DECODES."""
    if decode not in DECODES:
        raise ConfigError(f"--decode={decode}: expected one of {', '.join(DECODES)}")
    return decode


class WordDecoder:
    """Word labels from piece-tag probabilities. `tags`: the piece tags (labels then markers),
    `labels`: the word labels, `scheme`: their tag scheme, `decode`: one of DECODES."""

    def __init__(self, tags: Sequence[str], labels: Sequence[str], scheme: str, decode: str = DEFAULT_DECODE):
        self.decode = check_decode(decode)
        self.labels = list(labels)
        outside = self.labels.index("O") if "O" in self.labels else -1
        # The word label each piece tag reads as (markers: O; -1 when there is no O label).
        self.label_of_tag = np.array([i if i < len(self.labels) else outside for i in range(len(tags))], np.int32)
        allowed, self.start, self.end = crf_ops.allowed_transitions(self.labels, scheme)
        self.allowed = np.asarray(allowed, bool)
        self.transitions = crf_ops.apply_transition_constraints(
            np.zeros(allowed.shape, np.float32), allowed).numpy()

    def label_scores(self, probs):
        """probs [..., tags] -> [..., labels] float32: the highest probability among the tags that read
        as each label."""
        fold = tf.one_hot(self.label_of_tag, len(self.labels), dtype=tf.float32)  # [tags, labels]; -1: zeros
        return tf.reduce_max(tf.cast(probs, tf.float32)[..., :, None] * fold, axis=-2)

    def __call__(self, probs, lengths) -> Tuple[tf.Tensor, tf.Tensor]:
        """probs [B, W, tags] at each word's first piece, lengths [B] words -> (label ids [B, W] int32,
        their scores [B, W] float32); positions past a length are label 0 with its score."""
        scores = self.label_scores(probs)
        if self.decode == "argmax":
            labels = tf.argmax(scores, axis=-1, output_type=tf.int32)
        else:
            potentials = crf_ops.apply_boundary_constraints(tf.math.log(tf.maximum(scores, _TINY)), lengths,
                                                            self.start, self.end)
            labels = self.best_valid(potentials, lengths)
        return labels, tf.gather(scores, labels, batch_dims=2)

    def best_valid(self, potentials, lengths):
        """The constrained labels [B, W] int32 of potentials [B, W, labels] (boundary constraints applied):
        per text, its argmax where that is a valid sequence, else its Viterbi path (module docstring);
        0 past a length. The Viterbi runs only when some text of the batch needs it."""
        real = tf.sequence_mask(lengths, tf.shape(potentials)[1])
        greedy = tf.where(real, tf.argmax(potentials, axis=-1, output_type=tf.int32), 0)
        moves = tf.gather_nd(self.allowed, tf.stack([greedy[:, :-1], greedy[:, 1:]], axis=-1))
        valid = tf.reduce_all(moves | ~real[:, 1:], axis=1)
        return tf.cond(tf.reduce_all(valid), lambda: greedy, lambda: tf.where(
            valid[:, None], greedy, crf_ops.crf_decode(potentials, self.transitions, lengths)[0]))

    def decode_windows(self, windows, probs: np.ndarray) -> Tuple[List[List[str]], List[List[float]]]:
        """Per sentence of encoded `windows` (data/alignment.Windows): its word labels and their scores,
        from the piece probabilities [W, L, tags] of the windows; each word is read in the window that
        owns it (alignment.py's max-context rule)."""
        lengths = np.asarray(windows.sentence_lengths, np.int64)
        word_probs = np.zeros((len(lengths), max(1, int(lengths.max(initial=0))), probs.shape[-1]), np.float32)
        rows, cols = np.nonzero(windows.owner)
        word_probs[windows.sentence_index[rows], windows.word_index[rows, cols]] = probs[rows, cols]
        ids, scores = (t.numpy() for t in self(word_probs, lengths))
        return ([[self.labels[i] for i in ids[s, :n]] for s, n in enumerate(lengths)],
                [scores[s, :n].tolist() for s, n in enumerate(lengths)])

    def export_meta(self) -> Dict:
        """What the ONNX/TFLite predict.py needs to decode the same way (export.json)."""
        return {"decode": self.decode, "label_of_tag": self.label_of_tag.tolist(),
                "word_transitions": self.transitions.tolist(), "word_start": self.start.tolist(),
                "word_end": self.end.tolist()}
