"""bin/benchmark finetune_memory: peak resident memory of one teacher's fine-tuning steps, the package's against a
plain loop, whole batches and micro-batches (docs/benchmarks.md 5.2).

Each row runs `--memory_steps` steps of batch `--teacher_batch_size` x `--max_seq_length` pieces (random ids: memory
depends on shapes, not values) in a fresh process and prints its peak RSS (the kernel's VmHWM) and its RSS once the
teacher is built:
- reference: a plain loop that shares no code with the package: transformers' `TFAutoModel`, a Dense head, Keras
  AdamW, one `tf.function` step; with micro-batches, a `tf.while_loop` over them that sums the gradients in
  variables;
- package: the teacher step's own `make_train_step` (teachers/finetune.py: `TeacherStep`, one AdamW per group) with
  `micro_batch_size`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List

import numpy as np
from absl import flags

from xtremedistil_tf import resident
from xtremedistil_tf.benchmarks.memory import child_json

TAGS = 9   # WikiAnn's IOB2 labels


def define_flags() -> None:
    """This benchmark's flags; call before flags are parsed (bin/benchmark does). Idempotent."""
    if "memory_micro" not in flags.FLAGS:
        flags.DEFINE_string("memory_micro", "0,4", "finetune_memory: micro-batch sizes to measure (0: the whole "
                                                   "batch at once), comma-separated.")


def _batches(path: str, steps: int, batch: int, seq: int):
    vocab = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    rng = np.random.default_rng(0)
    for _ in range(steps):
        ids = rng.integers(min(1000, vocab // 2), min(20000, vocab), (batch, seq)).astype(np.int32)
        yield ids, rng.integers(0, TAGS, (batch, seq)).astype(np.int32)


def reference(path: str, micro: int, steps: int, batch: int, seq: int) -> dict:
    """The plain loop (see the module doc): its RSS once built, and its peak."""
    import tensorflow as tf  # noqa: PLC0415
    from transformers import TFAutoModel  # noqa: PLC0415

    encoder, head = TFAutoModel.from_pretrained(path), tf.keras.layers.Dense(TAGS)
    encoder(input_ids=tf.ones([1, 4], tf.int32))
    head.build([None, None, encoder.config.hidden_size])
    variables = [v for v in encoder.trainable_variables if "pooler" not in v.name] + head.trainable_variables
    optimizer = tf.keras.optimizers.AdamW(5e-5)
    optimizer.build(variables)
    sums = [tf.Variable(tf.zeros_like(v), trainable=False) for v in variables] if micro else []
    built = resident.rss_mib()

    def loss_of(ids, tags, rows):
        hidden = encoder(input_ids=ids, attention_mask=tf.ones_like(ids), training=True).last_hidden_state
        loss = tf.keras.losses.sparse_categorical_crossentropy(tags, head(hidden), from_logits=True)
        return tf.reduce_mean(loss) * tf.cast(tf.shape(ids)[0], tf.float32) / tf.cast(rows, tf.float32)

    spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[spec, spec])
    def step(ids, tags):
        rows = tf.shape(ids)[0]
        if not micro:
            with tf.GradientTape() as tape:
                loss = loss_of(ids, tags, rows)
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return
        for total in sums:
            total.assign(tf.zeros_like(total))

        def part(i):
            with tf.GradientTape() as tape:
                loss = loss_of(ids[i * micro:(i + 1) * micro], tags[i * micro:(i + 1) * micro], rows)
            for total, gradient in zip(sums, tape.gradient(loss, variables)):
                total.assign_add(tf.convert_to_tensor(gradient))
            return (i + 1,)

        tf.while_loop(lambda i: i * micro < rows, part, (0,), parallel_iterations=1)
        optimizer.apply_gradients(zip([total.read_value() for total in sums], variables))

    for ids, tags in _batches(path, steps, batch, seq):
        step(ids, tags)
    return {"built_mib": built, "peak_mib": resident.peak_mib()}


def package(path: str, micro: int, steps: int, batch: int, seq: int) -> dict:
    """The teacher step's `make_train_step` on a fresh teacher (teachers/model.build_teacher)."""
    import tensorflow as tf  # noqa: PLC0415

    from xtremedistil_tf.teachers.finetune import FinetuneConfig, make_train_step, parameter_groups  # noqa: PLC0415
    from xtremedistil_tf.teachers.model import build_teacher  # noqa: PLC0415

    labels = ["O"] + [f"{p}-{t}" for t in ("PER", "ORG", "LOC", "MISC") for p in "BI"]
    teacher, _ = build_teacher(path, labels, max_seq_length=seq)
    step = make_train_step(teacher, parameter_groups(teacher, FinetuneConfig(batch_size=batch), 1000), micro)
    built = resident.rss_mib()
    for ids, tags in _batches(path, steps, batch, seq):
        step({"input_ids": tf.constant(ids), "attention_mask": tf.ones_like(ids), "label_ids": tf.constant(tags)})
    return {"built_mib": built, "peak_mib": resident.peak_mib()}


def measure(kind: str, path: str, micro: int, steps: int, batch: int, seq: int) -> dict:
    """One row in a fresh Python process; its JSON result."""
    return child_json("xtremedistil_tf.benchmarks.finetune_memory", kind, path, micro, steps, batch, seq)


def run(repeats: int) -> List[str]:
    from xtremedistil_tf.teachers.pretrained import resolve_teacher_path  # noqa: PLC0415

    FLAGS = flags.FLAGS
    path = resolve_teacher_path(FLAGS.teacher)
    micros = [int(m) for m in FLAGS.memory_micro.split(",") if m.strip()]
    batch, seq, steps = FLAGS.teacher_batch_size, FLAGS.max_seq_length, FLAGS.memory_steps
    lines = [f"# {FLAGS.teacher} ({path}), batch {batch} x {seq} pieces, {steps} steps per row, each row in a fresh "
             "process; peak RSS (VmHWM)",
             f"{'loop':<10}{'micro-batch':>12}{'RSS built':>12}{'peak RSS':>11}"]
    for micro in micros:
        for kind in ("reference", "package"):
            r = measure(kind, path, micro, steps, batch, seq)
            lines.append(f"{kind:<10}{micro or batch:>12}{r['built_mib']:>8.0f} MiB{r['peak_mib']:>7.0f} MiB")
    return lines


if __name__ == "__main__":
    import xtremedistil_tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow loads)

    kind_, path_, micro_, steps_, batch_, seq_ = sys.argv[1:7]
    function = {"reference": reference, "package": package}[kind_]
    print(json.dumps(function(path_, int(micro_), int(steps_), int(batch_), int(seq_))), flush=True)
