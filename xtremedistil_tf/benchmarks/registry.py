"""Benchmark registry: `bin/benchmark NAME` runs BENCHMARKS[NAME].

Each entry is a function (repeats: int) -> list of printable lines. Add a
subcommand by adding a module under xtremedistil_tf/benchmarks/ and a line here.
"""
from __future__ import annotations

from typing import Callable, Dict, List

from xtremedistil_tf.benchmarks import cache_size as cache_benchmarks
from xtremedistil_tf.benchmarks import crf as crf_benchmarks
from xtremedistil_tf.benchmarks import decoders as decoders_benchmarks
from xtremedistil_tf.benchmarks import deployed as deployed_benchmarks
from xtremedistil_tf.benchmarks import embedding_drift as embedding_drift_benchmarks
from xtremedistil_tf.benchmarks import finetune_memory as finetune_memory_benchmarks
from xtremedistil_tf.benchmarks import formats as formats_benchmarks
from xtremedistil_tf.benchmarks import latency as latency_benchmarks
from xtremedistil_tf.benchmarks import lengths as lengths_benchmarks
from xtremedistil_tf.benchmarks import memory as memory_benchmarks
from xtremedistil_tf.benchmarks import precision as precision_benchmarks
from xtremedistil_tf.benchmarks import served_text as served_text_benchmarks
from xtremedistil_tf.benchmarks import spacy_peer as spacy_peer_benchmarks
from xtremedistil_tf.benchmarks import teacher as teacher_benchmarks

BENCHMARKS: Dict[str, Callable[[int], List[str]]] = {
    "cache": cache_benchmarks.run,
    "crf": crf_benchmarks.run,
    "decoders": decoders_benchmarks.run,
    "deployed": deployed_benchmarks.run,
    "embedding_drift": embedding_drift_benchmarks.run,
    "finetune_memory": finetune_memory_benchmarks.run,
    "formats": formats_benchmarks.run,
    "latency": latency_benchmarks.run,
    "lengths": lengths_benchmarks.run,
    "memory": memory_benchmarks.run,
    "peers": spacy_peer_benchmarks.run,
    "precision": precision_benchmarks.run,
    "served_text": served_text_benchmarks.run,
    "teacher": teacher_benchmarks.run,
}
