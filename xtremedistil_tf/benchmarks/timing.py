"""Timing shared by the benchmarks."""
from __future__ import annotations

import statistics
import time
from typing import Callable, List

import numpy as np
import tensorflow as tf


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median wall time of fn() in milliseconds, waiting for every output tensor.

    The warm-up calls absorb tracing and XLA compilation.
    """
    for _ in range(warmup):
        call_seconds(fn)
    return 1e3 * statistics.median([call_seconds(fn) for _ in range(repeats)])


def call_seconds(fn: Callable[[], object]) -> float:
    """Wall time of fn() in seconds, waiting for every output tensor."""
    start = time.perf_counter()
    for tensor in tf.nest.flatten(fn()):
        if isinstance(tensor, tf.Tensor):
            tensor.numpy()
    return time.perf_counter() - start


# What bin/benchmark latency and its peer rows time: the batch sizes, and the label set of its random students and
# teachers (11 piece tags with the markers, as in the paper).
LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
BATCHES = (1, 32)


def query_batches(queries: np.ndarray, batch: int) -> List[np.ndarray]:
    """`queries` in batches of `batch` rows; the last wraps around to the first queries so all have one shape."""
    calls = -(-len(queries) // batch)
    ids = np.resize(queries, (calls * batch,) + queries.shape[1:])
    return [ids[i * batch:(i + 1) * batch] for i in range(calls)]
