"""Timing shared by the benchmarks."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import tensorflow as tf


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median wall time of fn() in milliseconds, waiting for every output tensor.

    The warm-up calls absorb tracing and XLA compilation.
    """
    for _ in range(warmup):
        _materialize(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _materialize(fn())
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _materialize(outputs) -> None:
    for tensor in tf.nest.flatten(outputs):
        if isinstance(tensor, tf.Tensor):
            tensor.numpy()
