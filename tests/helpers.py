"""Helpers several tests share that the package itself does not need (issue 31 item 4)."""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.alignment import Windows, predict_by_length
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.wordsplit import split_words
from xtremedistil_tf.methods.staged import head_argmax_fn


def predict_tags(student: tf.keras.Model, windows: Windows, batch_size: int = 64, head: str = "softmax") -> np.ndarray:
    """Argmax tag id per piece [W, L] from the `softmax` (probs) or `logits` head, windows batched by length;
    decode the result with `xtremedistil_tf.data.alignment.decode`."""
    return predict_by_length(windows, head_argmax_fn(student, head), batch_size)


def divided_tokens(sentences: Sequence[Sentence]) -> Tuple[int, int]:
    """(tokens BERT's word split divides or drops, all tokens) of sentences in the data's own tokens."""
    divided = total = 0
    for sentence in sentences:
        for token, parts in zip(sentence.tokens, split_words(sentence.tokens)):
            total += 1
            divided += not (len(parts) == 1 and parts[0] == (0, len(token)))
    return divided, total
