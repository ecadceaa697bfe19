"""The sentence-classification teacher's outputs over the transfer set, one cached example per text."""
from __future__ import annotations

from typing import Dict

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.classification import TextArrays
from xtremedistil_tf.teachers.classifier import SequenceTeacher
from xtremedistil_tf.transfer.cache import write_sharded
from xtremedistil_tf.transfer.outputs import teacher_outputs_fn


def write_sequence_outputs(teacher: SequenceTeacher, arrays: TextArrays, out_dir, layer: int, fingerprint: dict,
                           **cache_options) -> dict:
    """Cache per text: input_ids, attention_mask [T], label_ids [], logits [C] and the [CLS] state
    of hidden_states[layer] [H]; resumable like the token caches (transfer/cache.py)."""
    run = teacher_outputs_fn(teacher, layer)

    def compute(start: int, end: int) -> Dict[str, np.ndarray]:
        mask = arrays.attention_mask[start:end]
        length = max(1, int(mask.sum(1).max()))
        logits, hidden = run(tf.constant(arrays.input_ids[start:end, :length]), tf.constant(mask[:, :length]))
        return {"input_ids": arrays.input_ids[start:end], "attention_mask": mask,
                # float32 whatever the precision policy computed them in (the cache's dtypes decide storage).
                "label_ids": arrays.label_ids[start:end], "logits": logits.numpy().astype(np.float32),
                "hidden": hidden.numpy().astype(np.float32)}

    return write_sharded(out_dir, len(arrays), compute, fingerprint=fingerprint, **cache_options)
