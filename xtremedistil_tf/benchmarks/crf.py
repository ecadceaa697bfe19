"""`bin/benchmark crf`: CRF ops at the tfa fixture's first case shapes (B=32, T=128, N=9).

Measures log-likelihood + 1-best decode (the tensorflow-addons target: 7.6 ms
median in tf.function on TF 2.15, same machine kind) and crf_kbest_decode for
k = 1, 5, 15, each eagerly, in tf.function and in tf.function(jit_compile=True).
"""
from __future__ import annotations

import os
import platform
from typing import List

import numpy as np
import tensorflow as tf

from xtremedistil_tf.benchmarks.timing import median_ms
from xtremedistil_tf.crf import ops

BATCH, STEPS, TAGS = 32, 128, 9
KS = (1, 5, 15)


def _inputs(seed=0):
    """Random potentials/transitions/tags and ragged lengths in [T/2, T] (the longest is T)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(STEPS // 2, STEPS + 1, BATCH).astype(np.int32)
    lengths[0] = STEPS
    return (
        tf.constant(rng.normal(0, 2, [BATCH, STEPS, TAGS]).astype(np.float32)),
        tf.constant(rng.integers(0, TAGS, [BATCH, STEPS]).astype(np.int32)),
        tf.constant(lengths),
        tf.constant(rng.normal(0, 1, [TAGS, TAGS]).astype(np.float32)),
    )


def _likelihood_and_decode(potentials, tags, lengths, transitions):
    return ops.crf_log_likelihood(potentials, tags, lengths, transitions), ops.crf_decode(
        potentials, transitions, lengths
    )


def _decode(potentials, tags, lengths, transitions):
    return ops.crf_decode(potentials, transitions, lengths)


def _kbest(k):
    def fn(potentials, tags, lengths, transitions):
        return ops.crf_kbest_decode(potentials, transitions, lengths, k)

    return fn


def _modes(fn):
    """(name, callable) for eager, tf.function and XLA versions of fn."""
    return [
        ("eager", fn),
        ("tf.function", tf.function(fn)),
        ("xla", tf.function(fn, jit_compile=True)),
    ]


def run(repeats: int) -> List[str]:
    args = _inputs()
    workloads = [("log_likelihood + decode", _likelihood_and_decode), ("decode (1-best)", _decode)] + [
        (f"kbest_decode k={k}", _kbest(k)) for k in KS
    ]
    lines = [
        f"crf: B={BATCH} T={STEPS} N={TAGS}, median of {repeats} runs (eager: {max(repeats // 4, 3)}), ms",
        f"tensorflow {tf.__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"GPUs: {len(tf.config.list_physical_devices('GPU'))}",
        f"{'workload':<26}{'eager':>10}{'tf.function':>13}{'xla':>10}",
    ]
    for name, fn in workloads:
        cells = []
        for mode, compiled in _modes(fn):
            runs = max(repeats // 4, 3) if mode == "eager" else repeats
            cells.append(median_ms(lambda: compiled(*args), runs))
        lines.append(f"{name:<26}" + "".join(f"{c:>{w}.2f}" for c, w in zip(cells, (10, 13, 10))))
    return lines
