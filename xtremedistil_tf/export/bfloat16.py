"""bin/export --quantize=bfloat16: a SavedModel whose served weights are stored and computed in
bfloat16, made only on a CPU with bfloat16 units (AVX512-BF16 or AMX-BF16); docs/serving.md.

`check_cpu` refuses elsewhere in one line, before any work (export.formats.check_format and
export.serving.export_student call it); `in_bfloat16` makes the served Keras model's bfloat16 copy
(export.serving.NerServing). A bfloat16 BiLSTM runs as a tf.scan (students.layers.BlockBiLSTM):
TensorFlow's fused LSTM kernel has no bfloat16 kernel.
"""
from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.students.artifact import clone_replacing

CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# Kept float32: the tag softmax, float32 under mixed precision too (students/models.py), so near-ties
# between tags are not rounded into ties.
FLOAT32_LAYERS = ("probs",)


def cpu_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU computes bfloat16 natively: AVX512-BF16 or AMX-BF16 among the flags of
    `cpuinfo` (tests pass a file of their own)."""
    try:
        flags = Path(cpuinfo).read_text().split()
    except OSError:
        return False
    return any(flag in flags for flag in CPU_FLAGS)


def check_cpu(cpuinfo: str = "/proc/cpuinfo") -> None:
    """One-line ConfigError unless cpu_has_bf16(cpuinfo)."""
    if not cpu_has_bf16(cpuinfo):
        raise ConfigError("--quantize=bfloat16 needs a CPU with AVX512-BF16 or AMX-BF16 (none of "
                          f"{', '.join(CPU_FLAGS)} in {cpuinfo}; emulated bfloat16 is slower than float32): "
                          "export with --quantize=none, or --format=onnx|tflite --quantize=dynamic_int8 for smaller weights")


def in_bfloat16(model: tf.keras.Model) -> tf.keras.Model:
    """A copy of functional `model` whose layers hold and compute in bfloat16 (Keras policy
    "bfloat16": weights rounded to bfloat16, matmuls and the BiLSTM in bfloat16), except
    FLOAT32_LAYERS; inputs keep their dtypes. Sublayers a layer makes in __init__ (e.g.
    TransformerEncoder's) follow the global policy, which is "bfloat16" while the copy is made."""
    def make(layer):
        dtype = "float32" if layer.name in FLOAT32_LAYERS else "bfloat16"
        return layer.__class__.from_config({**layer.get_config(), "dtype": dtype})

    previous = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy("bfloat16")
    try:
        return clone_replacing(model, {layer.name: (make, lambda old, new: new.set_weights(old.get_weights()))
                                       for layer in model.layers if not isinstance(layer, tf.keras.layers.InputLayer)})
    finally:
        tf.keras.mixed_precision.set_global_policy(previous)
