"""`bin/benchmark precision`: one training step under float32, mixed_bfloat16 and mixed_float16.

Two steps, each built and compiled under the policy as the pipeline does (engine/precision.py):
- the teacher: `teachers/finetune.make_train_step` on a randomly initialised BERT of the MSRA config
  (4 layers, hidden 256), CRF head, layer-wise decay (one AdamW per depth), batch 32 x 64 pieces;
- the student: a BiLSTM+CRF (E=100, H=300 per direction, 13 tags) on the CRF NLL, batch 32 x 64.
Median milliseconds per step over `repeats` steps, and the ratio to float32. Mixed precision pays off
on GPUs and TPUs with 16-bit units; on a CPU without them it is expected to be slower.
"""
from __future__ import annotations

import os
import platform
import tempfile
from typing import Callable, List

import numpy as np
import tensorflow as tf

from xtremedistil_tf.benchmarks.timing import median_ms
from xtremedistil_tf.crf import ops
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.engine.precision import POLICIES, precision_policy, with_loss_scaling
from xtremedistil_tf.students.crf_student import build_bilstm_crf_student, student_crf_constraints
from xtremedistil_tf.teachers.crf_head import build_crf_teacher
from xtremedistil_tf.teachers.finetune import FinetuneConfig, make_train_step, parameter_groups
from xtremedistil_tf.teachers.model import write_random_teacher_dir

BATCH, LENGTH = 32, 64
LABELS = ["O"] + [f"{p}-{t}" for t in ("NR", "NS", "NT") for p in "BMES"]
TEACHER = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}


def _batch(vocab_size: int, num_tags: int) -> dict:
    rng = np.random.default_rng(0)
    return {"input_ids": tf.constant(rng.integers(5, vocab_size, [BATCH, LENGTH]), tf.int32),
            "attention_mask": tf.ones([BATCH, LENGTH], tf.int32),
            "label_ids": tf.constant(rng.integers(0, num_tags, [BATCH, LENGTH]), tf.int32)}


def teacher_step() -> Callable[[], tf.Tensor]:
    directory = write_random_teacher_dir(tempfile.mkdtemp(prefix="bench_teacher_") + "/t",
                                         [chr(c) for c in range(0x4E00, 0x4E00 + 3000)], TEACHER)
    teacher, _ = build_crf_teacher(str(directory), LABELS, "BMES", LENGTH, random_init=True)
    config = FinetuneConfig(learning_rate=5e-4, head_learning_rate=1e-3, layer_decay=0.9)
    step = make_train_step(teacher, parameter_groups(teacher, config, 1000))
    batch = _batch(teacher.encoder.config.vocab_size, len(teacher.tag_vocab))
    return lambda: step(batch)


def student_step() -> Callable[[], tf.Tensor]:
    vocab = TagVocab(LABELS)
    student = build_bilstm_crf_student(3005, len(vocab), student_crf_constraints(vocab, "BMES"),
                                       embedding_dim=100, hidden=300, dropout=0.5)
    optimizer = with_loss_scaling(tf.keras.optimizers.Adam(1e-3))
    crf = student.get_layer("crf")
    batch = _batch(3005, len(LABELS))
    lengths = tf.fill([BATCH], LENGTH)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            potentials = student({k: batch[k] for k in ("input_ids", "attention_mask")}, training=True)["potentials"]
            loss = ops.crf_nll_loss(potentials, batch["label_ids"], lengths, crf.transitions)
        optimizer.minimize(loss, student.trainable_variables, tape=tape)
        return loss

    return step


def run(repeats: int) -> List[str]:
    lines = [f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, TF {tf.__version__}, "
             f"batch {BATCH} x {LENGTH}, median of {repeats} steps",
             f"{'step':<40}{'policy':<16}{'ms/step':>10}{'vs float32':>12}"]
    for name, build in (("teacher BERT 4x256 + CRF, AdamW/depth", teacher_step),
                        ("student BiLSTM+CRF E100 H300", student_step)):
        base = None
        for policy in POLICIES:
            with precision_policy(policy):
                tf.keras.utils.set_random_seed(0)
                ms = median_ms(build(), repeats)
            base = base or ms
            lines.append(f"{name:<40}{policy:<16}{ms:>10.1f}{ms / base:>11.2f}x")
    return lines
