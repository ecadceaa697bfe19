"""The sentence-classification teacher's outputs over the transfer set, one cached example per text."""
from __future__ import annotations

from typing import Dict

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.classification import TextArrays
from xtremedistil_tf.teachers.classifier import SequenceTeacher
from xtremedistil_tf.transfer.cache import pad_values_of, write_sharded
from xtremedistil_tf.transfer.outputs import storage, teacher_outputs_fn


def write_sequence_outputs(teacher: SequenceTeacher, arrays: TextArrays, out_dir, layer: int, fingerprint: dict, *,
                           hidden_dtype: str = "float16", logits_topk: int = 0, hidden: bool = True,
                           **cache_options) -> dict:
    """Cache per text: input_ids, attention_mask [T] (at the text's real length), label_ids [], logits [C]
    and, with `hidden`, the [CLS] state of hidden_states[layer] [H]; resumable like the token caches
    (transfer/cache.py). `hidden_dtype`, `logits_topk`: outputs.storage."""
    run = teacher_outputs_fn(teacher, layer)

    def compute(rows: np.ndarray) -> Dict[str, np.ndarray]:
        mask = arrays.attention_mask[rows]
        length = max(1, int(mask.sum(1).max()))
        logits, states = run(tf.constant(arrays.input_ids[rows][:, :length]), tf.constant(mask[:, :length]))
        out = {"input_ids": arrays.input_ids[rows], "attention_mask": mask,
               # float32 whatever the precision policy computed them in (the cache's dtypes decide storage).
               "label_ids": arrays.label_ids[rows], "logits": logits.numpy().astype(np.float32)}
        if hidden:
            out["hidden"] = states.numpy().astype(np.float32)
        return out

    layout = storage(hidden_dtype, logits_topk)
    if not hidden:
        layout = {k: {key: v for key, v in part.items() if key != "hidden"} for k, part in layout.items()}
    return write_sharded(out_dir, len(arrays), compute, fingerprint=fingerprint,
                         lengths=np.asarray(arrays.attention_mask).sum(1),
                         ragged={"input_ids": 0, "attention_mask": 0},
                         pad_values=pad_values_of({"input_ids": arrays.input_ids}, arrays.attention_mask),
                         **layout, **cache_options)
