"""tf.distribute for every training loop (`--distribution=none|mirrored|multi_worker`).

- `none`: no strategy object at all; every loop runs exactly the code path it ran before
  distribution existed (no scope, no per-replica values, no cross-replica reductions).
- `mirrored`: `tf.distribute.MirroredStrategy` over this machine's GPUs, or over its logical CPU
  devices when there is no GPU (tests split one CPU into two logical devices).
- `multi_worker`: `tf.distribute.MultiWorkerMirroredStrategy`; the cluster and this process's
  task come from the `TF_CONFIG` environment variable, as in TensorFlow's multi-worker guide.
  Only the chief (worker 0) writes artifacts; the others write into scratch dirs. Teacher
  outputs are the exception: each worker runs the teacher on its own part of the transfer set,
  without the strategy, into the chief's cache dirs (`worker_of_cluster`, run/pipeline.py).

Batch sizes are global (TensorFlow's convention): each of R replicas gets batch/R examples of a
step, so a run's steps per epoch and its learning-rate schedule do not depend on R. Losses of the
custom loops are summed per replica and divided by the global batch's weight, which makes the
summed gradients over replicas those of the single-device loss (`global_mean`).
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import ContextManager, Optional

import tensorflow as tf

from xtremedistil_tf.errors import ConfigError

DISTRIBUTIONS = ("none", "mirrored", "multi_worker")


def make_distribution(name: str) -> Optional[tf.distribute.Strategy]:
    """The strategy `--distribution=name` asks for (None for `none`). Must run before anything
    else touches TensorFlow's devices when it is `multi_worker`."""
    if name not in DISTRIBUTIONS:
        raise ConfigError(f"--distribution={name!r}; expected one of {', '.join(DISTRIBUTIONS)}")
    if name == "none":
        return None
    if name == "mirrored":
        if tf.config.list_logical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    check_tf_config()
    return tf.distribute.MultiWorkerMirroredStrategy()


def check_tf_config() -> dict:
    """The parsed TF_CONFIG of a multi-worker run, or a ConfigError saying what is wrong with it."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ConfigError("--distribution=multi_worker needs TF_CONFIG, e.g. "
                          '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", '
                          '"index": 0}} (docs/scale.md)')
    try:
        config = json.loads(raw)
        workers, task = config["cluster"]["worker"], config["task"]
        if not isinstance(workers, list) or task["type"] not in ("worker", "chief") or int(task["index"]) < 0:
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"TF_CONFIG={raw!r} is not a cluster with a worker list and this task's type and "
                          "index (docs/scale.md)") from None
    return config


def worker_of_cluster() -> tuple[int, int]:
    """(this process's index, the number of workers) of the cluster in TF_CONFIG, read by
    TensorFlow's own `TFConfigClusterResolver`: the chief (if the cluster has one) is 0, then the
    workers in their order; (0, 1) without TF_CONFIG. No strategy and no server are made: the
    teacher-output workers share nothing but the cache dir (transfer/cache.py:worker_part)."""
    if not os.environ.get("TF_CONFIG"):
        return 0, 1
    check_tf_config()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec().as_dict()
    tasks = [("chief", i) for i in range(len(cluster.get("chief", [])))] + \
            [("worker", i) for i in range(len(cluster.get("worker", [])))]
    task = (resolver.task_type, resolver.task_id)
    if task not in tasks:
        raise ConfigError(f"TF_CONFIG's task {task[0]} {task[1]} is not in its cluster's chief and worker "
                          f"lists ({len(tasks)} tasks)")
    return tasks.index(task), len(tasks)


def limit_threads(intra_op_threads: int) -> None:
    """At most `intra_op_threads` threads per TensorFlow op, and as many ops at once (inter-op
    threads), so that a process uses about that many cores (0: TensorFlow's defaults, one thread
    per core for each); several worker processes on one machine then keep to their cores. Must run
    before TensorFlow starts its runtime (before any op or strategy)."""
    if intra_op_threads < 0:
        raise ConfigError(f"--intra_op_threads={intra_op_threads}; expected 0 (one per core) or more")
    threading = tf.config.threading
    if intra_op_threads and (threading.get_intra_op_parallelism_threads(),
                             threading.get_inter_op_parallelism_threads()) != (intra_op_threads,) * 2:
        try:
            threading.set_intra_op_parallelism_threads(intra_op_threads)
            threading.set_inter_op_parallelism_threads(intra_op_threads)
        except RuntimeError:   # the runtime is up already (a second run in one process)
            raise ConfigError("--intra_op_threads must be set before TensorFlow starts; it cannot change "
                              "in a process that has run TensorFlow already") from None


def scope_of(distribution: Optional[tf.distribute.Strategy]) -> ContextManager:
    """`distribution.scope()`, or a context that does nothing without a strategy (`none`)."""
    return distribution.scope() if distribution is not None else contextlib.nullcontext()


def is_chief(distribution: Optional[tf.distribute.Strategy]) -> bool:
    """Whether this process writes the run's artifacts: always without a multi-worker strategy,
    else only worker 0 (or the task typed `chief`)."""
    resolver = getattr(distribution, "cluster_resolver", None)
    if resolver is None or not getattr(distribution.extended, "_in_multi_worker_mode", lambda: False)():
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type == "chief" or (task_type == "worker" and task_id == 0 and
                                    "chief" not in resolver.cluster_spec().as_dict())


def shard_by_data(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with multi-worker auto-sharding by element (the teacher-output caches can have fewer
    shard files than there are workers, which file sharding refuses). Each global batch is then
    the one a single device would see, split over the replicas."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


def worker_work_dir(work_dir, distribution: Optional[tf.distribute.Strategy]) -> str:
    """Where this process writes: `work_dir` for the chief (and every run without multi_worker),
    `<work_dir>.worker-<index>` for the other workers (TF's multi-worker guide: non-chief workers
    save to their own paths). Each keeps its own epoch checkpoints, so a rerun resumes every
    worker at the same epoch."""
    if is_chief(distribution):
        return str(work_dir)
    return f"{work_dir}.worker-{distribution.cluster_resolver.task_id}"
